from __future__ import annotations

import builtins
import importlib.util

import pytest

from paddle_ext.pipeline.schedule import generate, lower, plot_timeline, simulate, step_grid
from paddle_ext.pipeline.schedule import text_timeline as timeline

PINNED_TIMELINE_2_1_2 = """\
time   |0         2         4         6         8
rank 0 |F0.0 F0.1 ..........B0.0      .....B0.1
rank 1 |.....F0.0 B0.0      F0.1 B0.1      .........."""


def test_text_timeline_pinned():
    r = simulate(lower(generate(2, 1, 2, "1f1b")))
    assert r.makespan == 9
    assert timeline(r) == PINNED_TIMELINE_2_1_2


def test_text_timeline_shows_transfers_and_fits_a_width():
    from paddle_ext.pipeline.schedule import Costs

    r = simulate(lower(generate(2, 1, 2, "1f1b")), Costs(1, 2, 1))
    text = timeline(r)
    assert "~" in text
    narrow = timeline(r, width=30)
    assert all(len(line) <= len("time   |") + 30 + 2 for line in narrow.splitlines()[1:])


def test_step_grid_without_marks_is_cut_short():
    s = generate(4, 4, 16)
    grid = step_grid(s)
    assert grid.splitlines()[-1] == "(first 32 of 128 steps)"
    assert grid.splitlines()[1].startswith("rank 0 | F0.0 F0.1")


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_writes_a_png(tmp_path):
    r = simulate(lower(generate(4, 2, 10)))
    out = plot_timeline(r, str(tmp_path / "t.png"))
    with open(out, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    r = simulate(generate(2, 1, 2))
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot_timeline(r, str(tmp_path / "t.png"))


PINNED_ZB_TIMELINE_2_1_2 = """\
time   |0         2         4         6
rank 0 |F0.0 F0.1 .....I0.0 W0.0 I0.1 W0.1
rank 1 |.....F0.0 I0.0 F0.1 I0.1 W0.0 W0.1"""


def test_zero_bubble_text_timeline_shows_f_i_and_w():
    # Rank 1 defers W0.0 past I0.1: rank 0's I0.1 starts one W earlier than with B.
    r = simulate(lower(generate(2, 1, 2, "zb-h1")))
    assert r.makespan == 7
    assert timeline(r) == PINNED_ZB_TIMELINE_2_1_2


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_of_a_zero_bubble_schedule(tmp_path):
    r = simulate(lower(generate(2, 2, 3, "interleaved-zb")))
    out = plot_timeline(r, str(tmp_path / "zb.png"))
    with open(out, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
