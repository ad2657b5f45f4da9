"""Split backward (I then W) against Paddle's plain backward, bit for bit (fp32 CPU)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_ext.pipeline.runtime.split_backward import WeightGradStore


class OwnMatmul(paddle.nn.Layer):
    """A model's own matmul weight (not a Linear): paddle.matmul(x, param)."""

    def __init__(self, k: int, n: int, transpose: bool = False) -> None:
        super().__init__()
        self.transpose = transpose
        self.w = self.create_parameter([n, k] if transpose else [k, n])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.matmul(x, self.w, transpose_y=self.transpose)


class Net(paddle.nn.Layer):
    def __init__(self, tie: str = "") -> None:
        super().__init__()
        self.a = paddle.nn.Linear(16, 24)
        self.norm = paddle.nn.LayerNorm(24)
        self.b = paddle.nn.Linear(24, 24, bias_attr=False)
        self.own = OwnMatmul(24, 20)
        self.head = OwnMatmul(20, 16, transpose=True)  # x @ w^T, as a tied lm head
        self.emb = paddle.nn.Embedding(10, 16)
        self.tie = tie
        if tie == "linear":  # one Linear applied twice
            pass

    def forward(self, x: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
        h = x + self.emb(ids)
        h = paddle.nn.functional.gelu(self.norm(self.a(h)))
        h = self.b(h)
        if self.tie == "linear":
            h = self.b(paddle.tanh(h))
        h = self.head(self.own(h))
        if self.tie == "embedding":  # head tied to the embedding: paddle.matmul(x, emb^T)
            h = paddle.matmul(h, self.emb.weight, transpose_y=True)
        return h


def _data(mbs: int, rows: int = 6) -> list:
    rng = np.random.default_rng(3)
    out = []
    for _ in range(mbs):
        x = paddle.to_tensor(rng.standard_normal((rows, 3, 16)).astype("float32"))
        x.stop_gradient = False
        ids = paddle.to_tensor(rng.integers(0, 10, (rows, 3)))
        out.append((x, ids))
    return out


def _grads(net: paddle.nn.Layer) -> dict:
    out = {}
    for name, p in net.named_parameters():
        g = getattr(p, "main_grad", None)
        g = p.grad if g is None else g
        out[name] = None if g is None else g.numpy().copy()
    return out


def _run(net: paddle.nn.Layer, data: list, mode: str, store: WeightGradStore | None = None,
         scale: float = 1.0) -> tuple[dict, list]:
    """mode: plain (forward + backward per micro-batch), split (F F .. I I .. W W ..),
    or interleave (F I W per micro-batch, Ws delayed by one)."""
    net.clear_gradients()
    for p in net.parameters():
        if getattr(p, "main_grad", None) is not None:
            p.main_grad = None  # what MixPrecisionOptimizer.clear_grad does
    outs = []
    if store is not None:
        store.begin_step()
    for mb, (x, ids) in enumerate(data):
        if store is None:
            outs.append(net(x, ids))
        else:
            with store.capture(0, mb):
                outs.append(net(x, ids))

    def back(mb: int) -> None:
        (outs[mb] * outs[mb]).sum().scale(scale).backward()

    if mode == "plain":
        for mb in range(len(data)):
            back(mb)
    elif mode == "split":
        for mb in range(len(data)):
            store.input_backward(0, mb, lambda mb=mb: back(mb))
        for mb in range(len(data)):
            store.weight_backward(0, mb)
        store.end_step()
    else:
        for mb in range(len(data)):
            store.input_backward(0, mb, lambda mb=mb: back(mb))
            if mb:
                store.weight_backward(0, mb - 1)
        store.weight_backward(0, len(data) - 1)
        store.end_step()
    input_grads = [x.grad.numpy().copy() for x, _ in data]
    for x, _ in data:
        x.clear_gradient()
    return _grads(net), input_grads


def _assert_same(ref: tuple, got: tuple) -> None:
    for name in ref[0]:
        assert (ref[0][name] is None) == (got[0][name] is None), name
        if ref[0][name] is not None:
            np.testing.assert_array_equal(got[0][name], ref[0][name], err_msg=name)
    for r, g in zip(ref[1], got[1]):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("mode", ["split", "interleave"])
@pytest.mark.parametrize("tie", ["", "linear"])
def test_input_then_weight_equals_plain_backward(mode: str, tie: str) -> None:
    """Linears, a model's own matmul weight, and one Linear applied twice (its two dWs
    summed in autograd's order before they reach the weight)."""
    paddle.seed(1)
    net = Net(tie)
    data = _data(3)
    ref = _run(net, data, "plain")
    store = WeightGradStore().bind([net])
    got = _run(net, data, mode, store)
    _assert_same(ref, got)
    stats = store.last
    assert stats.deferred == 3 * (5 if tie else 4) and not stats.mixed and not stats.reordered
    assert stats.peak_pending_bytes > 0 and store.pending_bytes == 0


def test_embedding_tied_to_a_head_matmul_in_one_chunk() -> None:
    """The embedding's weight is also the head's matmul weight: its lookup gradient comes
    in I, so the first step splits that sum (named, within one rounding); from then on
    the weight is computed in I and every step is bitwise equal."""
    paddle.seed(1)
    net = Net("embedding")
    data = _data(3)
    ref = _run(net, data, "plain")
    store = WeightGradStore().bind([net])
    first = _run(net, data, "split", store)
    assert store.last.mixed == [net.emb.weight.name]
    for name in ref[0]:
        np.testing.assert_allclose(first[0][name], ref[0][name], rtol=1e-6, atol=1e-6, err_msg=name)
    _assert_same(ref, _run(net, data, "split", store))
    assert store.last.deferred == 3 * 4 and not store.last.mixed


def _one_input_backward() -> tuple:
    """A fresh Net, one micro-batch's F and I run through a new store."""
    paddle.seed(2)
    net = Net()
    (x, ids), = _data(1)
    store = WeightGradStore().bind([net])
    store.begin_step()
    with store.capture(0, 0):
        out = net(x, ids)
    store.input_backward(0, 0, lambda: out.sum().backward())
    return net, x, store


def test_weights_wait_for_w() -> None:
    """After I only the input gradient and the non-deferred parameters have gradients."""
    net, x, store = _one_input_backward()
    assert x.grad is not None and net.norm.weight.grad is not None and net.a.bias.grad is not None
    assert net.a.weight.grad is None and net.b.weight.grad is None and net.own.w.grad is None
    assert net.head.w.grad is None
    assert store.pending_bytes > 0 and store.has_pending(0, 0)
    assert store.weight_backward(0, 0) == 4
    assert net.a.weight.grad is not None and store.pending_bytes == 0
    assert store.end_step().deferred == 4


def test_an_input_backward_without_its_weight_backward_is_an_error() -> None:
    _, _, store = _one_input_backward()
    with pytest.raises(RuntimeError, match="weight gradients of 0.0 were deferred and never computed"):
        store.end_step()
    assert store.pending_bytes == 0


def test_layer_without_deferrable_weights_is_untouched() -> None:
    paddle.seed(4)
    net = paddle.nn.Sequential(paddle.nn.LayerNorm(16), paddle.nn.Conv1D(3, 3, 1))
    data = [paddle.randn([4, 3, 16]) for _ in range(2)]
    for x in data:
        x.stop_gradient = False
    ref = []
    for x in data:
        net(x).sum().backward()
    ref = {n: p.grad.numpy().copy() for n, p in net.named_parameters()}
    net.clear_gradients()
    store = WeightGradStore().bind([net])
    store.begin_step()
    for mb, x in enumerate(data):
        with store.capture(0, mb):
            y = net(x)
        store.input_backward(0, mb, lambda y=y: y.sum().backward())
    for mb in range(2):
        assert store.weight_backward(0, mb) == 0
    assert store.end_step().deferred == 0
    for n, p in net.named_parameters():
        np.testing.assert_array_equal(p.grad.numpy(), ref[n], err_msg=n)


def test_main_grad_and_scaled_loss() -> None:
    """fleet's MixPrecisionLayer keeps fp32 main_grad through grad hooks; W feeds them."""
    from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionLayer

    paddle.seed(5)
    net = Net()
    wrapped = MixPrecisionLayer(net, dtype="bfloat16")
    data = _data(2)
    ref = _run(wrapped, data, "plain", scale=1024.0)
    store = WeightGradStore().bind([net])
    got = _run(wrapped, data, "split", store, scale=1024.0)
    assert got[0]["_layers.a.weight"] is not None and store.last.deferred == 2 * 4
    _assert_same(ref, got)


def test_native_use_of_a_deferred_weight_is_learned() -> None:
    """A Linear weight also used by a non-captured op: that step's sum is split (named,
    within one rounding), later steps compute it in I and are exact."""

    class Mixed(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.lin = paddle.nn.Linear(8, 8)

        def forward(self, x: paddle.Tensor) -> paddle.Tensor:
            return self.lin(x) + (self.lin.weight * 0.5).sum()

    paddle.seed(6)
    net = Mixed()
    x = paddle.randn([4, 8])
    x.stop_gradient = False

    def run(store: WeightGradStore | None) -> np.ndarray:
        net.clear_gradients()
        if store is None:
            net(x).square().sum().backward()
            return net.lin.weight.grad.numpy().copy()
        store.begin_step()
        with store.capture(0, 0):
            y = net(x)
        store.input_backward(0, 0, lambda: y.square().sum().backward())
        store.weight_backward(0, 0)
        store.end_step()
        return net.lin.weight.grad.numpy().copy()

    ref = run(None)
    store = WeightGradStore().bind([net])
    first = run(store)
    assert store.last.mixed == [net.lin.weight.name]
    np.testing.assert_allclose(first, ref, rtol=1e-6)
    np.testing.assert_array_equal(run(store), ref)
    assert store.last.deferred == 0 and not store.last.mixed


def test_capture_restores_paddle() -> None:
    linear, matmul = paddle.nn.functional.linear, paddle.matmul
    store = WeightGradStore().bind([paddle.nn.Linear(2, 2)])
    with pytest.raises(ZeroDivisionError):
        with store.capture(0, 0):
            assert paddle.matmul is not matmul
            raise ZeroDivisionError
    assert paddle.nn.functional.linear is linear and paddle.matmul is matmul


def test_fleet_column_and_row_parallel_linear() -> None:
    """fleet's mp layers keep F.linear as their `linear` member; capture swaps it."""
    import paddle.distributed.fleet as fleet
    from paddle.distributed.fleet.layers.mpu import mp_layers

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    paddle.seed(7)
    net = paddle.nn.Sequential(mp_layers.ColumnParallelLinear(16, 24, has_bias=True, gather_output=False),
                               paddle.nn.GELU(),
                               mp_layers.RowParallelLinear(24, 16, has_bias=True, input_is_parallel=True))
    data = [paddle.randn([5, 16]) for _ in range(3)]
    for x in data:
        x.stop_gradient = False

    def step(store: WeightGradStore | None) -> list:
        net.clear_gradients()
        outs = []
        if store is not None:
            store.begin_step()
        for mb, x in enumerate(data):
            if store is None:
                outs.append(net(x))
                continue
            with store.capture(0, mb):
                outs.append(net(x))
        if store is None:
            for y in outs:
                y.square().sum().backward()
        else:
            for mb, y in enumerate(outs):
                store.input_backward(0, mb, lambda y=y: y.square().sum().backward())
            for mb in range(len(data)):
                store.weight_backward(0, mb)
            store.end_step()
        grads = [p.grad.numpy().copy() for p in net.parameters()] + [x.grad.numpy().copy() for x in data]
        for x in data:
            x.clear_gradient()
        return grads

    ref = step(None)
    store = WeightGradStore().bind([net])
    got = step(store)
    assert store.last.deferred == 2 * 3
    assert net[0].linear is paddle.nn.functional.linear  # restored
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(g, r)


# --- the interpreter in schedule-node mode (dualpipev with overlapped_forward_backward) ---

_NODE_ACTIONS = ("F0.0 F1.0 F0.1&B1.0 B0.0 F1.1 I1.1 F0.2 I0.1 W1.1 F1.2 I1.2 W1.2 W0.1 I0.2 W0.2")


def _node_program(model: paddle.nn.Layer, ids: paddle.Tensor, labels: paddle.Tensor, m: int,
                  recompute_chunk1: bool, pairs: list, losses: list, split: WeightGradStore):
    """A pp=1 V-placed StageProgram over overlap_gpt's Reference cut in two chunks (embedding
    and block 1; block 2 and the head): chunk 1 hands over in place and ends in the loss, so
    one process runs the whole V with no transfer, every chunk as schedule nodes."""
    from paddle.distributed.fleet.utils import recompute

    from examples.overlap_gpt import OverlapGPT
    from paddle_ext.pipeline.nodes import ScheduleChunk, ScheduleNode, loss_node
    from paddle_ext.pipeline.runtime.interpreter import StageProgram
    from paddle_ext.pipeline.runtime.node_mode import NodeChunks
    from paddle_ext.pipeline.runtime.slots import StageLayout

    rows = ids.shape[0] // m
    embed, (block1, block2), head = model.embed, model.blocks, model.head

    def mlp_node(block: paddle.nn.Layer, recomputed: bool) -> ScheduleNode:
        if not recomputed:
            return ScheduleNode(block.mlp, name="mlp")
        # re-run in the backward: in an F&B pair, under the capture of the other chunk's forward
        return ScheduleNode(lambda x: (recompute(lambda h: block.mlp((h, x[1]))[0], x[0]), x[1]), name="mlp")

    def schedule_chunk(chunk: int) -> ScheduleChunk:
        if chunk == 0:
            return ScheduleChunk([embed.build_schedule_node(), block1.build_schedule_node()])
        return ScheduleChunk([ScheduleNode(block2.attention, name="attention"), mlp_node(block2, recompute_chunk1),
                              head.build_schedule_node()])

    def make_loss_node(mb: int):
        node = loss_node(model.loss_fn)
        node.labels, node.scale_loss_factor = labels[mb * rows:(mb + 1) * rows], m
        return node

    def overlapped(*args, **kwargs):
        pairs.append(1)
        return OverlapGPT.overlapped_forward_backward(None, *args, **kwargs)

    chunks = NodeChunks(schedule_chunk, make_loss_node, lambda loss, _outputs, _mb: losses.append(loss.detach()),
                        overlapped)
    return StageProgram(StageLayout(rank=0, pp=1, vpp=2, placement="v"), chunks,
                        first_input=lambda mb: ids[mb * rows:(mb + 1) * rows], split=split)


@pytest.mark.parametrize("recompute_chunk1", [False, True])
def test_node_mode_splits_lone_and_paired_forwards_and_equals_plain_backward(recompute_chunk1: bool) -> None:
    """DualPipeV's shape on one process: a lone F and the forward half of an F&B pair
    (through overlapped_forward_backward) whose backwards are I's run captured; the I's
    run the node backward (the loss node's on chunk 1) with dW deferred to W; an I followed
    by its W is a whole backward. Losses and every gradient equal one plain backward per
    micro-batch bit for bit, with the matmuls of I0.1 and I1.1 really deferred. With
    chunk 1's MLP recomputed, B1.0's recompute runs inside the pair, under the capture of
    F0.1: its chunk-1 weights stay Paddle's (the capture takes only chunk 0's), and the
    recomputed MLP of I1.1 is not deferred either."""
    from examples.overlap_gpt import Reference
    from examples.tiny_gpt import batch
    from paddle_ext.pipeline.runtime.interpreter import Interpreter
    from paddle_ext.pipeline.schedule.ir import parse_action

    m, vocab, hidden, seq = 3, 32, 16, 8
    ids, labels = batch(0, 2 * m, seq, vocab)
    ref = Reference(vocab, hidden, seq, blocks=2)  # weights from layer ids: both models start equal
    ref_losses = []
    for mb in range(m):
        part = ref(ids[2 * mb:2 * mb + 2], labels[2 * mb:2 * mb + 2]) / m
        part.backward()
        ref_losses.append(part.numpy())

    model = Reference(vocab, hidden, seq, blocks=2)
    pairs: list = []
    losses: list = []
    store = WeightGradStore().bind([[model.embed, model.blocks[0]], [model.blocks[1], model.head]])
    program = _node_program(model, ids, labels, m, recompute_chunk1, pairs, losses, store)
    store.begin_step()
    interpreter = Interpreter(program, [parse_action(a) for a in _NODE_ACTIONS.split()])
    assert interpreter._split_keys == {(0, 1), (1, 1)}  # I1.2 and I0.2 are followed by their W
    interpreter.run()
    stats = store.end_step()

    assert pairs == [1]
    # I0.1: block 1's four Linears; I1.1: block 2's four (two when its MLP is recomputed)
    # and the head's matmul. Zero here means the run fell back to whole backwards.
    assert stats.deferred == (4 + 3 if recompute_chunk1 else 4 + 5), stats
    assert not stats.mixed and not stats.reordered and store.pending_bytes == 0
    np.testing.assert_array_equal(np.array([x.numpy() for x in losses]), np.array(ref_losses))
    want, got = dict(ref.named_parameters()), dict(model.named_parameters())
    assert want.keys() == got.keys()
    for name, p in want.items():
        assert (got[name].grad is None) == (p.grad is None), name  # the head's position table: none
        if p.grad is not None:
            np.testing.assert_array_equal(got[name].grad.numpy(), p.grad.numpy(), err_msg=name)


def test_pair_with_both_halves_in_one_chunk_is_not_captured() -> None:
    """The capture cannot tell such a pair's halves apart (both use the chunk's weights):
    the forward runs plain and its I computes every gradient."""
    from paddle_ext.pipeline.runtime.chunks import PlainChunks
    from paddle_ext.pipeline.runtime.interpreter import Interpreter, StageProgram
    from paddle_ext.pipeline.runtime.slots import StageLayout
    from paddle_ext.pipeline.schedule.ir import parse_action

    acts = [parse_action(a) for a in "F0.0 F0.1&B0.0 I0.1 F0.2 W0.1 I0.2 F0.3 W0.2".split()]
    program = StageProgram(StageLayout(rank=0, pp=2, vpp=1), PlainChunks(None, None, None), first_input=None)
    assert Interpreter(program, acts)._split_keys == {(0, 2)}
