"""Rank script: eager communication connection and the chrome trace of a step.

Usage: comm_eager.py OUT_DIR   (2 ranks; FLAGS_eager_communication_connection=1)
Builds a pp=2 pipeline with async p2p (one-way link groups too), then runs two
train_batch steps. Prints how many communicator creations/connections the trace
recorded before the end of initialisation and after it, and writes each rank's
chrome trace of the second step to OUT_DIR.
"""

import os
import sys
import time

import paddle
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
import paddle_ext  # noqa: E402
from examples.tiny_gpt import batch, pipeline_model  # noqa: E402
from paddle_ext.comm import eager, trace  # noqa: E402

M, MBS = 4, 2
OUT = sys.argv[1]


def main() -> None:
    paddle_ext.enable()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2,
                               "pp_configs": {"overlap_p2p_comm": True}}
    strategy.pipeline_configs = {"accumulate_steps": M, "micro_batch_size": MBS}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(pipeline_model(32, 16, 8, blocks=2, pp=2))
    opt = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    initialised = time.time()
    records = trace.tracer().records
    made_in_init = [r for r in records if r.op in ("create_group", "connect")]
    ids, labels = batch(0, M * MBS, 8, 32)
    model.train_batch([ids, labels], opt)
    made_in_step = [r for r in list(records) if r.op in ("create_group", "connect") and r.start >= initialised]
    trace.tracer().clear()  # the picture: the second step only
    ids, labels = batch(1, M * MBS, 8, 32)
    model.train_batch([ids, labels], opt)
    rank = paddle.distributed.get_rank()
    path = model.export_chrome_trace(os.path.join(OUT, f"step_rank{rank}.json"))
    connects = sum(r.op == "connect" for r in made_in_init)
    print(f"rank {rank}: eager={eager.enabled()} made during init: {len(made_in_init)} "
          f"(connect: {connects}); made in the first train_batch: {len(made_in_step)}; "
          f"trace written to {path}", flush=True)

if __name__ == "__main__":
    main()
