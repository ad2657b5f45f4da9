"""Errors the plugin raises where Paddle's own code refuses the same call, so that code
written against Paddle catches them as it catches Paddle's."""

from __future__ import annotations

__all__ = ["InvalidArgumentError"]


class InvalidArgumentError(ValueError, AssertionError):
    """A bad argument value or shape, or a configuration Paddle refuses.

    Paddle refuses such arguments in two ways: its Python code `assert`s
    (AssertionError: rotary position_ids without sin / cos, flashmask's
    startend_row_indices checks, PipelineParallel's loss_fn_idx and its dp / sharding
    overlap without a dp / sharding group, ...) and its C++ checks raise InvalidArgument,
    which reaches Python as ValueError. Code written against Paddle, its own tests
    included, catches whichever its call raises there, so the plugin's errors are both:
    `except ValueError` and `except AssertionError` each catch them, with the plugin's
    message (argument, value, allowed range).
    """
