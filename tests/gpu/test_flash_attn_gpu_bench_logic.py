"""bench/flash_attn_gpu.py's control flow (correctness gate, timing budget, table)
with stand-ins for torch and the kernel library, so that the script a GPU
session runs through tests/gpu/device_check.sh is known to run before it
costs device time. Numbers here mean nothing; the stand-in's every tensor
compares as a relative error of 1.0, so the correctness gate must fail."""

from __future__ import annotations

import os
import sys
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def bench(monkeypatch):
    torch = mock.MagicMock(name="torch")
    torch.__version__ = "stand-in"
    torch.cuda.is_available.return_value = True
    torch.cuda.get_device_name.return_value = "stand-in GPU"
    torch.cuda.current_stream.return_value.cuda_stream = 0
    for name, module in (("torch", torch), ("torch.nn", torch.nn), ("torch.nn.attention", torch.nn.attention)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    import flash_attn_gpu

    monkeypatch.setattr(flash_attn_gpu, "Kernels", mock.MagicMock(name="Kernels"))
    flash_attn_gpu.Kernels.return_value.workspace_bytes.return_value = 16
    return flash_attn_gpu, torch


def run(module, monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["flash_attn_gpu.py", "--lib", "stand-in.so", *args])
    return module.main()


def test_a_mismatch_fails_and_every_size_is_timed(bench, monkeypatch, capsys):
    module, torch = bench
    torch.cuda.Event.return_value.elapsed_time.return_value = 2.0  # ms
    assert run(module, monkeypatch) == 1
    out = capsys.readouterr().out
    assert out.count("against torch float64 math: 1.0e+00 FAIL") == 4  # causal and not, dQ both ways
    table = out[out.rindex("    S causal"):]
    # 3 sizes x causal/not x fwd, fwd+bwd, +bwd det; S >= 4096 judged against the goal
    assert len([ln for ln in table.splitlines() if ln.strip()[:1].isdigit()]) == 18
    assert table.count("meets") == 12 and "skipped" not in table


def test_the_deterministic_rows_run_the_backward_under_the_kernel_choice_and_restore_it(bench, monkeypatch, capsys):
    module, torch = bench
    torch.cuda.Event.return_value.elapsed_time.return_value = 2.0
    monkeypatch.delenv("PADDLE_EXT_FLASH_ATTN_GPU_KERNEL", raising=False)
    seen = []
    module.Kernels.return_value.backward.side_effect = (
        lambda *a: seen.append(os.environ.get("PADDLE_EXT_FLASH_ATTN_GPU_KERNEL")))
    run(module, monkeypatch, "--sizes", "1024")
    assert set(seen) == {None, "deterministic"}
    assert "PADDLE_EXT_FLASH_ATTN_GPU_KERNEL" not in os.environ


def test_sizes_that_would_not_fit_the_budget_are_skipped(bench, monkeypatch, capsys):
    module, torch = bench
    # one call ~0.05 s at S=1024 (host clock) -> ~0.8 s at 4096, 3.2 s at 8192, against a 1 s budget
    torch.cuda.synchronize.side_effect = lambda: __import__("time").sleep(0.025)
    torch.cuda.Event.return_value.elapsed_time.return_value = 50.0
    run(module, monkeypatch, "--budget-s", "1")
    out = capsys.readouterr().out
    assert "8192  False      fwd    skipped (one call ~" in out
