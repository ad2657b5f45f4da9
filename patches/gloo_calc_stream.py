"""paddle-ext CPU enablement: calc-stream collectives (#46761) on ProcessGroupGloo.

Upstream #46761 added `*_on_calc_stream` communication for NCCL; gloo raises
"Unimplemented" for all of them, and c_identity (the other half of every
model-parallel all-reduce) has no CPU kernel, nor c_concat (a tensor-parallel head's
gather) and its gradient c_split, so fleet's model-parallel layers (e.g.
VocabParallelEmbedding) cannot run on CPU. This unit gives the gloo class
synchronous implementations and c_identity and c_concat (3.x) a CPU path; NCCL, XPU and custom
devices are untouched. ProcessGroupGloo also gets reduce_scatter and all_to_all
(every form: tensor, list, single with split sizes, and on the calc stream), which
Paddle leaves unimplemented there, built from its all_reduce and all_gather
(paddle_ext.comm.gloo_exchange): sequence parallelism and MoE token dispatch run on
CPU. fleet's TensorParallel wrapper (tensor parallelism without a pipeline) broadcasts
its inputs through hybrid_parallel_util.broadcast_input_data, which asserts a GPU, XPU
or custom device: it gets a CPU path too (rebound where fleet imported it by name).
With 4 or more gloo ranks, fleet's topology set-up also
fails: ProcessGroupGloo rendezvous with unprefixed keys in the job's one store,
so each gloo group now gets a store of its own (paddle_ext.comm.gloo). Groups made
before the unit applied (the plugin enabled after fleet.init) keep Paddle's
rendezvous: enabling then warns, naming them. Before the job's global gloo group
connects, every rank checks the address gloo will advertise for it
(paddle_ext.comm.address_check): in a job across hosts, a loopback address (no
GLOO_SOCKET_IFNAME, the hostname resolving to 127.0.0.1) or a GLOO_SOCKET_IFNAME naming
no usable interface stops every rank within seconds with the address, the interface and
what to set, where Paddle had one rank refused and the others hanging in connectFullMesh.
"""

from __future__ import annotations

from paddle_ext import compat, upstream
from paddle_ext.comm.address_check import check_before_connect
from paddle_ext.comm.gloo import (
    CALC_STREAM_METHODS,
    cpu_broadcast_input_data,
    cpu_c_concat,
    cpu_c_identity,
    private_store_process_groups,
    warn_if_groups_came_first,
)
from paddle_ext.comm.gloo_exchange import EXCHANGE_METHODS
from paddle_ext.patches._unit import Patcher, PatchUnit


def _apply(patcher: Patcher) -> None:
    cls = upstream.gloo_process_group_class()
    for name, fn in {**CALC_STREAM_METHODS, **EXCHANGE_METHODS}.items():
        patcher.swap(cls, name, fn)
    for owner in compat.c_identity_owners():
        patcher.swap(owner, "c_identity", cpu_c_identity(owner.c_identity))
    for owner in compat.c_concat_owners():
        patcher.swap(owner, "c_concat", cpu_c_concat(owner.c_concat))
    util = _hybrid_parallel_util()
    # imported=True: fleet's TensorParallel module took the function by name at import
    patcher.swap(util, "broadcast_input_data", cpu_broadcast_input_data(util.broadcast_input_data), imported=True)
    collective = upstream.collective_module()
    patcher.swap(collective, "_new_process_group_impl",
                 private_store_process_groups(collective._new_process_group_impl))
    # init_parallel_env makes the global group through the name parallel.py imported from
    # collective: there every rank's gloo address is checked first (a loopback address in a
    # job across hosts fails every rank at once instead of hanging)
    parallel = _module("paddle.distributed.parallel")
    patcher.swap(parallel, "_new_process_group_impl", check_before_connect(parallel._new_process_group_impl))
    warn_if_groups_came_first()


def _hybrid_parallel_util():
    return _module("paddle.distributed.fleet.utils.hybrid_parallel_util")


def _module(name: str):
    import importlib

    return importlib.import_module(name)


def _unavailable() -> str | None:
    return None if upstream.gloo_process_group_class() is not None else "this Paddle build has no gloo"


UNIT = PatchUnit(
    name="gloo_calc_stream",
    upstream=(46761,),
    title="calc-stream collectives, p2p and c_identity on CPU/gloo",
    summary="fleet's model-parallel layers, sequence parallelism, all_to_all and p2p run on CPU through gloo",
    apply=_apply,
    requires=_unavailable,
)
