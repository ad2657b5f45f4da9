import os
import sys

# Tests import helpers as `tests.<module>`; make the repo root importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402


@pytest.fixture
def clean_series(monkeypatch):
    """paddle_ext's patch series off before and after the test, PADDLE_EXT_PATCHES unset;
    yields the paddle_ext module (its enable() turns the series on)."""
    import paddle_ext

    monkeypatch.delenv("PADDLE_EXT_PATCHES", raising=False)
    paddle_ext.disable()
    yield paddle_ext
    paddle_ext.disable()


@pytest.fixture
def plugin_enabled(clean_series):
    """The whole patch series on for the test (off again afterwards)."""
    clean_series.enable()
    yield clean_series
