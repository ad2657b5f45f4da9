"""Each of the interpreter's modes alone, in one process: the links (blocking, eager on
threads, eager on TCP streams) and the chunk runners (plain, schedule nodes, nodes with
the overlapped F&B pair).

Two pipeline ranks run as two threads, each rank's interpreter over the real lowered
schedule: blocking and threads over a loopback transport (P2P with its raw send and
receive on in-process queues; everything above them, headers included, is the real
transport), streams over a real connected socket pair (stream_exchange.py whole). Losses and every
gradient must equal a single-process run of the same layers bit for bit: the reference
runs the micro-batches one after the other, each backward accumulating in the order
every stage's backwards run."""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any, Callable

import numpy as np
import paddle
import pytest

from paddle_ext.pipeline import nodes
from paddle_ext.pipeline.runtime.chunks import PlainChunks
from paddle_ext.pipeline.runtime.interpreter import Interpreter, PipelineStepError, StageProgram
from paddle_ext.pipeline.runtime.links import BlockingLinks, EagerLinks
from paddle_ext.pipeline.runtime.node_mode import NodeChunks
from paddle_ext.pipeline.runtime.slots import StageLayout
from paddle_ext.pipeline.runtime.stream_exchange import StreamP2P
from paddle_ext.pipeline.runtime.streams import Stream
from paddle_ext.pipeline.runtime.transport import P2P
from paddle_ext.pipeline.schedule import generate, lower

PP, M, ROWS, WIDTH = 2, 4, 3, 5


class LoopbackP2P(P2P):
    """P2P between threads of this process: a send puts a copy on the (sender, receiver)
    queue, a receive takes it into the receiving tensor."""

    def __init__(self, rank: int, queues: dict) -> None:
        super().__init__({})
        self.rank, self.queues = rank, queues

    def _send(self, tensor: paddle.Tensor, peer: int, what: str) -> None:
        self.queues[(self.rank, peer)].put(tensor.numpy().copy())

    def _recv(self, tensor: paddle.Tensor, peer: int, what: str) -> None:
        data = self.queues[(peer, self.rank)].get(timeout=60)
        paddle.assign(paddle.to_tensor(data, dtype=tensor.dtype), output=tensor)


def make_stages(vpp: int) -> list[paddle.nn.Layer]:
    """PP * vpp stages of Linear + tanh with weights from a fixed numpy generator."""
    rng = np.random.default_rng(7)
    stages = []
    for _ in range(PP * vpp):
        layer = paddle.nn.Linear(WIDTH, WIDTH)
        layer.weight.set_value(rng.standard_normal((WIDTH, WIDTH)).astype("float32"))
        layer.bias.set_value(rng.standard_normal(WIDTH).astype("float32"))
        stages.append(layer)
    return stages


def data() -> tuple[paddle.Tensor, paddle.Tensor]:
    rng = np.random.default_rng(11)
    x = paddle.to_tensor(rng.standard_normal((M * ROWS, WIDTH)).astype("float32"))
    y = paddle.to_tensor(rng.standard_normal((M * ROWS, WIDTH)).astype("float32"))
    return x, y


def mse(out: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
    return ((out - labels) ** 2).mean()


def reference(vpp: int) -> tuple[list, list]:
    stages = make_stages(vpp)
    x, y = data()
    losses = []
    for mb in range(M):
        h = x[mb * ROWS:(mb + 1) * ROWS]
        for stage in stages:
            h = paddle.tanh(stage(h))
        loss = mse(h, y[mb * ROWS:(mb + 1) * ROWS]) / M
        loss.backward()
        losses.append(loss.numpy())
    return losses, [(s.weight.grad.numpy(), s.bias.grad.numpy()) for s in stages]


def stage_fn(layer: paddle.nn.Layer) -> Callable[[Any], Any]:
    return lambda h: paddle.tanh(layer(h))


def plain_runner(rank: int, vpp: int, stages: list, labels: Callable, losses: list) -> PlainChunks:
    def loss(out: paddle.Tensor, mb: int) -> paddle.Tensor:
        value = mse(out, labels(mb)) / M
        losses.append((mb, value.numpy()))
        return value

    return PlainChunks(lambda h, chunk: stage_fn(stages[chunk * PP + rank])(h), loss, lambda value: value.backward())


def node_runner(rank: int, vpp: int, stages: list, labels: Callable, losses: list, pairs: list | None) -> NodeChunks:
    from examples.overlap_gpt import OverlapGPT

    def loss_node(mb: int) -> Any:
        node = nodes.loss_node(mse)
        node.labels, node.scale_loss_factor = labels(mb), M
        return node

    def chunk(c: int) -> Any:
        return nodes.ScheduleChunk([nodes.ScheduleNode(stage_fn(stages[c * PP + rank]), name=f"stage{c}")])

    def overlapped(*args: Any, **kwargs: Any) -> Any:
        pairs.append(rank)
        return OverlapGPT.overlapped_forward_backward(None, *args, **kwargs)

    return NodeChunks(chunk, loss_node, lambda value, _outputs, mb: losses.append((mb, value.numpy())),
                      overlapped if pairs is not None else None)


def run_pipeline(links: str, runner: str, vpp: int) -> tuple[list, list]:
    stages = make_stages(vpp)
    x, y = data()
    kind = ("1f1b" if vpp == 1 else "interleaved") + ("-overlap" if runner == "pair" else "")
    schedule = lower(generate(PP, vpp, M, kind), async_p2p=links != "blocking")
    queues = {(a, b): queue.Queue() for a in range(PP) for b in range(PP) if a != b}
    ends = socket.socketpair()  # rank 0's and rank 1's end of their one stream
    losses: list = []
    errors: list = []
    pairs: list = []

    def rank_main(rank: int) -> None:
        try:
            p2p = LoopbackP2P(rank, queues)
            labels = lambda mb: y[mb * ROWS:(mb + 1) * ROWS]  # noqa: E731
            chunks = (plain_runner(rank, vpp, stages, labels, losses) if runner == "plain"
                      else node_runner(rank, vpp, stages, labels, losses, pairs if runner == "pair" else None))
            program = StageProgram(StageLayout(rank, PP, vpp), chunks,
                                   first_input=lambda mb: x[mb * ROWS:(mb + 1) * ROWS])
            way = {"blocking": lambda: BlockingLinks(p2p), "threads": lambda: EagerLinks.on_threads(p2p, p2p),
                   "streams": lambda: EagerLinks.on_streams(StreamP2P({1 - rank: Stream(ends[rank], "peer")}))}[links]()
            Interpreter(program, schedule.ranks[rank], way).run()
        except BaseException as err:  # the test thread raises it
            errors.append(err)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(PP)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    if errors:
        raise errors[0]
    want_pairs = sum(type(a).__name__ == "FB" for acts in schedule.ranks for a in acts)
    assert len(pairs) == want_pairs and (want_pairs > 0) == (runner == "pair"), (pairs, want_pairs)
    return [v for _, v in sorted(losses, key=lambda e: e[0])], \
        [(s.weight.grad.numpy(), s.bias.grad.numpy()) for s in stages]


@pytest.mark.parametrize("links", ["blocking", "threads", "streams"])
@pytest.mark.parametrize("runner, vpp", [("plain", 1), ("plain", 2), ("nodes", 1), ("pair", 1), ("pair", 2)])
def test_each_links_and_chunk_runner_equals_one_process(links: str, runner: str, vpp: int) -> None:
    want_losses, want_grads = reference(vpp)
    got_losses, got_grads = run_pipeline(links, runner, vpp)
    np.testing.assert_array_equal(np.array(got_losses), np.array(want_losses))
    for s, ((gw, gb), (ww, wb)) in enumerate(zip(got_grads, want_grads)):
        np.testing.assert_array_equal(gw, ww, err_msg=f"stage {s} weight")
        np.testing.assert_array_equal(gb, wb, err_msg=f"stage {s} bias")


def test_registered_function_runs_its_action_type() -> None:
    """Interpreter.register: a function for an action type replaces the interpreter's own
    (node mode registers its overlapped pair so)."""
    from paddle_ext.pipeline.schedule.ir import parse_action

    seen: list = []
    program = StageProgram(StageLayout(0, 1, 1), PlainChunks(None, None, None), first_input=None)
    interpreter = Interpreter(program, [parse_action("GS0")])
    interpreter.register(type(parse_action("GS0")), lambda run, action: seen.append((run, str(action))))
    interpreter.run()
    assert seen == [(interpreter, "GS0")]


def test_a_failing_action_is_named_with_its_position_in_either_links() -> None:
    for way in (BlockingLinks(None), EagerLinks.on_threads(None, None), EagerLinks.on_streams(StreamP2P({}))):
        def boom(h: Any, chunk: int) -> Any:
            raise ValueError("injected")

        program = StageProgram(StageLayout(0, 1, 1), PlainChunks(boom, None, None), first_input=lambda mb: None)
        from paddle_ext.pipeline.schedule.ir import parse_action

        with pytest.raises(PipelineStepError, match=r"rank 0: action F0\.0 \(position 0 of 2 .*ValueError: injected"):
            Interpreter(program, [parse_action("F0.0"), parse_action("B0.0")], way).run()


MODE_NAMES = {"BlockingLinks", "EagerLinks", "CommThread", "StreamExchange", "PlainChunks", "NodeChunks", "OverlappedPair",
              "comm", "uses_nodes", "schedule_chunk", "loss_node", "overlapped_forward_backward", "async_links"}


def mode_branches(source: str) -> list[str]:
    """Where `source` asks which links or which chunk runner it has: an if / conditional /
    isinstance whose test names one of their classes or members (MODE_NAMES)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            tests.append(node)
        for test in tests:
            names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
            found += [f"line {test.lineno}: {name}" for name in sorted(names & MODE_NAMES)]
    return found


def test_the_interpreter_never_asks_which_links_or_chunk_runner_it_has() -> None:
    import inspect

    from paddle_ext.pipeline.runtime import interpreter

    assert mode_branches(inspect.getsource(interpreter)) == []
    # the check itself finds such a branch
    assert mode_branches("if self.comm is not None:\n    pass\nx = isinstance(c, NodeChunks)\n") == [
        "line 1: comm", "line 3: NodeChunks"]
