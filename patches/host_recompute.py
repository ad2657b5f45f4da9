"""paddle-ext CPU enablement: [HybridParallel] Add Recompute for PipeLineParallel (#34607),
as "Hybrid recompute for xpu" (#50717) and "[XPU] fix recompute not support bug on xpu"
(#54367) opened it to XPU, extended to CPU builds.

A PipelineLayer with `recompute_interval > 0` (PaddleFormers' `recompute` under pipeline
parallelism) recomputes through recompute_hybrid, whose forward asserts "Recompute with
RNG is not support current device: cpu" on a CPU build (2.6 to 3.3); on 2.6
`fleet.utils.recompute(..., use_reentrant=False)` raises the same for the CPU. The RNG
replay behind the check (paddle.get_rng_state() and the model-parallel tracker's states)
works on the CPU generator as it is: this unit lets Paddle's own functions past the check
(paddle_ext.host_recompute.cpu_accepting: the same code, the CPU accepted as a custom
device is) and brings recompute_hybrid's offloaded / partitioned inputs back on the host
in its backward (host_backward). CPU builds only; a release whose functions accept the
CPU themselves gets none of it.
"""

from __future__ import annotations

from paddle_ext import compat, devices, upstream
from paddle_ext.host_recompute import cpu_accepting, host_backward
from paddle_ext.patches._unit import Patcher, PatchUnit


def _apply(patcher: Patcher) -> None:
    for owner, name, function in compat.recompute_cpu_refusals():
        copy = cpu_accepting(function)
        patcher.swap(owner, name, staticmethod(copy) if isinstance(vars(owner)[name], staticmethod) else copy)
    layer = upstream.hybrid_recompute_layer()
    patcher.swap(layer, "backward", staticmethod(host_backward(vars(layer)["backward"].__func__)))


def _native() -> bool:
    """Whether this release's functions accept the CPU themselves (none does yet)."""
    return not compat.recompute_cpu_refusals()


def _unavailable() -> str | None:
    build = devices.device_build()
    if build != "cpu":
        return f"a {build} build: Paddle saves and restores its device's RNG state itself"
    return None


UNIT = PatchUnit(
    name="host_recompute",
    upstream=(34607, 50717, 54367),
    title="Recompute for PipeLineParallel (recompute_hybrid) with RNG replay on CPU builds",
    summary="PipelineLayer's recompute_interval and fleet.utils.recompute run on CPU builds, dropout replayed exactly",
    apply=_apply,
    native_probe=_native,
    requires=_unavailable,
)
