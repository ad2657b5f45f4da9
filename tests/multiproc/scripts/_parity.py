"""What the parity rank scripts share: the single-process oracle (ReferenceRun: the
reference model's training steps as the pipeline must reproduce them), a grad-recording
optimizer wrapper, the mapping from a rank's parameters to the reference's, and a
bitwise comparison that names what differed."""

import numpy as np


class GradRecorder:
    """Wraps an optimizer: keeps a copy of every grad just before step()."""

    def __init__(self, inner, params):
        self.inner, self.params, self.grads = inner, params, None

    def step(self):
        self.grads = {k: (None if p.grad is None else p.grad.numpy().copy()) for k, p in self.params.items()}
        self.inner.step()

    def clear_grad(self, *args, **kwargs):
        self.inner.clear_grad(*args, **kwargs)


def stage_params(model, stage, embedding_cls):
    """(layer_id, is_head, param name) -> Parameter for the layers this rank holds; the
    embedding on a later stage is the tied lm head."""
    out = {}
    for layer in model.sublayers():
        if hasattr(layer, "layer_id"):
            head = isinstance(layer, embedding_cls) and stage != 0
            for name, p in layer.named_parameters():
                out[(layer.layer_id, head, name)] = p
    return out


def v_stage_params(model):
    """stage_params for a V-segmented PipelineLayer (use_dualpipev): rank 0's chunk 1
    ends with the lm head (layer_id 0); a parameter both ends share (the tied word
    table, LocalSharedLayerDesc) is listed once, under the embedding."""
    out, seen = {}, set()
    for c, chunk in enumerate(model._model_chunks):
        for layer in chunk.sublayers(include_self=True):
            if hasattr(layer, "layer_id"):
                head = layer.layer_id == 0 and c == 1
                for name, p in layer.named_parameters():
                    if id(p) not in seen:
                        seen.add(id(p))
                        out[(layer.layer_id, head, name)] = p
    return out


def accumulate(ref, ids, labels, m, mbs, delay, scaler=None):
    """Forward and backward of the M micro-batches in order, the gradients accumulating
    on `ref`'s parameters: each micro-batch's loss / M, or under delay_scale_loss the
    plain losses (their grads are scaled by finish()). Returns the step's loss as the
    pipeline reports it (the sum of the scaled losses, or their sum / M)."""
    import paddle

    total = paddle.zeros([])
    for mb in range(m):
        part = ref(ids[mb * mbs:(mb + 1) * mbs], labels[mb * mbs:(mb + 1) * mbs])
        if m > 1 and not delay:
            part = part / m
        (scaler.scale(part) if scaler is not None else part).backward()
        total += part.detach()
    return total / m if delay else total


def finish(ref, m, delay, tie=True):
    """The accumulated gradients as the pipeline's are at the optimizer: the tied
    embedding / head pair summed (tie), then under delay_scale_loss every gradient / M."""
    if tie:
        ref.tie_grads()
    if delay:
        for p in ref.parameters():
            if p.grad is not None:
                p.grad.set_value(p.grad.scale(1.0 / m))


class ReferenceRun:
    """The single-process oracle of the parity scripts: `model` (the reference, built
    with the pipeline model's initial weights) trained with Adam (lr 1e-2) on whole
    batches of M micro-batches of `mbs` rows, optionally under an AMP GradScaler (loss
    scaling 2**10). `keys` are stage_params keys: step() returns the loss and those
    parameters' gradients, params() their values."""

    def __init__(self, model, keys, m, mbs, delay=False, scaler=False, tie=True):
        import paddle

        self.model, self.m, self.mbs, self.delay, self.tie = model, m, mbs, delay, tie
        self.params_by_key = {key: ref_param(model, key) for key in keys}
        self.opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
        self.scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0) if scaler else None

    def step(self, ids, labels):
        """One optimizer step: (loss, {key: grad or None}) as numpy, the grads as the
        optimizer saw them (unscaled under the GradScaler, as the pipeline's are inside
        scaler.step)."""
        loss = accumulate(self.model, ids, labels, self.m, self.mbs, self.delay, self.scaler)
        finish(self.model, self.m, self.delay, self.tie)
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        grads = {k: None if p.grad is None else p.grad.numpy().copy() for k, p in self.params_by_key.items()}
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.clear_grad()
        return loss.numpy(), grads

    def params(self):
        """{key: value} of the parameters named by `keys`, now."""
        return {k: p.numpy().copy() for k, p in self.params_by_key.items()}

    def eval_loss(self, ids, labels):
        """eval_batch's loss on this batch (reference_eval_loss)."""
        return reference_eval_loss(self.model, ids, labels, self.m, self.mbs, self.delay).numpy()


def reference_eval_loss(ref, ids, labels, m, mbs, delay):
    """eval_batch's loss computed by the single-process reference: the micro-batch
    losses summed, each / m (or the sum / m under delay_scale_loss)."""
    import paddle

    with paddle.no_grad():
        total = paddle.zeros([])
        for mb in range(m):
            part = ref(ids[mb * mbs:(mb + 1) * mbs], labels[mb * mbs:(mb + 1) * mbs])
            total += part / m if m > 1 and not delay else part
        return total / m if delay else total


def ref_param(ref, key):
    """The reference model's parameter for a stage_params key."""
    layer_id, head, name = key
    obj = ref.layer(layer_id, head)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def assert_equal(what, got, want, differs="pipeline differs from the single-process run"):
    """Bit-for-bit equality of two arrays (or both None)."""
    if got is None and want is None:
        return
    assert got is not None and want is not None, f"{what}: one side has no value"
    if not np.array_equal(got, want):
        diff = np.max(np.abs(got.astype(np.float64) - want)) if got.shape == want.shape else "shape"
        raise AssertionError(f"{what}: {differs} (max abs diff {diff})")


def check_split(engine, stage, m):
    """A zero-bubble step's SplitStats: weight gradients were deferred wherever the
    schedule separates an I from its W (an I directly followed by its W runs as a plain
    backward), and no sum was split or reordered. Returns a note for the log."""
    from paddle_ext.pipeline.schedule.ir import I, W

    actions = engine.schedule(m).ranks[stage]
    separated = sum(1 for a, nxt in zip(actions, actions[1:]) if isinstance(a, I) and nxt != W(a.chunk, a.mb))
    split = engine.last_step.split
    assert split is not None and not split.mixed and not split.reordered, split
    assert (split.deferred > 0) == (separated > 0), (separated, split)
    return (f", {separated} I's apart from their W, {split.deferred} weight grads deferred, pending W peak "
            f"{split.peak_pending_bytes} B")
