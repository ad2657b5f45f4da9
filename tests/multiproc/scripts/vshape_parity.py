"""Rank script: V-placed schedules (zb-v, dualpipev) on a use_dualpipev PipelineLayer
against a single-process run of the same model.

For each config: 3 train_batch steps with Adam; at every step the loss and this rank's
parameter grads must equal the single-process reference, and after the steps the
parameters too; then eval_batch's loss. Bitwise, except the tied word embedding (one
parameter on rank 0 for the embedding and the lm head, LocalSharedLayerDesc): its
gradient sums the two uses per micro-batch in the schedule's order where the reference
sums each use over the micro-batches and then adds the two, a summation change bounded
here at 1e-6 relative (and everything downstream of it after the first step).
The first config goes through fleet.distributed_model with pp_configs.use_dualpipev
(dualpipev) or schedule_mode "ZBV" (zb-v); its loss has Paddle's DualPipeVParallel
form (float32, shape [1]).

With `overlap` (third argument) the model is examples/overlap_gpt.py's, which defines
overlapped_forward_backward: dualpipev's F&B pairs run through it (schedule nodes; the
pairs' backwards whole, the zero-bubble phases' split into I and W: the rank's list keeps
the generator's I's and W's, checked here, and the printed count of deferred weight
gradients is what the test reads), untied (Paddle's V segmentation takes no SharedLayerDesc).

Usage: vshape_parity.py PP KIND:M:TIED:DELAY[:P2P[:OVERLAP[:VARY[:BUILDER]]]][,...] [overlap]   (TIED,
DELAY, P2P, OVERLAP, VARY, BUILDER: 0 or 1; BUILDER: the plugin's VPipelineLayer
(paddle_ext.pipeline.v_layer, any Paddle) instead of Paddle 3.3's use_dualpipev layer, which
is also what a Paddle without use_dualpipev gets; P2P: pp_configs.overlap_p2p_comm, the transfers on communication
threads; OVERLAP: this config on the overlap_gpt model, as `overlap` does for every config;
VARY: the second step's batch has half the sequence length, so every activation the ranks
exchange changes shape between steps, under the engine's dynamic_shape, which
pp_configs.enable_dynamic_shape sets)
"""

import sys

import numpy as np
import paddle
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from _parity import GradRecorder, ReferenceRun, assert_equal, check_split, v_stage_params  # noqa: E402

import paddle_ext  # noqa: E402
from examples import overlap_gpt  # noqa: E402
from examples.tiny_gpt import Reference, batch, v_pipeline_model  # noqa: E402
from paddle_ext.pipeline.engine import PipelineEngine, PipelineSettings  # noqa: E402
from paddle_ext.pipeline.schedule import generate, simulate  # noqa: E402
from paddle_ext.pipeline.schedule.ir import I, W  # noqa: E402

VOCAB, HIDDEN, SEQ, MBS, STEPS = 32, 16, 8, 2, 3
TOL = 1e-6


def close(what, got, want, exact):
    if exact:
        return assert_equal(what, got, want)
    if got is None and want is None:
        return
    assert got is not None and want is not None, f"{what}: one side has no value"
    scale = max(float(np.max(np.abs(want))), 1e-30)
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    assert diff <= TOL * scale, f"{what}: relative diff {diff / scale:.3g} > {TOL}"


def run(hcg, kind, m, tied, delay, via_fleet, overlap=False, p2p=False, vary=False, builder=False):
    pp, stage = hcg.get_pipe_parallel_world_size(), hcg.get_stage_id()
    paddle.seed(0)
    if overlap:
        model = overlap_gpt.overlap_model(VOCAB, HIDDEN, SEQ, blocks=2 * pp, pp=pp, use_dualpipev=True)
        ref = overlap_gpt.Reference(VOCAB, HIDDEN, SEQ, blocks=2 * pp)
    else:
        model = v_pipeline_model(VOCAB, HIDDEN, SEQ, blocks=2 * pp, pp=pp, tied=tied, native=False if builder else None)
        assert not builder or type(model).__name__ == "VPipelineLayer", type(model)
        ref = Reference(VOCAB, HIDDEN, SEQ, blocks=2 * pp)
    pairs = []
    if overlap:  # count the F&B steps that went through the model's method
        method = model.overlapped_forward_backward

        def counted(*args, **kwargs):
            pairs.append(1)
            return method(*args, **kwargs)
        model.overlapped_forward_backward = counted
    mine = v_stage_params(model)
    if via_fleet:
        engine = fleet.distributed_model(model)
        assert isinstance(engine, PipelineEngine), type(engine)
        opt = fleet.distributed_optimizer(paddle.optimizer.Adam(1e-2, parameters=model.parameters()))
    else:
        engine = PipelineEngine(model, hcg, PipelineSettings(m, MBS, delay_scale_loss=delay, kind=kind,
                                                             overlap_p2p=p2p, dynamic_shape=vary))
        opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
    recorder = GradRecorder(opt, mine)
    oracle = ReferenceRun(ref, mine, m, MBS, delay, tie=tied)
    exact = not tied  # the tied weight's sum order differs (module docstring)
    tag = f"pp={pp} {kind} M={m} tied={tied} delay_scale_loss={delay} overlap_model={overlap} p2p={p2p}"
    if vary:
        tag += f" seq={SEQ},{SEQ // 2},{SEQ}"
    if builder:
        tag += " layer=VPipelineLayer"
    for step in range(STEPS):
        ids, labels = batch(step, m * MBS, SEQ // 2 if vary and step == 1 else SEQ, VOCAB)
        loss = engine.train_batch([ids, labels], recorder)
        ref_loss, ref_grads = oracle.step(ids, labels)
        if via_fleet and kind == "dualpipev":
            assert loss.shape == [1] and loss.dtype == paddle.float32, (loss.shape, loss.dtype)
        close(f"{tag} step {step} loss", loss.numpy().reshape([]), ref_loss, exact or step == 0)
        for key, grad in ref_grads.items():
            close(f"{tag} step {step} grad of {key}", recorder.grads[key], grad, exact or (step == 0 and key[0] != 0))
    for key, value in oracle.params().items():
        close(f"{tag} param {key} after {STEPS} steps", mine[key].numpy(), value, exact)
    ids, labels = batch(STEPS, m * MBS, SEQ, VOCAB)
    eval_loss = engine.eval_batch([ids, labels], compute_loss=True)
    close(f"{tag} eval_batch loss", eval_loss.numpy().reshape([]), oracle.eval_loss(ids, labels), exact)
    sched = engine.schedule(m)
    predicted = simulate(sched).peak_in_flight[stage]
    assert engine.last_step.peak_in_flight <= predicted, (engine.last_step.peak_in_flight, predicted)
    split = engine.last_step.split
    deferred = split.deferred if split is not None else 0
    if split is not None:  # deferred wherever an I is apart from its W, no sum split or reordered
        check_split(engine, stage, m)
    expected_pairs = sum(1 for a in sched.ranks[stage] if type(a).__name__ == "FB") * (STEPS if overlap else 0)
    assert len(pairs) == expected_pairs, (len(pairs), expected_pairs)
    split_actions = [a for a in sched.ranks[stage] if isinstance(a, (I, W))]
    # the zero-bubble halves run as generated, schedule nodes or not (no whole B's instead)
    assert split_actions == [a for a in generate(pp, 2, m, sched.kind).ranks[stage] if isinstance(a, (I, W))]
    print(f"rank {stage}: {tag}: {'bitwise equal' if exact else f'equal within {TOL} (tied weight)'} "
          f"(schedule {sched.kind} placement={sched.placement}, peak in flight {engine.last_step.peak_in_flight}, "
          f"simulated {predicted}, {deferred} weight grads deferred, "
          f"I/W {sum(isinstance(a, I) for a in split_actions)}/{sum(isinstance(a, W) for a in split_actions)}, "
          f"{len(pairs)} F&B through overlapped_forward_backward)", flush=True)


def main():
    pp = int(sys.argv[1])
    configs = []
    for item in sys.argv[2].split(","):
        kind, m, tied, delay, *rest = item.split(":") + ["0", "0", "0", "0"]
        configs.append((kind, int(m), tied == "1", delay == "1", *(flag == "1" for flag in rest[:4])))
    overlap_all = len(sys.argv) > 3 and sys.argv[3] == "overlap"
    kind0, m0, _, delay0, *_ = configs[0]
    pp_configs = {"delay_scale_loss": delay0}
    if kind0 == "dualpipev":
        pp_configs["use_dualpipev"] = True
    else:
        pp_configs["schedule_mode"] = "ZBV"
    strategy = fleet.DistributedStrategy()
    strategy.pipeline_configs = {"accumulate_steps": m0, "micro_batch_size": MBS}
    paddle_ext.enable()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": pp, "pp_configs": pp_configs}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    for i, (kind, m, tied, delay, p2p, overlap, vary, builder) in enumerate(configs):
        overlap = overlap or overlap_all
        run(hcg, kind, m, tied and not overlap, delay, via_fleet=(i == 0), overlap=overlap, p2p=p2p, vary=vary,
            builder=builder)
    if any(c[-1] for c in configs):
        check_local_tie_across_ranks_refused(hcg)
    print(f"rank {hcg.get_stage_id()}: all configs passed", flush=True)


def check_local_tie_across_ranks_refused(hcg):
    """The plugin's VPipelineLayer refuses a LocalSharedLayerDesc whose uses land on two
    ranks (here the embedding, rank 0, and a copy after the third block, on rank 1),
    naming the key and the ranks, on every rank before any collective."""
    from paddle.distributed.fleet.meta_parallel import LayerDesc

    from examples.tiny_gpt import Block, Embedding, LMLoss
    from paddle_ext.pipeline.v_layer import local_shared_layer_desc_class, v_pipeline_layer

    local = local_shared_layer_desc_class()
    args = dict(vocab=VOCAB, hidden=HIDDEN, seq=SEQ, layer_id=0)
    blocks = [LayerDesc(Block, hidden=HIDDEN, layer_id=i + 1) for i in range(4 * hcg.get_pipe_parallel_world_size())]
    # two blocks a stage: the copy after the third block is in stage 1, on rank 1
    descs = [local("embed", Embedding, shared_weight_attr="embedding_weight", **args), *blocks[:3],
             local("embed", Embedding, shared_weight_attr="embedding_weight", **args), *blocks[3:]]
    try:
        v_pipeline_layer(descs, topology=hcg.topology(), loss_fn=LMLoss(), seg_method="layer:Block", native=False)
    except ValueError as e:
        assert "LocalSharedLayerDesc 'embed'" in str(e) and "ranks [0, 1]" in str(e), e
    else:
        raise AssertionError("a LocalSharedLayerDesc on ranks 0 and 1 was accepted")
    print(f"rank {hcg.get_stage_id()}: local tie across ranks refused", flush=True)


if __name__ == "__main__":
    main()
