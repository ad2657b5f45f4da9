"""Rank script: a PipelineLayer with two loss functions, Paddle 3.x's contract, every schedule kind.

`PipelineLayer(loss_fn=[cross entropy, z-loss])`: each kind runs 2 train_batch steps with
loss_fn_idx 0 and then 1 on fresh models (step 0 returning the summed losses, step 1 the
per-micro-batch ones), then eval_batch(compute_loss=True); every returned entry, every
gradient and the parameters must equal a single-process run of the same model that
computes both losses per micro-batch and back-propagates the chosen one, bit for bit.
Then a third loss_fn_idx is refused with the range, and (Paddle 3.x, 1F1B) Paddle's own
PipelineParallel, run on the same model over gloo, gives the same list as the engine.

Usage: pipeline_losses.py [KIND,...]  (default: every kind)
"""

import sys

import numpy as np
import paddle
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from _parity import GradRecorder, assert_equal, finish, ref_param, stage_params, v_stage_params  # noqa: E402

import paddle_ext  # noqa: E402
from examples import overlap_gpt, tiny_gpt  # noqa: E402
from paddle_ext.pipeline.engine import PipelineEngine, PipelineSettings  # noqa: E402

VOCAB, HIDDEN, SEQ, MBS, STEPS, PP = 32, 16, 8, 2, 2, 2


class ZLoss(paddle.nn.Layer):
    """An auxiliary loss on the same logits (PaLM's z-loss), the second loss function."""

    def forward(self, logits, labels):
        return (paddle.logsumexp(logits, axis=-1) ** 2).mean() * 0.01


# kind -> (model family, vpp, M, PipelineSettings keywords)
KINDS = {
    "1f1b": ("tiny", 1, 3, {}),
    "interleaved": ("tiny", 2, 3, {"delay_scale_loss": True}),
    "zb-h1": ("tiny", 1, 3, {"kind": "zb-h1"}),
    "interleaved-zb": ("tiny", 2, 4, {"kind": "interleaved-zb"}),
    "fb-overlap": ("overlap", 1, 4, {"fb_overlap": True, "overlap_p2p": True}),
    "zb-v": ("v", 2, 3, {"kind": "zb-v"}),
    "dualpipev": ("v", 2, 4, {"kind": "dualpipev", "dualpipev": True, "delay_scale_loss": True}),
}


def build(family, vpp, loss_fns):
    blocks = PP * vpp
    if family == "overlap":
        model = overlap_gpt.overlap_model(VOCAB, HIDDEN, SEQ, blocks=blocks, pp=PP, loss_fn=loss_fns)
        ref = overlap_gpt.Reference(VOCAB, HIDDEN, SEQ, blocks=blocks)
        return model, ref, lambda x: ref.head(x), True
    if family == "v":
        model = tiny_gpt.v_pipeline_model(VOCAB, HIDDEN, SEQ, blocks=blocks, pp=PP, tied=False, loss_fn=loss_fns)
        ref = tiny_gpt.Reference(VOCAB, HIDDEN, SEQ, blocks=blocks)
        return model, ref, lambda x: tiny_gpt.lm_head(ref.head, x), False
    model = tiny_gpt.pipeline_model(VOCAB, HIDDEN, SEQ, blocks=blocks, pp=PP, vpp=vpp, loss_fn=loss_fns)
    ref = tiny_gpt.Reference(VOCAB, HIDDEN, SEQ, blocks=blocks)
    return model, ref, lambda x: tiny_gpt.lm_head(ref.head, x), True


def reference_losses(ref, head, ids, labels, m, chosen, delay, backward):
    """Both losses per micro-batch as the pipeline's loss stage computes them; the chosen
    one back-propagated (backward). Returns per loss function the per-micro-batch list."""
    loss_fns = [tiny_gpt.LMLoss(), ZLoss()]
    per_fn = [[], []]
    for mb in range(m):
        rows = slice(mb * MBS, (mb + 1) * MBS)
        x = ref.embed(ids[rows])
        for block in ref.blocks:
            x = block(x)
        logits = head(x)
        for idx, fn in enumerate(loss_fns):
            loss = fn(logits, labels[rows])
            if m > 1 and not delay:
                loss = loss / m
            per_fn[idx].append(loss.detach())
            if idx == chosen and backward:
                loss.backward()
    return per_fn


def totals(per_fn, per_microbatch, m, delay):
    out = []
    for losses in per_fn:
        if per_microbatch:
            out.append(paddle.stack(losses))
            continue
        total = paddle.zeros_like(losses[0])
        for item in losses:
            total += item
        out.append(total / m if delay else total)
    return out


def check_list(tag, got, want):
    assert isinstance(got, list) and len(got) == 2, f"{tag}: expected a list of 2 losses, got {type(got).__name__}"
    for idx, (g, w) in enumerate(zip(got, want)):
        assert_equal(f"{tag} loss[{idx}]", g.numpy().reshape(w.shape), w.numpy())


def run_kind(hcg, kind, chosen):
    family, vpp, m, extra = KINDS[kind]
    stage = hcg.get_stage_id()
    delay = extra.get("delay_scale_loss", False)
    paddle.seed(0)
    model, ref, head, tied = build(family, vpp, [tiny_gpt.LMLoss(), ZLoss()] if family != "overlap"
                                   else [overlap_gpt.LMLoss(), ZLoss()])
    if family == "v":
        mine = v_stage_params(model)
    else:
        mine = stage_params(model, stage, overlap_gpt.TiedEmbedding if family == "overlap" else tiny_gpt.Embedding)
    ref_params = {key: ref_param(ref, key) for key in mine}
    engine = PipelineEngine(model, hcg, PipelineSettings(m, MBS, **{"overlap_p2p": False, **extra}))
    opt = GradRecorder(paddle.optimizer.SGD(0.1, parameters=model.parameters()), mine)
    ref_opt = paddle.optimizer.SGD(0.1, parameters=ref.parameters())
    for step in range(STEPS):
        per_mb = step == 1
        ids, labels = tiny_gpt.batch(step, m * MBS, SEQ, VOCAB)
        got = engine.train_batch([ids, labels], opt, loss_fn_idx=chosen, return_micro_batch_loss=per_mb)
        want = totals(reference_losses(ref, head, ids, labels, m, chosen, delay, True), per_mb, m, delay)
        finish(ref, m, delay, tie=tied)
        tag = f"{kind} loss_fn_idx={chosen} step {step}"
        check_list(tag, got, want)
        for key, p in ref_params.items():
            assert_equal(f"{tag} grad of {key}", opt.grads[key], None if p.grad is None else p.grad.numpy())
        ref_opt.step()
        ref_opt.clear_grad()
    for key, p in ref_params.items():
        assert_equal(f"{kind} loss_fn_idx={chosen} param {key}", mine[key].numpy(), p.numpy())
    ids, labels = tiny_gpt.batch(STEPS, m * MBS, SEQ, VOCAB)
    got = engine.eval_batch([ids, labels], compute_loss=True, loss_fn_idx=chosen)
    with paddle.no_grad():
        want = totals(reference_losses(ref, head, ids, labels, m, chosen, delay, False), False, m, delay)
    check_list(f"{kind} loss_fn_idx={chosen} eval_batch", got, want)
    print(f"rank {stage}: {kind} loss_fn_idx={chosen}: both losses, grads and params bitwise equal "
          f"(kind {engine.schedule(m).kind}, eval {engine.schedule(m, forward_only=True).kind})", flush=True)
    return engine


def check_refusal(engine):
    ids, labels = tiny_gpt.batch(0, engine.accumulate_steps * MBS, SEQ, VOCAB)
    for call in (lambda: engine.train_batch([ids, labels], None, loss_fn_idx=2),
                 lambda: engine.eval_batch([ids, labels], compute_loss=True, loss_fn_idx=2)):
        try:
            call()
        except (ValueError, AssertionError) as err:
            assert "loss_fn_idx = 2 names no loss function" in str(err) and "[0, 1]" in str(err), err
        else:
            raise AssertionError("loss_fn_idx = 2 was accepted with two loss functions")
    print(f"rank {engine.stage_id}: loss_fn_idx = 2 refused", flush=True)


def paddle_reference(hcg, strategy):
    """Paddle's own PipelineParallel (3.x, 1F1B: it runs on CPU over gloo with
    use_batch_p2p_comm off and a device id) against the engine on the same model."""
    from paddle.distributed.fleet.meta_parallel import PipelineParallel

    from paddle_ext import compat

    if compat.paddle_version() < (3, 0, 0):
        print(f"rank {hcg.get_stage_id()}: Paddle {paddle.__version__} has one loss function: no comparison",
              flush=True)
        return
    results = {}
    for which in ("paddle", "engine"):
        paddle.seed(0)
        model = tiny_gpt.pipeline_model(VOCAB, HIDDEN, SEQ, blocks=PP, pp=PP, loss_fn=[tiny_gpt.LMLoss(), ZLoss()])
        if which == "paddle":
            paddle.distributed.ParallelEnv()._device_id = 0
            runner = PipelineParallel(model, hcg, strategy)
        else:
            runner = PipelineEngine(model, hcg, PipelineSettings(3, MBS, overlap_p2p=False))
        opt = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1, parameters=model.parameters()))
        out = []
        for step in range(2):
            ids, labels = tiny_gpt.batch(step, 3 * MBS, SEQ, VOCAB)
            out.append(runner.train_batch([ids, labels], opt, loss_fn_idx=1, return_micro_batch_loss=step == 1))
        ids, labels = tiny_gpt.batch(2, 3 * MBS, SEQ, VOCAB)
        out.append(runner.eval_batch([ids, labels], compute_loss=True, loss_fn_idx=1))
        results[which] = [[np.asarray(t.numpy()).reshape(-1) for t in entry] for entry in out]
    for step, (mine, theirs) in enumerate(zip(results["engine"], results["paddle"])):
        assert len(mine) == len(theirs) == 2, (len(mine), len(theirs))
        for idx, (a, b) in enumerate(zip(mine, theirs)):
            assert_equal(f"call {step} loss[{idx}] against Paddle's PipelineParallel", a, b,
                         differs="the engine differs from Paddle's PipelineParallel")
    print(f"rank {hcg.get_stage_id()}: equal to Paddle's own PipelineParallel", flush=True)


def main():
    kinds = sys.argv[1].split(",") if len(sys.argv) > 1 else list(KINDS)
    paddle_ext.enable()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": PP,
                               "pp_configs": {"use_batch_p2p_comm": False}}
    strategy.pipeline_configs = {"accumulate_steps": 3, "micro_batch_size": MBS}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    engine = None
    for kind in kinds:
        for chosen in (0, 1):
            engine = run_kind(hcg, kind, chosen)
    check_refusal(engine)
    paddle_reference(hcg, fleet.fleet._user_defined_strategy)
    print(f"rank {hcg.get_stage_id()}: all loss checks passed", flush=True)


if __name__ == "__main__":
    main()
