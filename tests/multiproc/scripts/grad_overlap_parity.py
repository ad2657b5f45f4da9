"""Rank script: dp / sharding gradient reduction of the pipeline engine (pp = 2).

Usage: grad_overlap_parity.py DP SHARDING CONFIGS [scaler] [fb] [p2p]

CONFIGS: comma-separated VPP:M:DELAY[:BUCKET_KB[:HIDDEN[:OPTS]]] (DELAY 0/1:
delay_scale_loss; BUCKET_KB: bucket size in KiB, 0 or absent: 128 MiB; HIDDEN: the
model's width, default 16; OPTS: letters switching on, for this config, f (fb),
p (p2p), o (overlapgpt), as the flags below do for all, z: the zero-bubble
schedule (zb-h1, interleaved-zb with VPP > 1), and v: the V placement (VPP 2:
tiny_gpt.v_pipeline_model, a use_dualpipev PipelineLayer with the tie local on rank 0;
dualpipev, or zb-v with z; its tied word table sums per micro-batch in schedule order,
so its losses after the first step are compared within REF_BOUND; with o,
overlap_gpt's use_dualpipev model, untied, whose overlapped_forward_backward runs
dualpipev's F&B pairs while its other phases split I and W)). For each config,
on every rank:

1. 3 Adam steps with overlap off, then the same with overlap on (fresh model and
   optimizer, both through fleet.distributed_optimizer, so sharding uses Paddle's
   DygraphShardingOptimizer): parameters must be bitwise equal (on and off run the
   same collectives in the same order; only the timing differs).
2. A single-process reference over the same global batch: each data-parallel
   shard's gradients accumulated over its micro-batches, the tied embedding/head
   gradients summed per shard, shards summed in the order of the collectives
   (sharding pair first, then dp), scaled once by 1 / (dp * sharding) (and
   1 / M under delay_scale_loss): parameters must be within REF_BOUND (see below)
   of it after the 3 steps, and each step's loss equal this shard's reference loss.
3. With overlap on, the recorded times of the last step (VPP, or small buckets):
   every bucket of a chunk whose backward is not the last to finish on this rank
   was handed to its group's communication thread before that last backward ended;
   the note says how many of them their thread also started before that last backward
   ended, and before the step began to wait for the collectives (finish(); an inline
   worker starts them only then): test_grad_overlap asserts it over the ranks, not per
   rank (at hidden 256 the last backward ends ~7 ms after the bucket is handed over, and
   a loaded 2-core CI machine once took 33 ms to schedule one rank's thread). With small
   buckets a bucket of every chunk
   was handed over inside that chunk's own last backward (per-bucket launch).
   (On gloo one thread per group issues the group's collectives one after another,
   and each waits for the slowest rank of the group, so later buckets start when
   the earlier ones finished: "handed over" is when this rank committed to it, and
   on NCCL the moment it is enqueued on the communication stream.)
   Zero bubble: a chunk's weight gradients are final after its last W, so there
   "last backward" means last W, and no bucket holding a Linear weight may be handed
   over before its chunk's last W started (launching after the last I would reduce
   partial sums: pytorch issue #144530); buckets of biases and norms only are final
   after the last I and may go then.

`scaler`: an AMP GradScaler (loss scaling 2**10) through fleet.distributed_scaler on
every config. `fb`: pp_configs.forward_backward_overlap_scheduler on every config;
`p2p`: pp_configs.overlap_p2p_comm; `overlapgpt`: examples/overlap_gpt.py instead of
tiny_gpt (attention/MLP schedule nodes; with `fb`, its overlapped_forward_backward runs
the F&B steps).

`split`: sharding with sharding_configs.split_param (Paddle's DygraphShardingOptimizerV2,
PaddleFormers' default), as in fleet's PipelineParallel, per config against the
reference as in 2.: the optimizer built without pp_configs.sharding_comm_overlap
reduces the gradients itself (reduce-scatter into its own buffers) and the engine none;
built with it, it takes the engine's buckets (Paddle's FusedCommBuffers), which the
engine reduce-scatters, with overlap off and on (bitwise equal); engine overlap with
an optimizer that reduces its own buffers is refused with a GradSyncError.

Before the configs, the fleet path: the strategy's pp_configs given as a PaddleNLP
pipeline_parallel_config string ("enable_dp_comm_overlap" / "enable_sharding_comm_
overlap"), fleet.distributed_model must return the engine with overlap on, and one
train_batch runs through it.
"""

import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet
from paddle.distributed.fleet.utils import mix_precision_utils

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from _parity import accumulate, check_split, ref_param, stage_params, v_stage_params  # noqa: E402

import examples.overlap_gpt as overlap_gpt  # noqa: E402
import examples.tiny_gpt as tiny_gpt  # noqa: E402
import paddle_ext  # noqa: E402
from examples.tiny_gpt import batch  # noqa: E402
from paddle_ext.pipeline import grad_sync  # noqa: E402
from paddle_ext.pipeline.engine import PipelineEngine, PipelineSettings  # noqa: E402
from paddle_ext.pipeline.grad_sync import GradSyncSettings  # noqa: E402
from paddle_ext.pipeline.schedule.ir import B, GradSync, I, W, computes  # noqa: E402

VOCAB, SEQ, MBS, STEPS, PP = 32, 8, 2, 3, 2
# The reference sums the shards' gradients in the collectives' order and scales them
# with the same op, so on gloo (two-rank groups: one addition per element, which
# commutes) it is expected to match bit for bit; the documented bound allows for a
# backend whose reduction associates differently: a few float32 ulps on gradients,
# which after 3 Adam steps (lr 1e-2, |update| <= lr) stays well within 1e-6.
REF_BOUND = 1e-6


# Adam; SGD where a gradient's scale is the check (Adam's update hardly sees a factor: g and
# 2 g move a parameter alike but for epsilon)
OPTIMIZER = [paddle.optimizer.Adam]

MODEL = {"build": tiny_gpt.pipeline_model, "reference": tiny_gpt.Reference, "embedding": tiny_gpt.Embedding}


def run_engine(hcg, vpp, m, delay, overlap, bucket_kb, hidden, use_scaler, fb, p2p, dp, sh, zb=False, v=False,
               optimizers=None, main_grad=False, early=False):
    """optimizers: a list that gets the optimizer the engine stepped; main_grad: float32
    main_grads through fleet's MixPrecisionLayer / MixPrecisionOptimizer (PaddleFormers'
    amp_master_grad); early: pp_configs.early_comm_buffers, the optimizer shown to the engine
    (register_sharding_comm_overlap_hook) before the first step, which must leave a split_param
    optimizer holding the engine's buffers then."""
    paddle.seed(0)
    if v and MODEL["build"] is overlap_gpt.overlap_model:
        model = overlap_gpt.overlap_model(VOCAB, hidden, SEQ, blocks=PP * vpp, pp=PP, use_dualpipev=True)
    elif v:
        model = tiny_gpt.v_pipeline_model(VOCAB, hidden, SEQ, blocks=PP * vpp, pp=PP)
    else:
        model = MODEL["build"](VOCAB, hidden, SEQ, blocks=PP * vpp, pp=PP, vpp=vpp)
    sync = GradSyncSettings(dp_overlap=overlap and dp > 1, sharding_overlap=overlap and sh > 1,
                            bucket_mb=(bucket_kb / 1024.0) if bucket_kb else 128.0, early_comm_buffers=early)
    extra = {k: True for k, on in (("fb_overlap", fb), ("overlap_p2p", p2p)) if on}  # issue 4's settings
    if v:
        extra["kind"] = "zb-v" if zb else "dualpipev"
    elif zb:
        extra["kind"] = "interleaved-zb" if vpp > 1 else "zb-h1"
    if main_grad:
        mix_precision_utils.MixPrecisionLayer(model, dtype="bfloat16")
    engine = PipelineEngine(model, hcg, PipelineSettings(m, MBS, delay_scale_loss=delay, grad_sync=sync, **extra))
    opt = OPTIMIZER[0](1e-2, parameters=model.parameters())
    if main_grad:
        opt = mix_precision_utils.MixPrecisionOptimizer(opt)
    opt = fleet.distributed_optimizer(opt)
    if optimizers is not None:
        optimizers.append(opt)
    if early:
        engine.register_sharding_comm_overlap_hook(opt)
        held = {id(b) for b in grad_sync.split_param_optimizer(opt)._comm_buffer_list}
        assert held and held == {id(b.comm_buffer) for b in engine._grad_sync.buckets}, "buffers not handed over early"
    scaler = fleet.distributed_scaler(paddle.amp.GradScaler(init_loss_scaling=1024.0)) if use_scaler else None
    shard = hcg.get_data_parallel_rank() * sh + (hcg.get_sharding_parallel_rank() if sh > 1 else 0)
    losses = []
    for step in range(STEPS):
        ids, labels = batch(step, dp * sh * m * MBS, SEQ, VOCAB)
        rows = slice(shard * m * MBS, (shard + 1) * m * MBS)
        losses.append(engine.train_batch([ids[rows], labels[rows]], opt, scaler=scaler).numpy())
    mine = v_stage_params(model) if v else stage_params(model, hcg.get_stage_id(), MODEL["embedding"])
    params = {k: p.numpy().copy() for k, p in mine.items()}
    return engine, params, losses


def shard_grads(ref, ids, labels, m, delay, scaler, tied=True):
    """One shard's accumulated gradients (tied pair summed, unless untied), and its loss."""
    loss = accumulate(ref, ids, labels, m, MBS, delay, scaler)
    if tied:
        ref.tie_grads()
    grads = {id(p): (None if p.grad is None else p.grad.numpy().copy()) for p in ref.parameters()}
    ref.clear_gradients()
    return grads, loss.numpy()


def reference(vpp, m, delay, hidden, dp, sh, use_scaler, tied=True, sep=1):
    """Parameters after STEPS steps and per-step, per-shard losses. sep: the sep ranks of a
    shard see its data too, and fleet sums their gradients unscaled."""
    ref = MODEL["reference"](VOCAB, hidden, SEQ, blocks=PP * vpp)
    opt = OPTIMIZER[0](1e-2, parameters=ref.parameters())
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0) if use_scaler else None
    factor = sep / (dp * sh) / (m if delay else 1)
    losses = []
    for step in range(STEPS):
        ids, labels = batch(step, dp * sh * m * MBS, SEQ, VOCAB)
        per_shard, step_losses = [], []
        for k in range(dp * sh):
            rows = slice(k * m * MBS, (k + 1) * m * MBS)
            g, loss = shard_grads(ref, ids[rows], labels[rows], m, delay, scaler, tied)
            per_shard.append(g)
            step_losses.append(loss)
        losses.append(step_losses)
        for p in ref.parameters():
            gs = [g[id(p)] for g in per_shard]
            if all(x is None for x in gs):
                continue
            gs = [np.zeros(p.shape, "float32") if x is None else x for x in gs]
            # shard k = d * sh + s: the sharding pair (s) first, then dp (d)
            total = None
            for d in range(dp):
                part = gs[d * sh]
                for s in range(1, sh):
                    part = part + gs[d * sh + s]
                total = part if total is None else total + part
            t = paddle.to_tensor(total)
            if factor != 1.0:
                t.scale_(factor)
            p.grad.set_value(t) if p.grad is not None else p._copy_gradient_from(t)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.clear_grad()
    return ref, losses


def check_overlap(engine, stage, small_buckets):
    """Recorded times of the last step: see the module docstring (3)."""
    stats = engine._grad_sync.last
    assert stats is not None and stats.overlap, stats
    spans = engine.last_step.spans
    last_b_end, last_w_start = {}, {}
    actions = engine.schedule().ranks[stage]
    starts = {pos: start for pos, _action, start, _end in spans}
    for pos, action, start, end in spans:
        for part in computes(action):
            if isinstance(part, (B, W)):  # where a chunk's gradients become final
                last_b_end[part.chunk] = max(last_b_end.get(part.chunk, 0.0), end)
            if isinstance(part, W):
                if pos and actions[pos - 1] == I(part.chunk, part.mb):
                    start = starts[pos - 1]  # an I right before its W runs as a whole backward
                last_w_start[part.chunk] = max(last_w_start.get(part.chunk, 0.0), start)
    order = [a.chunk for a in engine.schedule().ranks[stage] if isinstance(a, GradSync)]
    final_chunk = max(last_b_end, key=last_b_end.get)
    step_end = last_b_end[final_chunk]
    records = [r for r in stats.records if r.chunk is not None]
    assert records, stats
    lines = [f"finish() began {stats.finish_started - step_end:+.4f}"]
    for r in records:
        lines.append(f"b{r.bucket}/c{r.chunk} ready {r.ready - step_end:+.4f} start {r.started - step_end:+.4f} "
                     f"end {r.finished - step_end:+.4f}{' early' if r.early else ''}")
    text = "\n".join(lines)
    linear_weights = {id(s.weight) for s in engine._layers.sublayers() if isinstance(s, paddle.nn.Linear)}
    for r in records:  # zero bubble: never before the chunk's last W began (#144530)
        slots = engine._grad_sync.buckets[r.bucket].slots
        if r.chunk in last_w_start and any(id(slot.param) in linear_weights for slot in slots):
            assert r.ready >= last_w_start[r.chunk], (f"rank {stage}: bucket {r.bucket} of chunk {r.chunk} was handed "
                                                      f"over before the chunk's last W began\n{text}")
    others = [r for r in records if r.chunk != final_chunk]
    for r in others:
        assert r.ready < step_end, (f"rank {stage}: bucket {r.bucket} of chunk {r.chunk} was handed over "
                                    f"after the last backward (chunk {final_chunk}) ended\n{text}")
    early_inside = [r for r in records if r.early and r.ready < last_b_end[r.chunk]]
    if small_buckets:
        missing = {r.chunk for r in records} - {r.chunk for r in early_inside}
        assert not missing, f"rank {stage}: no bucket of chunk(s) {missing} handed over inside its last backward\n{text}"
    if os.environ.get("GRAD_OVERLAP_VERBOSE"):
        print(f"stage {stage} bucket times relative to the last backward's end:\n" + "\n".join(lines), flush=True)
    started = sum(1 for r in others if r.started < step_end)
    before_finish = sum(1 for r in others if r.started < stats.finish_started)
    return (f"GS order {order}, {len(records)} chunk buckets, {len(others)} of chunks finishing earlier all handed "
            f"over before the last backward ended ({started} started by then, {before_finish} before finish()), "
            f"{len(early_inside)} handed over inside their own chunk's last backward; finish() "
            f"{stats.finish_seconds * 1e3:.1f} ms")


def use_model(overlap: bool):
    module = overlap_gpt if overlap else tiny_gpt
    MODEL.update(build=overlap_gpt.overlap_model if overlap else tiny_gpt.pipeline_model,
                 reference=module.Reference,
                 embedding=overlap_gpt.TiedEmbedding if overlap else tiny_gpt.Embedding)


def check_fleet_path(hcg, m, dp, sh, shard):
    paddle.seed(0)
    model = MODEL["build"](VOCAB, 16, SEQ, blocks=PP, pp=PP)
    engine = fleet.distributed_model(model)
    assert isinstance(engine, PipelineEngine), type(engine)
    sync = engine.settings.grad_sync
    assert sync.dp_overlap == (sh == 1) and sync.sharding_overlap == (sh > 1), sync
    assert engine._grad_sync is not None and engine._grad_sync.overlap
    opt = fleet.distributed_optimizer(paddle.optimizer.Adam(1e-2, parameters=model.parameters()))
    ids, labels = batch(100, dp * sh * m * MBS, SEQ, VOCAB)
    rows = slice(shard * m * MBS, (shard + 1) * m * MBS)
    engine.train_batch([ids[rows], labels[rows]], opt)
    assert engine._grad_sync.last.overlap
    on = [flag for flag in ("_dp_enable", "_sep_enable", "_sharding_enable") if vars(opt).get(flag)]
    assert not on, f"the engine reduced and the optimizer would reduce again: {on}"
    print(f"rank {dist.get_rank()}: fleet path with pp_configs {'sharding' if sh > 1 else 'dp'} overlap ok",
          flush=True)


def within_reference(tag, params, losses, ref, ref_losses, stage, shard):
    """Asserts this rank's parameters within REF_BOUND of the reference's and, on the last
    stage, each step's loss within REF_BOUND relative of this shard's; returns the worst
    parameter difference."""
    worst = max(float(np.max(np.abs(value.astype(np.float64) - ref_param(ref, key).numpy())))
                for key, value in params.items())
    assert worst <= REF_BOUND, f"{tag}: max abs diff {worst} to the reference > {REF_BOUND}"
    if stage == PP - 1:
        for step in range(STEPS):
            got, want = losses[step].reshape([]), ref_losses[step][shard]
            assert abs(float(got) - float(want)) <= REF_BOUND * abs(float(want)), (tag, step, got, want)
    return worst


def strategy_sharding_overlap(on):
    """The live strategy's pp_configs.sharding_comm_overlap, which the split_param
    optimizer reads when it is built (with it, it takes the pipeline's buffers)."""
    fleet.fleet._user_defined_strategy.hybrid_configs["pp_configs"].sharding_comm_overlap = on


def split_param_configs(hcg, configs, dp, sh, shard, use_scaler):
    """`split`: DygraphShardingOptimizerV2. Built without pp_configs.sharding_comm_overlap
    the optimizer reduces (engine overlap refused); built with it, the engine reduce-
    scatters into Paddle's FusedCommBuffers, overlap on == off bitwise."""
    me, stage = dist.get_rank(), hcg.get_stage_id()
    for vpp, m, delay, bucket_kb, hidden, fb, p2p, _, zb, v in configs:
        tag = (f"split_param dp={dp} sharding={sh} vpp={vpp} M={m} delay_scale_loss={delay} bucket_kb={bucket_kb}"
               f"{' zero_bubble=True' if zb else ''}")
        ref, ref_losses = reference(vpp, m, delay, hidden, dp, sh, use_scaler)
        runs = {}
        # dp > 1: Paddle's own optimizer path leaves the first step's gradients out of the
        # dp all-reduce (HybridParallelOptimizer all-reduces the V2 slices that are
        # initialized, and V2 initializes them in its step, after that), also without
        # any pipeline: it is not compared with the reference there
        # "early": early_comm_buffers, the buffers handed to the optimizer before the first step
        paths = [("engine", True, False, False), ("engine overlapped", True, True, False),
                 ("engine overlapped early", True, True, True)]
        if dp == 1:
            paths.insert(0, ("optimizer", False, False, False))
        for name, pp_overlap, overlap, early in paths:
            strategy_sharding_overlap(pp_overlap)
            optimizers = []
            engine, params, losses = run_engine(hcg, vpp, m, delay, overlap, bucket_kb, hidden, use_scaler, fb, p2p,
                                                dp, sh, zb, v, optimizers, main_grad=True, early=early)
            opt_types = [type(o).__name__ for o in grad_sync._chain(optimizers[0])]
            assert "DygraphShardingOptimizerV2" in opt_types, (opt_types, tag)
            assert engine._grad_sync.deferred == (not pp_overlap), (name, tag)
            assert (engine.schedule().kind in ("zb-h1", "interleaved-zb")) == zb, (engine.schedule().kind, tag)
            if pp_overlap:
                buckets = engine._grad_sync.buckets
                assert buckets and all(b.comm_buffer is not None for b in buckets), (name, tag)
                v2 = grad_sync.split_param_optimizer(optimizers[0])
                assert {id(b) for b in v2._comm_buffer_list} == {id(b.comm_buffer) for b in buckets}, (name, tag)
                assert engine._grad_sync.last.overlap == overlap, (name, tag)
            worst = within_reference(f"rank {me} {tag} ({name})", params, losses, ref, ref_losses, stage, shard)
            runs[name] = (params, worst)
            if overlap and (vpp > 1 or bucket_kb):
                runs["timing"] = check_overlap(engine, stage, bool(bucket_kb))
        for key, value in runs["engine"][0].items():
            for other in ("engine overlapped", "engine overlapped early"):
                assert np.array_equal(value, runs[other][0][key]), (
                    f"rank {me} {tag}: param {key} differs between the engine's reduce-scatter with overlap off "
                    f"and {other}")
        if "optimizer" in runs:
            same = all(np.array_equal(value, runs["optimizer"][0][key]) for key, value in runs["engine"][0].items())
            optimizer_note = (f"the optimizer reduced, max abs diff to reference {runs['optimizer'][1]:.3g}, "
                              f"{'bitwise equal' if same else 'not bitwise equal'} to the engine's")
        else:
            optimizer_note = "the optimizer's own reduction not compared (dp > 1)"
        strategy_sharding_overlap(False)
        try:
            run_engine(hcg, vpp, m, delay, True, bucket_kb, hidden, use_scaler, fb, p2p, dp, sh, zb, v, main_grad=True)
        except grad_sync.GradSyncError as err:
            assert "built without the strategy's pp_configs.sharding_comm_overlap" in str(err), err
        else:
            raise AssertionError(f"rank {me} {tag}: overlap with an optimizer reducing its own buffers was not refused")
        print(f"rank {me}: {tag}: the engine reduce-scattered, on == off == early buffers bitwise, max abs diff to "
              f"reference "
              f"{runs['engine'][1]:.3g}; {optimizer_note}; overlap without the optimizer's consent refused"
              f"{'; ' + runs['timing'] if 'timing' in runs else ''}", flush=True)
    print(f"rank {me}: all configs passed", flush=True)


def sep_configs(hcg, configs, dp, sh, shard, use_scaler):
    """`sep`: sep_degree 2 beside dp. Overlap off: the optimizer reduces over its dp x sep
    group scaled by 1 / dp (the engine nothing), as fleet's HybridParallelOptimizer. Overlap
    on (dp_comm_overlap): the engine all-reduces over the dp x sep group and scales by
    1 / (dp * sep), as fleet's PipelineParallel FusedCommBuffers do; the sep ranks hold the
    same data here, so that is the dp mean. SGD: a gradient reduced over dp twice, or its
    sep copies not summed, would move the parameters by lr * g more or less."""
    me, stage = dist.get_rank(), hcg.get_stage_id()
    OPTIMIZER[0] = paddle.optimizer.SGD
    for vpp, m, delay, bucket_kb, hidden, fb, p2p, _, zb, v in configs:
        tag = f"sep=2 dp={dp} sharding={sh} vpp={vpp} M={m} delay_scale_loss={delay}"
        engine, params, losses = run_engine(hcg, vpp, m, delay, False, bucket_kb, hidden, use_scaler, fb, p2p, dp, sh,
                                            zb, v)
        assert engine._grad_sync.deferred, tag
        ref, ref_losses = reference(vpp, m, delay, hidden, dp, sh, use_scaler, sep=2)
        worst = within_reference(f"rank {me} {tag}", params, losses, ref, ref_losses, stage, shard)
        engine, params, losses = run_engine(hcg, vpp, m, delay, True, bucket_kb, hidden, use_scaler, fb, p2p, dp, sh,
                                            zb, v)
        assert not engine._grad_sync.deferred and engine._grad_sync.last.overlap, tag
        assert engine._grad_sync.dp_group.nranks == dp * 2, tag
        ref, ref_losses = reference(vpp, m, delay, hidden, dp, sh, use_scaler)
        worst_on = within_reference(f"rank {me} {tag} overlapped", params, losses, ref, ref_losses, stage, shard)
        print(f"rank {me}: {tag}: the optimizer reduced over dp x sep, max abs diff to reference {worst:.3g}; "
              f"overlapped, the engine reduced over dp x sep scaled by its size, max abs diff {worst_on:.3g}",
              flush=True)
    fleet.fleet._user_defined_strategy.hybrid_configs["pp_configs"].dp_comm_overlap = True
    check_fleet_path(hcg, configs[0][1], dp, sh, shard)
    print(f"rank {me}: all configs passed", flush=True)


def main():
    dp, sh = int(sys.argv[1]), int(sys.argv[2])
    configs = []
    flags = set(sys.argv[4:])
    use_scaler = "scaler" in flags
    for item in sys.argv[3].split(","):
        parts = item.split(":")
        nums = [int(x) for x in parts[:5]]
        opts = parts[5] if len(parts) > 5 else ""
        configs.append((nums[0], nums[1], bool(nums[2]), nums[3] if len(nums) > 3 else 0,
                        nums[4] if len(nums) > 4 else 16, "fb" in flags or "f" in opts,
                        "p2p" in flags or "p" in opts, "overlapgpt" in flags or "o" in opts, "z" in opts,
                        "v" in opts))
    use_model(configs[0][7])
    split = "split" in flags
    sep = 2 if "sep" in flags else 1
    paddle_ext.enable()  # first: the pp_configs string below is the plugin's to parse
    strategy = fleet.DistributedStrategy()
    words = "" if split else "enable_sharding_comm_overlap" if sh > 1 else "enable_dp_comm_overlap"
    if sep > 1:
        words = ""
    strategy.hybrid_configs = {"dp_degree": dp, "mp_degree": 1, "pp_degree": PP, "sharding_degree": sh,
                               "pp_configs": words, **({"sep_degree": sep} if sep > 1 else {})}
    if split:
        strategy.hybrid_configs["sharding_configs"].split_param = True  # as PaddleFormers sets it
    strategy.pipeline_configs = {"accumulate_steps": configs[0][1], "micro_batch_size": MBS}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    stage = hcg.get_stage_id()
    me = dist.get_rank()
    shard = hcg.get_data_parallel_rank() * sh + (hcg.get_sharding_parallel_rank() if sh > 1 else 0)
    if split:
        split_param_configs(hcg, configs, dp, sh, shard, use_scaler)
        return
    if sep > 1:
        sep_configs(hcg, configs, dp, sh, shard, use_scaler)
        return
    check_fleet_path(hcg, configs[0][1], dp, sh, shard)
    for vpp, m, delay, bucket_kb, hidden, fb, p2p, overlap_model, zb, v in configs:
        use_model(overlap_model)
        tag = (f"dp={dp} sharding={sh} vpp={vpp} M={m} delay_scale_loss={delay} bucket_kb={bucket_kb or 131072} "
               f"hidden={hidden} scaler={use_scaler} fb={fb} p2p={p2p} model={MODEL['build'].__module__}"
               f"{' zero_bubble=True' if zb else ''}{' placement=v' if v else ''}")
        _, off, off_losses = run_engine(hcg, vpp, m, delay, False, bucket_kb, hidden, use_scaler, fb, p2p, dp, sh, zb,
                                        v)
        engine, on, on_losses = run_engine(hcg, vpp, m, delay, True, bucket_kb, hidden, use_scaler, fb, p2p, dp, sh,
                                           zb, v)
        if zb or (v and any(isinstance(a, I) for a in engine.schedule(m).ranks[stage])):
            check_split(engine, stage, m)  # dualpipev splits I and W too (its pairs' B's whole)
        for key in off:
            if not np.array_equal(off[key], on[key]):
                diff = np.max(np.abs(off[key].astype(np.float64) - on[key]))
                raise AssertionError(f"rank {me} {tag}: param {key} differs between overlap off and on "
                                     f"(max abs diff {diff})")
        ref, ref_losses = reference(vpp, m, delay, hidden, dp, sh, use_scaler, tied=not (v and overlap_model))
        worst = 0.0
        for key, value in on.items():
            want = ref_param(ref, key).numpy()
            worst = max(worst, float(np.max(np.abs(value.astype(np.float64) - want))))
        assert worst <= REF_BOUND, f"rank {me} {tag}: max abs diff {worst} to the reference > {REF_BOUND}"
        if stage == (0 if v else PP - 1):  # the stage with the loss
            for step in range(STEPS):
                got, want = on_losses[step].reshape([]), ref_losses[step][shard]
                assert (np.array_equal(got, want) if not v or step == 0
                        else abs(float(got) - float(want)) <= REF_BOUND * abs(float(want))), (
                    f"rank {me} {tag}: step {step} loss {on_losses[step]} != reference {ref_losses[step][shard]}")
        note = ""
        if vpp > 1 or bucket_kb:
            note = check_overlap(engine, stage, small_buckets=bool(bucket_kb))
        print(f"rank {me}: {tag}: on == off bitwise; max abs diff to reference {worst:.3g}; {note}", flush=True)
    print(f"rank {me}: all configs passed", flush=True)


if __name__ == "__main__":
    main()
