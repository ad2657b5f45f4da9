"""A GPT-style model written for the forward/backward overlap scheduler (upstream #71995).

Each transformer block is two schedule nodes, attention and MLP
(`build_schedule_node()` returns a ScheduleChunk of both), and the PipelineLayer
subclass defines `overlapped_forward_backward`, which the engine calls for every
steady-state F&B step: it interleaves the forward nodes of one micro-batch with the
backward nodes of another, F-attention, B-MLP, F-MLP, B-attention, ... That is the
shape DeepSeek-V3 / DualPipe use to hide an MoE layer's all-to-all: with the MLP an
MoE layer, the dispatch all-to-all of one micro-batch's tokens runs while the other
micro-batch's backward node computes (see the comments in the method).

The embedding and the lm head are one SharedLayerDesc layer (`TiedEmbedding`, ids in:
embedding, hidden states in: logits), so every run-function entry has
`build_schedule_node()` and the model also runs under upstream Paddle 3.1+'s own
scheduler; the loss has one too. Weights are initialised from each layer's
`layer_id`, so a PipelineLayer on several ranks and `Reference` in one process start
identical, which the tests compare bit for bit.

    model = overlap_model(vocab, hidden, seq, blocks=pp * vpp, pp=pp, vpp=vpp)  # after fleet.init
"""

from __future__ import annotations

import math

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer, SharedLayerDesc

from examples.tiny_gpt import _init
from paddle_ext.pipeline.nodes import ScheduleChunk, ScheduleNode


def _leaves(chunk) -> list:
    """The ScheduleNodes of a (nested) ScheduleChunk, in forward order."""
    out = []
    for n in chunk.nodes:
        out.extend(_leaves(n) if hasattr(n, "nodes") else [n])
    return out


class TiedEmbedding(nn.Layer):
    """Token + position embedding on the first stage, the lm head (the same word table,
    transposed) on the last: one SharedLayerDesc layer without a forward_func."""

    def __init__(self, vocab: int, hidden: int, seq: int, layer_id: int = 0) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        _init(self.word.weight, 1000 + layer_id)
        _init(self.position.weight, 2000 + layer_id)

    @property
    def embedding_weight(self) -> paddle.Tensor:
        return self.word.weight

    def forward(self, inputs):
        if isinstance(inputs, (tuple, list)):  # (hidden, positions) from the last block
            return paddle.matmul(inputs[0], self.word.weight, transpose_y=True)
        ids = inputs
        positions = paddle.arange(ids.shape[1], dtype="int64").unsqueeze(0).expand(ids.shape)
        return self.word(ids) + self.position(positions), positions

    def build_schedule_node(self):
        return ScheduleNode(self.forward, name=f"tied_embedding{self.layer_id}")


class TransformerBlock(nn.Layer):
    """Pre-norm causal self-attention, then a pre-norm MLP; (hidden, positions) in and out."""

    def __init__(self, hidden: int, heads: int, layer_id: int) -> None:
        super().__init__()
        self.layer_id, self.heads = layer_id, heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)
        for i, p in enumerate(self.parameters()):
            _init(p, 100 * layer_id + i)

    def attention(self, inputs):
        hidden, positions = inputs
        b, s, h = hidden.shape
        d = h // self.heads
        qkv = self.qkv(self.norm1(hidden)).reshape([b, s, 3, self.heads, d]).transpose([2, 0, 3, 1, 4])
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = paddle.matmul(q, k, transpose_y=True) * (1.0 / math.sqrt(d))
        causal = paddle.triu(paddle.full([s, s], -1e9, dtype=scores.dtype), diagonal=1)
        out = paddle.matmul(F.softmax(scores + causal, axis=-1), v)
        return hidden + self.proj(out.transpose([0, 2, 1, 3]).reshape([b, s, h])), positions

    def mlp(self, inputs):
        # With an MoE layer here, this node would be: gate, dispatch all-to-all, experts,
        # combine all-to-all. Split it at the all-to-alls (more nodes) and the overlapped
        # step below runs another micro-batch's backward node while each one is in flight.
        hidden, positions = inputs
        return hidden + self.down(F.gelu(self.up(self.norm2(hidden)))), positions

    def forward(self, inputs):
        return self.mlp(self.attention(inputs))

    def build_schedule_node(self):
        return ScheduleChunk([ScheduleNode(self.attention, name=f"attention{self.layer_id}"),
                              ScheduleNode(self.mlp, name=f"mlp{self.layer_id}")])


class LMLoss(nn.Layer):
    def forward(self, logits: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
        return F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1, 1])).mean()

    def build_schedule_node(self):
        return ScheduleNode(self.forward, name="lm_loss")


class OverlapGPT(PipelineLayer):
    """The PipelineLayer with upstream's hook for the overlap scheduler."""

    def overlapped_forward_backward(self, forward_chunk, forward_inputs, forward_loss_fn_node,
                                    backward_chunk, backward_loss_fn_node, backward_input_grads,
                                    scaler, p2p_async_handle=None):
        if backward_loss_fn_node is not None:  # the backward micro-batch ends in the loss
            backward_input_grads = backward_loss_fn_node.backward(scaler=scaler)
        if p2p_async_handle is not None:
            p2p_async_handle.forward_handle_wait()
        f_nodes = _leaves(forward_chunk)
        b_nodes = _leaves(backward_chunk)[::-1]
        x, grads = forward_inputs, backward_input_grads
        for i in range(max(len(f_nodes), len(b_nodes))):
            if i < len(f_nodes):
                # Forward node i of one micro-batch (attention, or MLP). In an MoE model
                # the all-to-all this node ends with would be issued asynchronously here
                # and waited for at the start of the next forward node: the backward node
                # below computes meanwhile.
                x = f_nodes[i].forward(x)
                if i == len(f_nodes) - 1 and p2p_async_handle is not None:
                    p2p_async_handle.forward_async_comm(x)  # the next stage may start
            if i < len(b_nodes):
                if i == 0 and p2p_async_handle is not None:
                    p2p_async_handle.backward_handle_wait()  # output grads complete
                # Backward node i of another micro-batch, in reverse order (MLP, then
                # attention); its own all-to-all (the gradient's combine) would hide
                # behind the next forward node the same way.
                grads = b_nodes[i].backward(grads)
        if p2p_async_handle is not None:
            p2p_async_handle.backward_async_comm(grads)
        forward_loss = forward_loss_fn_node.forward(x) if forward_loss_fn_node is not None else None
        return x, forward_loss, grads


def overlap_model(vocab: int, hidden: int, seq: int, blocks: int, pp: int, vpp: int = 1,
                  heads: int = 2, overlapped: bool = True, use_dualpipev: bool = False, loss_fn=None):
    """The model as a fleet PipelineLayer (after fleet.init). overlapped=False builds a
    plain PipelineLayer of the same layers, without `overlapped_forward_backward`.
    use_dualpipev: segmented for the V placement (Paddle 3.3), the head a copy of the
    embedding with the same initial weights (untied: Paddle's V segmentation takes no
    SharedLayerDesc)."""
    import paddle.distributed.fleet as fleet

    ends = dict(vocab=vocab, hidden=hidden, seq=seq, layer_id=0)
    if use_dualpipev:
        descs = [LayerDesc(TiedEmbedding, **ends)]
    else:
        descs = [SharedLayerDesc("embed", TiedEmbedding, shared_weight_attr="embedding_weight", **ends)]
    descs += [LayerDesc(TransformerBlock, hidden=hidden, heads=heads, layer_id=i + 1)
              for i in range(blocks)]
    if use_dualpipev:
        descs += [LayerDesc(TiedEmbedding, **ends)]
    else:
        descs += [SharedLayerDesc("embed", TiedEmbedding, shared_weight_attr="embedding_weight", **ends)]
    topology = fleet.get_hybrid_communicate_group().topology()
    cls = OverlapGPT if overlapped else PipelineLayer
    layout = {"use_dualpipev": True} if use_dualpipev else {
        "num_virtual_pipeline_stages": vpp if vpp > 1 else None}
    return cls(layers=descs, topology=topology, loss_fn=LMLoss() if loss_fn is None else loss_fn,
               seg_method="layer:TransformerBlock",
               **layout)


class Reference(nn.Layer):
    """The same model in one process; the head keeps its own copy of the tied table so
    that its gradient sums the way the pipeline's does (per stage, then the two)."""

    def __init__(self, vocab: int, hidden: int, seq: int, blocks: int, heads: int = 2) -> None:
        super().__init__()
        self.embed = TiedEmbedding(vocab, hidden, seq, layer_id=0)
        self.head = TiedEmbedding(vocab, hidden, seq, layer_id=0)
        self.blocks = nn.LayerList([TransformerBlock(hidden, heads, i + 1) for i in range(blocks)])
        self.loss_fn = LMLoss()

    def forward(self, ids: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.loss_fn(self.head(x), labels)

    def tie_grads(self) -> None:
        total = self.embed.word.weight.grad + self.head.word.weight.grad
        self.embed.word.weight.grad.set_value(total)
        self.head.word.weight.grad.set_value(total)

    def layer(self, layer_id: int, head: bool = False) -> nn.Layer:
        if layer_id == 0:
            return self.head if head else self.embed
        return self.blocks[layer_id - 1]
