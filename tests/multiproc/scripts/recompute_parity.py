"""Rank script: PipelineLayer's recompute_interval through the engine on gloo (unit
host_recompute), against the same run without recompute.

For each VPP:M[:offload] pair: the tiny GPT with dropout in every block (one on the global
generator, one in the model-parallel RNG tracker's state, as fleet's model-parallel
layers draw) is trained STEPS steps through fleet.distributed_model /
distributed_optimizer twice from the same seeds, once with recompute_interval=1
(offload: recompute_ctx's offload too) and once without; losses, the last step's
grads and the parameters after the steps must be bit for bit equal, and the run must
differ from one whose dropout draws other masks (so the comparison sees a wrong replay).

Then `partition`: recompute_hybrid with partition=True over a two-rank group (every
rank holds half of each saved input, the backward gathers them over gloo) on the same
input on both ranks: grads bit for bit those of the plain block.

Usage: recompute_parity.py VPP:M[:offload][,...]
"""

import sys

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet
import paddle.nn.functional as F
from paddle.distributed.fleet.layers.mpu.random import (
    get_rng_state_tracker,
    model_parallel_random_seed,
)

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from _parity import GradRecorder, assert_equal, stage_params  # noqa: E402

import paddle_ext  # noqa: E402
from examples.tiny_gpt import Block, Embedding, batch, pipeline_model  # noqa: E402
from paddle_ext.pipeline.engine import PipelineEngine  # noqa: E402

VOCAB, HIDDEN, SEQ, MBS, STEPS, SEED = 32, 16, 8, 2, 3, 1234


class DropoutBlock(Block):
    def forward(self, inputs):
        hidden, positions = inputs
        h = F.dropout(F.gelu(self.up(self.norm(hidden))), 0.3, training=self.training)
        with get_rng_state_tracker().rng_state():
            h = F.dropout(h, 0.2, training=self.training)
        # a copy: a recompute segment's PyLayer marks an output that is one of its inputs
        # modified in place (inplace_version 1), and Embedding's lookup saved these ids
        # (version 0) for its backward, which then refuses them; Paddle's GPU run alike
        return hidden + self.down(h), positions.clone()


def train(hcg, vpp, m, recompute, offload=False, seed=SEED):
    pp, stage = hcg.get_pipe_parallel_world_size(), hcg.get_stage_id()
    ctx = {"mp_group": hcg.get_model_parallel_group(), "offload": offload, "partition": False}
    model = pipeline_model(VOCAB, HIDDEN, SEQ, blocks=pp * vpp, pp=pp, vpp=vpp, block=DropoutBlock,
                           recompute_interval=1 if recompute else 0, recompute_ctx=ctx if recompute else None)
    engine = fleet.distributed_model(model)
    assert isinstance(engine, PipelineEngine), type(engine)
    params = stage_params(model, stage, Embedding)
    recorder = GradRecorder(fleet.distributed_optimizer(paddle.optimizer.Adam(1e-2, parameters=model.parameters())),
                            params)
    model_parallel_random_seed(seed)  # the global generator and the tracker's state, per stage
    losses = []
    for step in range(STEPS):
        ids, labels = batch(step, m * MBS, SEQ, VOCAB)
        losses.append(engine.train_batch([ids, labels], recorder).numpy())
    return losses, recorder.grads, {k: p.numpy() for k, p in params.items()}


def check_pair(hcg, vpp, m, offload):
    tag = f"rank {hcg.get_stage_id()}: pp={hcg.get_pipe_parallel_world_size()} vpp={vpp} M={m} offload={offload}"
    plain = train(hcg, vpp, m, recompute=False)
    rc = train(hcg, vpp, m, recompute=True, offload=offload)
    differs = "recompute differs from the run without"
    for step, (got, want) in enumerate(zip(rc[0], plain[0])):
        assert_equal(f"{tag} step {step} loss", got, want, differs)
    for key in plain[1]:
        assert_equal(f"{tag} last grad of {key}", rc[1][key], plain[1][key], differs)
        assert_equal(f"{tag} param {key} after {STEPS} steps", rc[2][key], plain[2][key], differs)
    other = train(hcg, vpp, m, recompute=False, seed=SEED + 100)
    assert any(not np.array_equal(other[2][k], plain[2][k]) for k in plain[2] if "down" in k[2]), \
        f"{tag}: dropout with other masks gave the same parameters: the comparison cannot see the masks"
    print(f"{tag}: recompute_interval=1 bitwise equal to no recompute ({STEPS} steps)", flush=True)


def check_partition():
    """recompute_hybrid's partition=True on a two-rank group: the saved input is split
    across the ranks and gathered again over gloo in the backward."""
    from paddle.distributed.fleet.recompute.recompute_hybrid import recompute_hybrid

    group = dist.new_group(list(range(dist.get_world_size())))
    paddle.seed(7)
    block = DropoutBlock(HIDDEN, layer_id=1)
    x = paddle.randn([4, SEQ, HIDDEN])
    positions = paddle.zeros([4, SEQ], dtype="int64")
    results = []
    def hidden_only(a):  # one tensor input: Paddle's forward reuses the name `partition` for the
        return block((a, positions))[0]  # first input's slice, so a second input fails its `if partition:`

    for run in (hidden_only, lambda a: recompute_hybrid(
            {"mp_group": group, "offload": True, "partition": True}, hidden_only, a)):
        model_parallel_random_seed(SEED)
        block.clear_gradients()
        a = x.clone()
        a.stop_gradient = False
        run(a).square().sum().backward()
        results.append([a.grad.numpy()] + [p.grad.numpy() for p in block.parameters()])
    for i, (got, want) in enumerate(zip(*results)):
        assert_equal(f"partition grad {i}", got, want, "recompute differs from the plain block")
    print(f"rank {dist.get_rank()}: partition over {group.nranks} ranks bitwise equal", flush=True)


def main():
    pairs = []
    for item in sys.argv[1].split(","):
        parts = item.split(":")
        pairs.append((int(parts[0]), int(parts[1]), parts[2:] == ["offload"]))
    strategy = fleet.DistributedStrategy()
    strategy.pipeline_configs = {"accumulate_steps": pairs[0][1], "micro_batch_size": MBS}
    paddle_ext.enable()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": dist.get_world_size()}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    for vpp, m, offload in pairs:
        assert m == pairs[0][1], "one accumulate_steps per job (the strategy's)"
        check_pair(hcg, vpp, m, offload)
    check_partition()
    print(f"rank {hcg.get_stage_id()}: all recompute modes passed", flush=True)


if __name__ == "__main__":
    main()
