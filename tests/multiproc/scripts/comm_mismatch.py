"""Rank script: a hand-made pipeline schedule whose send/recv pairs do not match.

Rank 0 waits for the gradient of micro-batch 0 before sending micro-batch 1's
activation, while rank 1 (1F1B as lowered) first waits for that activation: both
ranks receive, nobody sends. The validator refuses the schedule; run unchecked,
the comm watchdog must report both ranks and both actions.
Usage: comm_mismatch.py   (2 ranks, PADDLE_EXT_HANG_TIMEOUT set)
"""

import sys

import paddle
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
import paddle_ext  # noqa: E402
from examples.tiny_gpt import batch, pipeline_model  # noqa: E402
from paddle_ext.pipeline.schedule import Schedule, ScheduleError  # noqa: E402

M, MBS = 2, 2
BAD = """schedule pp=2 vpp=1 microbatches=2 kind=hand-made
0: F0.0 SA0.0>1 F0.1 RG0.0<1 SA0.1>1 B0.0 RG0.1<1 B0.1
1: RA0.0<0 F0.0 RA0.1<0 B0.0 SG0.0>0 F0.1 B0.1 SG0.1>0
"""


def main() -> None:
    paddle_ext.enable()
    strategy = fleet.DistributedStrategy()
    # the compute thread's blocking transfers (gloo's default without the key is threads)
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2,
                               "pp_configs": {"overlap_p2p_comm": False}}
    strategy.pipeline_configs = {"accumulate_steps": M, "micro_batch_size": MBS}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(pipeline_model(32, 16, 8, blocks=2, pp=2))
    schedule = Schedule.from_text(BAD)
    try:
        model.set_schedule(schedule)
    except ScheduleError as err:
        print(f"validator refused the schedule: {err}", flush=True)
    model.set_schedule(schedule, check=False)
    opt = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    ids, labels = batch(0, M * MBS, 8, 32)
    model.train_batch([ids, labels], opt)
    print("finished without a hang", flush=True)


if __name__ == "__main__":
    main()
