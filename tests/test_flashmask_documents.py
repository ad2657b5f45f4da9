"""FlashMask document masks on the CPU kernel: a mask that only cuts each
sequence into documents runs as variable-length attention over them (no tile
straddles a document end). Pins which masks the kernel reads as documents
(through its ctypes hook) and that such calls, alone or batched beside a
sequence with another mask, still equal the numpy float64 reference, forward
and the q, k, v grads, with documents not aligned to any block size.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from paddle_ext import compat
from paddle_ext.ops import _library
from tests.test_flash_attention import rng
from tests.test_flashmask import F, document_mask, random_mask, run_and_check  # noqa: F401 (F: fixture)

pytestmark = pytest.mark.skipif(compat.paddle_version() < (3, 0, 0), reason="flashmask_attention is Paddle 3.x")


def documents(startend: np.ndarray, causal: bool):
    """The kernel's document bounds for one sequence's mask [mask_heads, S, cols], or None."""
    fn = _library.load().paddle_ext_flashmask_documents
    fn.restype = ctypes.c_int64
    se = np.ascontiguousarray(startend, np.int32)
    heads, s, cols = se.shape
    bounds = np.zeros(s + 1, np.int32)
    n = fn(se.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(heads), ctypes.c_int64(s), ctypes.c_int64(cols),
           ctypes.c_int(causal), bounds.ctypes.data_as(ctypes.c_void_p))
    return None if n < 0 else bounds[:n + 1].tolist()


BOUNDS = [0, 20, 57, 100, 101, 160, 300]


@pytest.mark.parametrize("causal", [True, False])
def test_document_masks_are_read_as_documents(causal):
    assert documents(document_mask(1, 300, BOUNDS, causal)[0], causal) == BOUNDS
    assert documents(document_mask(1, 300, [0, 300], causal)[0], causal) == [0, 300]  # nothing hidden
    assert documents(document_mask(1, 300, BOUNDS, causal, heads=3)[0], causal) == BOUNDS
    # heads with different documents: tiled with the mask
    two = np.concatenate([document_mask(1, 300, BOUNDS, causal)[0], document_mask(1, 300, [0, 150, 300], causal)[0]])
    assert documents(two, causal) is None


def test_other_forms_of_document_masks():
    ends = document_mask(1, 300, BOUNDS, True)[0]
    # causal (LTS, LTE) with LTE at or past the end, and LTS past the end for the last document
    lte = np.concatenate([ends, np.full_like(ends, 300)], -1)
    assert documents(lte, True) == BOUNDS
    lte[0, 200:, 0] = 1000
    assert documents(lte, True) == BOUNDS
    # not causal, (LTS, LTE, UTS, UTE): hidden below the document and above it
    lts, uts = document_mask(1, 300, BOUNDS, False)[0].transpose(2, 0, 1)
    four = np.stack([lts, np.full_like(lts, 300), np.zeros_like(lts), uts], -1)
    assert documents(four, False) == BOUNDS


def test_masks_that_are_not_documents():
    s = 300
    window = np.minimum(np.arange(s) + 41, s).astype(np.int32).reshape(1, s, 1)
    assert documents(window, True) is None  # a sliding window
    assert documents(random_mask(1, s, 1, 1, True, rng(5))[0], True) is None
    cut = document_mask(1, s, BOUNDS, True)[0].copy()
    cut[0, 30, 0] = 40  # one key of the second document hidden from its last rows
    assert documents(cut, True) is None
    lte = np.concatenate([document_mask(1, s, BOUNDS, True)[0], np.full((1, s, 1), 250, np.int32)], -1)
    assert documents(lte, True) is None  # rows past 250 see the earlier documents again
    noncausal = document_mask(1, s, BOUNDS, False)[0].copy()
    noncausal[0, 70, 1] = 60  # a key hidden from part of its document's top
    assert documents(noncausal, False) is None


@pytest.mark.parametrize("causal", [True, False])
def test_document_calls_match_the_reference(F, causal):  # noqa: F811
    mask = document_mask(2, 300, BOUNDS, causal, heads=2)
    run_and_check(F, mask, causal, salt=20 + causal)
    # beside a sequence whose mask is not one of documents (that one is tiled with its mask)
    mask[1] = random_mask(1, 300, 2, mask.shape[-1], causal, rng(21))[0]
    run_and_check(F, mask, causal, d=20, salt=22 + causal)
