import os
import sys

# Tests import helpers as `tests.<module>`; make the repo root importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402


@pytest.fixture
def clean_series(monkeypatch):
    """The patch series reverted before and after the test, PADDLE_EXT_PATCHES unset
    (modules that enable units use it through pytestmark)."""
    import paddle_ext

    monkeypatch.delenv("PADDLE_EXT_PATCHES", raising=False)
    paddle_ext.disable()
    yield
    paddle_ext.disable()
