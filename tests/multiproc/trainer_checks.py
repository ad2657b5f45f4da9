"""What the trainer parity tests share (test_paddleformers.py, test_paddlenlp.py): a launch
of a trainer rank script and its per-rank result files (scripts/_trainer_parity.py's
measures), and the bounds a run is held to against its single-process reference (why
each bound: test_paddleformers.py's docstring)."""

from __future__ import annotations

import glob
import json
import os
import tempfile

from tests.multiproc.launch import launch

REL_BOUND = 1e-5   # parameters after the steps, relative to each parameter's largest magnitude
LOSS_BOUND = 1e-6  # the losses the Trainer logs (rounded to 8 decimals), relative
GRAD_BOUND = 1e-5  # the first step's gradients, relative to each gradient's largest magnitude


def launch_results(script: str, *args: str, nproc: int, timeout: float = 420) -> dict[str, dict[int, dict]]:
    """Runs `script ARGS... OUT_DIR` on nproc gloo ranks (it must pass) and returns what
    its ranks wrote to OUT_DIR/result.<config>.<rank>.json: config -> rank -> result."""
    out_dir = tempfile.mkdtemp(prefix="paddle_ext_trainer_")
    res = launch(script, *args, out_dir, nproc=nproc, timeout=timeout)
    assert res.returncode == 0 and not res.timed_out, res.describe()
    per_config: dict[str, dict[int, dict]] = {}
    for path in glob.glob(os.path.join(out_dir, "result.*.json")):
        _, name, rank, _ = os.path.basename(path).split(".")
        with open(path) as f:
            per_config.setdefault(name, {})[int(rank)] = json.load(f)
    return per_config


def check_losses_and_params(rank: int, r: dict, steps: int) -> None:
    """One rank's result: every step's logged loss within LOSS_BOUND of the reference's,
    every parameter of its stage within REL_BOUND."""
    assert len(r["losses"]) == steps, f"rank {rank}: the Trainer logged {r['losses']}"
    for got, want in zip(r["losses"], r["ref_losses"]):
        assert abs(got - want) <= LOSS_BOUND * abs(want), f"rank {rank}: losses {r['losses']} != {r['ref_losses']}"
    assert r["params"], f"rank {rank}: no parameter compared"
    worst = max(r["params"].values())
    assert worst <= REL_BOUND, f"rank {rank}: parameter {max(r['params'], key=r['params'].get)} differs by {worst:.3g}"
