from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys

import pytest

from paddle_ext.pipeline.schedule import Schedule
from paddle_ext.pipeline.schedule.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*argv):
    out, err = io.StringIO(), io.StringIO()
    rc = main(list(argv), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_summary():
    rc, out, err = _run("--pp", "4", "--vpp", "2", "--microbatches", "10")
    assert rc == 0, err
    assert out.startswith("schedule pp=4 vpp=2 microbatches=10 kind=interleaved\n0: F0.0 F0.1")
    assert "SA" not in out.split("validation")[0]  # compute-only lists by default
    assert "validation: OK (140 transfers;" in out
    assert "blocking send/recv): makespan 69" in out
    assert "  rank     busy    idle   bubble  peak in-flight (bound)  received ahead\n" in out
    assert "  0          60       9    13.0%  13 (13)                 3\n" in out
    assert "  3          60       9    13.0%  7 (7)                   6\n" in out
    assert "analytic bubble (pp-1)/(vpp*M+pp-1) = 3/23 = 13.0%, makespan 69" in out


def test_defaults_to_1f1b_and_prints_lowered_and_text():
    rc, out, _ = _run("--pp", "2", "--microbatches", "3", "--lowered", "--text")
    assert rc == 0
    assert "kind=1f1b" in out
    assert "0: F0.0 SA0.0>1" in out
    assert "rank 1 |.....F0.0" in out
    assert "  0           9       3    25.0%  2 (2)                   1\n" in out


def test_costs_without_closed_form():
    rc, out, _ = _run("--pp", "2", "--vpp", "2", "--microbatches", "5", "--costs", "1,2,0.5")
    assert rc == 0
    assert "comm=0.5" in out
    assert "analytic bubble: no closed form for non-uniform costs or comm > 0" in out


def test_save_and_load(tmp_path):
    path = str(tmp_path / "s.txt")
    rc, out, _ = _run("--pp", "3", "--vpp", "2", "--microbatches", "7", "--save", path)
    assert rc == 0 and f"wrote {path}" in out
    with open(path) as fh:
        saved = Schedule.from_text(fh.read())
    assert saved.lowered and saved.kind == "interleaved"
    rc, out2, _ = _run("--load", path)
    assert rc == 0
    assert out2.startswith(saved.to_text())  # loaded lowered lists are shown as they are
    assert "makespan 48" in out2


def test_load_a_broken_schedule(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("schedule pp=2 vpp=1 microbatches=1 kind=x\n0: F0.0 B0.0\n1: B0.0 F0.0\n")
    rc, out, _ = _run("--load", str(path))
    assert rc == 1
    assert "invalid schedule: B0.0 on rank 1 (step 0) runs before its forward" in out
    assert "[B0.0]!" in out
    path.write_text("schedule pp=2 vpp=1 microbatches=1 kind=x\n0: F0.0 Z\n1:\n")
    rc, _, err = _run("--load", str(path))
    assert rc == 2 and "cannot parse action 'Z'" in err


@pytest.mark.parametrize("argv, message", [
    (["--pp", "1", "--microbatches", "4"], "--pp = 1 is not allowed: must be an integer >= 2"),
    (["--pp", "4", "--vpp", "0", "--microbatches", "4"],
     "--vpp = 0 is not allowed: must be an integer >= 1"),
    (["--pp", "4", "--vpp", "2", "--microbatches", "3"],
     "--microbatches = 3 is not allowed: must be an integer >= --pp (= 4) with virtual stages"),
    (["--pp", "4", "--microbatches", "0"], "--microbatches = 0 is not allowed: must be an integer >= 1"),
    (["--pp", "4", "--microbatches", "8", "--kind", "zb"],
     "--kind = 'zb' is not allowed: must be one of fthenb, 1f1b, interleaved"),
    (["--pp", "4", "--vpp", "2", "--microbatches", "8", "--kind", "1f1b"],
     "--vpp = 2 is not allowed: --kind 1f1b needs 1 (use interleaved for virtual stages)"),
    (["--microbatches", "8"], "--pp is required (or --load FILE)"),
    (["--pp", "2"], "--microbatches is required (or --load FILE)"),
    (["--pp", "2", "--microbatches", "2", "--costs", "1,2"],
     "--costs '1,2': costs '1,2': expected three numbers F,B,comm"),
    (["--pp", "2", "--microbatches", "2", "--costs", "0,1,0"],
     "cost forward = 0: compute costs must be > 0"),
])
def test_argument_errors(argv, message):
    rc, out, err = _run(*argv)
    assert rc == 2
    assert message in err
    assert out == ""


def test_argparse_errors_return_2(capsys):
    assert main(["--pp", "four"]) == 2
    assert "invalid int value: 'four'" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot(tmp_path):
    path = str(tmp_path / "t.png")
    rc, out, _ = _run("--pp", "2", "--vpp", "2", "--microbatches", "3", "--plot", path)
    assert rc == 0 and f"wrote {path}" in out
    assert os.path.getsize(path) > 1000


def test_module_entry_point_imports_no_paddle():
    code = ("import sys, runpy; sys.argv = ['x', '--pp', '2', '--microbatches', '2']\n"
            "try:\n    runpy.run_module('paddle_ext.pipeline.schedule', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "import paddle_ext.pipeline\n"
            "bad = sorted(m for m in sys.modules if m == 'paddle' or m.startswith('paddle.'))\n"
            "assert not bad, bad\nprint('NO PADDLE')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "validation: OK" in res.stdout and res.stdout.endswith("NO PADDLE\n")


def test_loaded_schedule_with_a_custom_or_inconsistent_label(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("schedule pp=2 vpp=2 microbatches=2 kind=1f1b\n"
                    "0: F0.0 F0.1 F1.0 F1.1 B1.0 B1.1 B0.0 B0.1\n"
                    "1: F0.0 F0.1 F1.0 F1.1 B1.0 B1.1 B0.0 B0.1\n")
    rc, out, _ = _run("--load", str(path))
    assert rc == 0
    assert "peak in-flight  " in out and "(bound)" not in out and "analytic" not in out


def test_subcommand_wiring():
    import argparse

    from paddle_ext.pipeline.schedule.cli import configure_parser, run

    parser = argparse.ArgumentParser(prog="python -m paddle_ext")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("schedule")
    configure_parser(p)
    p.set_defaults(fn=run)
    args = parser.parse_args(["schedule", "--pp", "2", "--microbatches", "2"])
    out, err = io.StringIO(), io.StringIO()
    assert args.fn(args, out, err) == 0
    assert "validation: OK" in out.getvalue()


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_zero_bubble_summary_and_plot(tmp_path):
    # The acceptance command: F, I and W in the lists, the table, the closed form and
    # the picture.
    path = str(tmp_path / "zb.png")
    rc, out, err = _run("--pp", "4", "--vpp", "1", "--microbatches", "8", "--kind", "zb-h1",
                        "--plot", path, "--text")
    assert rc == 0, err
    assert out.startswith("schedule pp=4 vpp=1 microbatches=8 kind=zb-h1\n"
                          "0: F0.0 F0.1 F0.2 F0.3 I0.0 W0.0 F0.4")
    assert "simulation (F=1 I=1 W=1 comm=0 per chunk and micro-batch; blocking send/recv): " \
        "makespan 27" in out
    assert "  rank     busy    idle   bubble  peak in-flight (bound)  pending W (bound)   " \
        "received ahead\n" in out
    assert "  3          24       3    11.1%  1 (1)                   4 (4)               1\n" in out
    assert "analytic bubble idle/makespan = 3/27 = 1/9 = 11.1%" in out
    assert "the plain 1f1b schedule: makespan 33, bubble 27.3%; zero bubble is 18.2% shorter" in out
    assert "rank 3 |...............F0.0 I0.0 F0.1 I0.1" in out
    assert os.path.getsize(path) > 1000


def test_zero_bubble_cap_costs_and_save(tmp_path):
    path = str(tmp_path / "zb.txt")
    rc, out, err = _run("--pp", "3", "--vpp", "2", "--microbatches", "7", "--kind",
                        "interleaved-zb", "--max-pending-w", "2", "--costs", "2,1,1,0",
                        "--save", path)
    assert rc == 0, err
    assert "kind=interleaved-zb-w2" in out and "F=2 I=1 W=1" in out
    # idle = max(2*(2+1) - 1*1, 2*max(2, 2, 1)) = 5 per rank; makespan 14*4 + 5.
    assert "analytic bubble idle/makespan = 5/61 = 8.2%" in out
    rc, out2, _ = _run("--load", path, "--costs", "2,1,1,0")
    assert rc == 0 and "makespan 61" in out2 and "pending W (bound)" in out2


@pytest.mark.parametrize("argv, message", [
    (["--kind", "zb-h1", "--overlap"], "--overlap pairs an F with a whole B; --kind zb-h1 splits"),
    (["--kind", "zb-h1-overlap"], "--kind = 'zb-h1-overlap' is not allowed: zero-bubble kinds"),
    (["--kind", "1f1b", "--max-pending-w", "2"],
     "--max-pending-w = 2 is not allowed: only zero-bubble kinds"),
    (["--kind", "zb-h1", "--max-pending-w", "0"], "--max-pending-w = 0 is not allowed"),
])
def test_zero_bubble_argument_errors(argv, message):
    rc, out, err = _run("--pp", "4", "--microbatches", "8", *argv)
    assert rc == 2 and message in err and out == ""
