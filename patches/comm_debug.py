"""part-7 cherry from: [Distributed] add debug information for ProcessGroupNCCL (#56441).

Upstream #56441 logs each NCCL collective with a sequence number so a hang can be
traced to the rank that fell out of step. paddle_ext does this for every backend,
gloo included, and goes further (paddle_ext.comm):

- every method of Paddle's ProcessGroup classes (all_reduce, broadcast, send, recv,
  ... and their *_on_calc_stream forms) records the call in a bounded per-rank ring:
  group, per-group sequence number, op, shapes, dtype, peer, caller, start and end;
- every group's creation is recorded (gloo connects the group there);
- once init_parallel_env has made the job's store, a watchdog connects the ranks
  through a side channel of its own: a rank stuck longer than comm.hang_timeout, a
  lost rank or a failed one ends the job with a report of where the ranks diverge.

The plugin's own communication (pipeline transfers, gradient buckets) is traced
without this unit; the unit adds Paddle's collectives and the watchdog.
"""

from __future__ import annotations

from paddle_ext import upstream
from paddle_ext.comm import debug
from paddle_ext.patches._unit import Patcher, PatchUnit


def _apply(patcher: Patcher) -> None:
    for cls in upstream.process_group_classes():
        for name, method in debug.traced_methods(cls).items():
            patcher.swap(cls, name, method)
    collective = upstream.collective_module()
    patcher.swap(collective, "_new_process_group_impl",
                 debug.recording_group_creation(collective._new_process_group_impl))
    parallel = upstream.parallel_module()
    patcher.swap(parallel, "_set_default_store", debug.starting_watchdog(parallel._set_default_store))
    if upstream.job_store() is not None:  # enabled after init: start now
        debug.start_watchdog()


UNIT = PatchUnit(
    name="comm_debug",
    upstream=(56441,),
    title="add debug information for ProcessGroupNCCL",
    summary="traced collectives/p2p on every backend, hang report and lost-rank watchdog",
    apply=_apply,
)
