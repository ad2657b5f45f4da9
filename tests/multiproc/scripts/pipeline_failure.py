"""Rank script: one pipeline rank raises inside forward or backward.

Usage: pipeline_failure.py PP FAIL_RANK forward|backward|kill|eval [async|v]
Every rank must end non-zero, the failing one naming itself, the action and
its position in the schedule. kill: the rank SIGKILLs itself instead (no exit
handlers run): the others must name it as lost. async: with the forward/backward
overlap scheduler and overlap_p2p_comm (communication threads). v: the V placement
(pp_configs.use_dualpipev on the V-segmented model, 2*PP blocks). eval: a forward raises
inside eval_batch, which runs through the same interpreter (its forward-only schedule).
"""

import os
import signal
import sys

import paddle
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
import paddle_ext  # noqa: E402
from examples.tiny_gpt import Block, batch, pipeline_model, v_pipeline_model  # noqa: E402

PP, FAIL_RANK, WHERE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ASYNC = len(sys.argv) > 4 and sys.argv[4] == "async"
V = len(sys.argv) > 4 and sys.argv[4] == "v"
M, MBS = 4, 2


class Boom(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("injected failure in backward")


calls = {"n": 0}
original_forward = Block.forward


def failing_forward(self, inputs):
    hidden, positions = original_forward(self, inputs)
    if paddle.distributed.get_rank() == FAIL_RANK and (self.training or WHERE == "eval"):
        calls["n"] += 1
        if calls["n"] == 3:  # the third micro-batch through this rank
            if WHERE == "kill":
                print(f"rank {FAIL_RANK}: SIGKILL to myself", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if WHERE in ("forward", "eval"):
                raise RuntimeError(f"injected failure in {WHERE}")
            hidden = Boom.apply(hidden)
    return hidden, positions


Block.forward = failing_forward


def main():
    paddle_ext.enable()  # before the strategy: Paddle 2.6's protobuf lacks the async keys
    strategy = fleet.DistributedStrategy()
    pp_configs = {"forward_backward_overlap_scheduler": True, "overlap_p2p_comm": True} if ASYNC else {}
    if V:
        pp_configs = {"use_dualpipev": True}
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": PP, "pp_configs": pp_configs}
    strategy.pipeline_configs = {"accumulate_steps": M, "micro_batch_size": MBS}
    fleet.init(is_collective=True, strategy=strategy)
    layers = v_pipeline_model(32, 16, 8, blocks=2 * PP, pp=PP) if V else pipeline_model(32, 16, 8, blocks=PP, pp=PP)
    model = fleet.distributed_model(layers)
    opt = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    ids, labels = batch(0, M * MBS, 8, 32)
    if WHERE == "eval":
        model.eval_batch([ids, labels], compute_loss=True)
    else:
        model.train_batch([ids, labels], opt)
    print("finished without failure", flush=True)


if __name__ == "__main__":
    main()
