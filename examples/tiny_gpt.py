"""A small GPT-style model for pipeline parallelism: token + position
embedding, MLP transformer blocks, and an lm head tied to the embedding.

Every layer initialises its parameters from its own `layer_id`, so the same
model built as a PipelineLayer on several ranks or as one plain model in one
process starts from identical weights: that is what the parity tests and the
demo compare against. Stage outputs are tuples (hidden, position_ids) to show
that stop_gradient tensors pass through the pipeline.
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


def _init(param: paddle.Tensor, seed: int, scale: float = 0.2) -> None:
    rng = np.random.default_rng(seed)
    param.set_value(rng.uniform(-scale, scale, size=param.shape).astype("float32"))


class Embedding(nn.Layer):
    def __init__(self, vocab: int, hidden: int, seq: int, layer_id: int = 0,
                 embedding_weight: paddle.Tensor | None = None) -> None:
        """embedding_weight: share this word embedding (fleet's LocalSharedLayerDesc
        builds the tied lm head of a V-segmented model so)."""
        super().__init__()
        self.layer_id = layer_id
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        _init(self.word.weight, 1000 + layer_id)
        _init(self.position.weight, 2000 + layer_id)
        if embedding_weight is not None:
            self.word.weight = embedding_weight

    @property
    def embedding_weight(self) -> paddle.Tensor:
        return self.word.weight

    def forward(self, ids: paddle.Tensor):
        positions = paddle.arange(ids.shape[1], dtype="int64").unsqueeze(0).expand(ids.shape)
        return self.word(ids) + self.position(positions), positions


def lm_head(embedding: Embedding, inputs):
    hidden, _ = inputs
    return paddle.matmul(hidden, embedding.word.weight, transpose_y=True)


class Block(nn.Layer):
    def __init__(self, hidden: int, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)
        for i, p in enumerate(self.parameters()):
            _init(p, 100 * layer_id + i)

    def forward(self, inputs):
        hidden, positions = inputs
        return hidden + self.down(F.gelu(self.up(self.norm(hidden)))), positions


class LMLoss(nn.Layer):
    def forward(self, logits: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
        return F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1, 1])).mean()


def pipeline_model(vocab: int, hidden: int, seq: int, blocks: int, pp: int, vpp: int = 1, block: type | None = None,
                   loss_fn=None, **pipeline_kwargs):
    """The model as a fleet PipelineLayer with the lm head tied to the embedding.

    Built on fleet's hybrid topology (fleet.init first), as PaddleNLP does: with
    only num_stages, Paddle 2.6's PipelineLayer makes a topology without a
    sharding axis and its tied-weight set-up fails. block: the blocks' class (Block, or a
    subclass: segmented by "layer:Block" all the same); pipeline_kwargs go to
    PipelineLayer (recompute_interval, recompute_ctx). loss_fn: the PipelineLayer's (default
    LMLoss(); a list gives it several, Paddle 3.x's contract)."""
    import paddle.distributed.fleet as fleet
    from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer, SharedLayerDesc

    descs = [SharedLayerDesc("embed", Embedding, shared_weight_attr="embedding_weight",
                             vocab=vocab, hidden=hidden, seq=seq, layer_id=0)]
    descs += [LayerDesc(block or Block, hidden=hidden, layer_id=i + 1) for i in range(blocks)]
    descs += [SharedLayerDesc("embed", Embedding, forward_func=lm_head, shared_weight_attr="embedding_weight",
                              vocab=vocab, hidden=hidden, seq=seq, layer_id=0)]
    topology = fleet.get_hybrid_communicate_group().topology()
    assert topology.get_dim("pipe") == pp, (topology.get_dim("pipe"), pp)
    return PipelineLayer(layers=descs, topology=topology, loss_fn=LMLoss() if loss_fn is None else loss_fn,
                         seg_method="layer:Block",
                         num_virtual_pipeline_stages=vpp if vpp > 1 else None, **pipeline_kwargs)


class Head(Embedding):
    """The lm head as a layer of its own (an untied head: LayerDesc, no forward_func)."""

    def forward(self, inputs):
        return lm_head(self, inputs)


def v_pipeline_model(vocab: int, hidden: int, seq: int, blocks: int, pp: int, tied: bool = True,
                     native: bool | None = None, loss_fn=None):
    """The model as a PipelineLayer segmented for the V placement (rank r holds stages r
    and 2*pp-1-r): Paddle 3.3's use_dualpipev=True where this Paddle has it, else the
    plugin's VPipelineLayer (native=False forces the plugin's; paddle_ext.pipeline.v_layer).
    Rank 0 holds the embedding and the lm head, so the tie is local
    (LocalSharedLayerDesc: one parameter); untied, the head is a copy with the same
    initial weights."""
    import paddle.distributed.fleet as fleet
    from paddle.distributed.fleet.meta_parallel import LayerDesc

    from paddle_ext.pipeline.v_layer import local_shared_layer_desc_class, v_pipeline_layer

    local_shared = local_shared_layer_desc_class()
    args = dict(vocab=vocab, hidden=hidden, seq=seq, layer_id=0)
    if tied:
        descs = [local_shared("embed", Embedding, shared_weight_attr="embedding_weight", **args)]
    else:
        descs = [LayerDesc(Embedding, **args)]
    descs += [LayerDesc(Block, hidden=hidden, layer_id=i + 1) for i in range(blocks)]
    if tied:
        descs += [local_shared("embed", Embedding, forward_func=lm_head, shared_weight_attr="embedding_weight", **args)]
    else:
        descs += [LayerDesc(Head, **args)]
    topology = fleet.get_hybrid_communicate_group().topology()
    return v_pipeline_layer(descs, topology=topology, loss_fn=LMLoss() if loss_fn is None else loss_fn,
                            seg_method="layer:Block", native=native)


class Reference(nn.Layer):
    """The same model in one process. The head keeps its own copy of the tied
    weight so that its gradient can be summed the way the pipeline sums it:
    each stage accumulates over micro-batches, then one all-reduce adds the two."""

    def __init__(self, vocab: int, hidden: int, seq: int, blocks: int) -> None:
        super().__init__()
        self.embed = Embedding(vocab, hidden, seq, layer_id=0)
        self.head = Embedding(vocab, hidden, seq, layer_id=0)
        self.blocks = nn.LayerList([Block(hidden, i + 1) for i in range(blocks)])
        self.loss_fn = LMLoss()

    def forward(self, ids: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.loss_fn(lm_head(self.head, x), labels)

    def tie_grads(self) -> None:
        total = self.embed.word.weight.grad + self.head.word.weight.grad
        self.embed.word.weight.grad.set_value(total)
        self.head.word.weight.grad.set_value(total)

    def layer(self, layer_id: int, head: bool = False) -> nn.Layer:
        if layer_id == 0:
            return self.head if head else self.embed
        return self.blocks[layer_id - 1]


def batch(step: int, size: int, seq: int, vocab: int):
    rng = np.random.default_rng(10_000 + step)
    ids = rng.integers(0, vocab, size=(size, seq)).astype("int64")
    labels = np.roll(ids, -1, axis=1)
    return paddle.to_tensor(ids), paddle.to_tensor(labels)


def pattern_batch(step: int, size: int, seq: int, vocab: int):
    """Sequences following a fixed rule (next = 5 * token + 3 mod vocab): a model
    can learn it, so a demo's loss goes down."""
    rng = np.random.default_rng(20_000 + step)
    ids = np.empty((size, seq + 1), dtype="int64")
    ids[:, 0] = rng.integers(0, vocab, size=size)
    for t in range(seq):
        ids[:, t + 1] = (5 * ids[:, t] + 3) % vocab
    return paddle.to_tensor(ids[:, :-1]), paddle.to_tensor(ids[:, 1:])
