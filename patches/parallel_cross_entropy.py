"""paddle-ext CPU enablement: [HybridParallel] Add ParallelCrossEntropy for TensorParallel
(#33401; the op's phi kernels since #70165), extended to CPU builds.

fleet's ParallelCrossEntropy (PaddleFormers' loss for a tensor-parallel model with its
default `tensor_parallel_output=True`) calls c_softmax_with_cross_entropy, which Paddle
registers for GPU and XPU only: on a CPU build every tensor-parallel training step failed
at its loss ("Do not support c_softmax_with_cross_entropy for cpu kernel now"). This
unit gives the op a CPU path over the model-parallel group's gloo collectives with the
GPU kernel's numbers, its gradient and its label check
(paddle_ext.comm.parallel_cross_entropy), through both op modules that export it (3.x's
_C_ops, and _legacy_C_ops, which 2.6's mp_ops calls). Paddle's Python checks still run
first; tensors on other devices keep Paddle's kernels.
"""

from __future__ import annotations

from paddle_ext import compat, upstream
from paddle_ext.comm.parallel_cross_entropy import OP, cpu_c_softmax_with_cross_entropy
from paddle_ext.patches._unit import Patcher, PatchUnit


def _apply(patcher: Patcher) -> None:
    for owner, convention in compat.c_softmax_with_cross_entropy_owners():
        patcher.swap(owner, OP, cpu_c_softmax_with_cross_entropy(getattr(owner, OP), convention))


def _unavailable() -> str | None:
    if not compat.c_softmax_with_cross_entropy_owners():
        return f"this Paddle has no {OP} op"
    return None if upstream.gloo_process_group_class() is not None else "this Paddle build has no gloo"


UNIT = PatchUnit(
    name="parallel_cross_entropy",
    upstream=(33401, 70165),
    title="ParallelCrossEntropy (c_softmax_with_cross_entropy) on CPU/gloo",
    summary="fleet's ParallelCrossEntropy, a tensor-parallel model's vocabulary-split loss, runs on CPU through gloo",
    apply=_apply,
    requires=_unavailable,
)
