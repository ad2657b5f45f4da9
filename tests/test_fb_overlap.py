"""Forward/backward overlap scheduler, single process: how it is switched on (pp_configs
and the PaddleNLP string, through fleet.init's copy of the strategy), the schedule nodes
(Paddle's on 3.1+, paddle_ext's elsewhere, the same behaviour), and the fb_overlap unit."""

import copy
import sys

import numpy as np
import paddle
import paddle.distributed.fleet as fleet
import pytest

import paddle_ext
from examples.overlap_gpt import LMLoss, Reference, TiedEmbedding, TransformerBlock
from examples.tiny_gpt import batch
from paddle_ext import compat, upstream
from paddle_ext.config import parse_pipeline_parallel_config, pp_config
from paddle_ext.patches import series
from paddle_ext.pipeline import nodes
from paddle_ext.pipeline.engine import PipelineSettings
from paddle_ext.pipeline.runtime import schedule_nodes
from paddle_ext.pipeline.runtime.links import P2PAsyncHandle


@pytest.fixture
def enabled():
    paddle_ext.enable()
    yield
    paddle_ext.disable()


def strategy_with(pp_configs):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2, "pp_configs": pp_configs}
    strategy.pipeline_configs = {"accumulate_steps": 5, "micro_batch_size": 2}
    return strategy


def test_pipeline_parallel_config_words():
    assert parse_pipeline_parallel_config("forward_backward_overlap_scheduler enable_overlap_p2p_comm") == {
        "forward_backward_overlap_scheduler": True, "overlap_p2p_comm": True}
    assert parse_pipeline_parallel_config("enable_delay_scale_loss,disable_batch_p2p_comm , "
                                          "disable_partial_send_recv") == {
        "delay_scale_loss": True, "use_batch_p2p_comm": False}
    assert parse_pipeline_parallel_config("") == {}
    with pytest.raises(ValueError, match=r"unknown pipeline_parallel_config words \['overlap'\]"):
        parse_pipeline_parallel_config("forward_backward_overlap_scheduler overlap")


@pytest.mark.parametrize("pp_configs", [
    {"forward_backward_overlap_scheduler": True, "overlap_p2p_comm": True},
    "forward_backward_overlap_scheduler enable_overlap_p2p_comm",
])
def test_switched_on_by_pp_configs_or_the_paddlenlp_string_through_fleet_init(enabled, pp_configs):
    strategy = strategy_with(pp_configs)
    # fleet.init keeps a deep copy of the strategy: the keys Paddle 2.6's protobuf lacks
    # must travel with it.
    for s in (strategy, copy.deepcopy(strategy)):
        assert pp_config(s, "forward_backward_overlap_scheduler") is True
        assert pp_config(s, "overlap_p2p_comm") is True
        settings = PipelineSettings.from_strategy(s)
        assert settings.fb_overlap and settings.overlap_p2p
    assert not PipelineSettings.from_strategy(strategy_with({})).fb_overlap


def test_schedule_node_classes_come_from_one_place():
    """Paddle's classes from 3.3 on; paddle_ext's on 2.6 and 3.0 (none there) and on 3.1 / 3.2
    (their backward wants a gradient for every output)."""
    upstream = compat.upstream_schedule_node_classes()
    if compat.paddle_version()[:2] >= (3, 3):
        assert upstream is not None and (nodes.ScheduleNode, nodes.ScheduleChunk) == upstream
    else:
        assert upstream is None
        assert nodes.ScheduleNode is schedule_nodes.ScheduleNode
    assert nodes.UPSTREAM == (upstream is not None)


def _grads(model):
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("impl", ["selected", "paddle_ext"])
def test_nodes_give_the_whole_graphs_loss_and_grads_bitwise(impl):
    """The model split into per-node autograd islands (embedding, attention, MLP, head,
    loss) against one autograd graph, with a scaled loss as under a GradScaler."""
    node_cls, chunk_cls = ((nodes.ScheduleNode, nodes.ScheduleChunk) if impl == "selected"
                           else (schedule_nodes.ScheduleNode, schedule_nodes.ScheduleChunk))
    ids, labels = batch(0, 4, 8, 32)
    whole = Reference(32, 16, 8, blocks=2)
    loss = whole(ids, labels) / 3
    (loss * 1024.0).backward()
    split = Reference(32, 16, 8, blocks=2)

    def block_chunk(b):
        return chunk_cls([node_cls(b.attention, "attention"), node_cls(b.mlp, "mlp")])

    chunk = chunk_cls([node_cls(split.embed.forward)] + [block_chunk(b) for b in split.blocks]
                      + [node_cls(split.head.forward)])
    loss_node = node_cls(split.loss_fn.forward, "loss")
    loss_node.labels, loss_node.scale_loss_factor = labels, 3
    out = chunk.forward(ids)
    node_loss = loss_node.forward(out)

    class Scaler:
        def scale(self, x):
            return x * 1024.0

    input_grads = chunk.backward(loss_node.backward(scaler=Scaler()))
    assert np.array_equal(node_loss.numpy(), loss.numpy())
    assert input_grads == (None,)  # token ids need no gradient
    g1, g2 = _grads(whole), _grads(split)
    assert g1.keys() == g2.keys() and all(np.array_equal(g1[k], g2[k]) for k in g1)
    assert loss_node.labels is None and loss_node.inputs is None  # state released


def test_node_backward_returns_one_gradient_per_input():
    block = TransformerBlock(16, 2, layer_id=1)
    hidden = paddle.randn([2, 8, 16])
    hidden.stop_gradient = False
    positions = paddle.arange(8, dtype="int64").unsqueeze(0).expand([2, 8])
    node = block.build_schedule_node()
    out = node.forward((hidden, positions))
    assert isinstance(out, tuple) and out[1] is not None
    grads = node.backward((paddle.ones([2, 8, 16]),))
    assert len(grads) == 2 and grads[1] is None and list(grads[0].shape) == [2, 8, 16]
    assert TiedEmbedding(32, 16, 8).build_schedule_node().name == "tied_embedding0"
    assert LMLoss().build_schedule_node().name == "lm_loss"


def test_plugin_nodes_reject_what_they_cannot_pair():
    node = schedule_nodes.ScheduleNode(lambda x: (x * 2, x * 3), "two")
    x = paddle.ones([2])
    x.stop_gradient = False
    node.forward(x)
    with pytest.raises(ValueError, match="1 output gradients for 2 outputs"):
        node.backward((paddle.ones([2]),))
    with pytest.raises(TypeError, match="ScheduleChunk takes ScheduleNode"):
        schedule_nodes.ScheduleChunk([lambda x: x])


def test_fb_overlap_unit_installs_upstreams_names(enabled):
    meta_parallel = upstream.meta_parallel_module()
    layer_cls = upstream.pipeline_layer_class()
    from paddle.distributed.fleet.meta_parallel import (  # as upstream code does
        ScheduleChunk,
        ScheduleNode,
    )

    paddle_has_them = compat.paddle_version()[:2] >= (3, 1)
    if paddle_has_them and compat.upstream_schedule_node_classes() is None:
        # 3.1 / 3.2: Paddle's own classes stay under Paddle's names (their backward's contract
        # is not 3.3's, and the unit changes no answer Paddle gives); the engine builds its own
        assert ScheduleNode is not nodes.ScheduleNode and ScheduleNode.__module__.startswith("paddle.")
    else:
        assert (ScheduleNode, ScheduleChunk) == (nodes.ScheduleNode, nodes.ScheduleChunk)
    installed = layer_cls.get_schedule_chunk
    assert series().installed_by(installed) == "fb_overlap"
    paddle_ext.disable()
    if not paddle_has_them:
        assert not hasattr(meta_parallel, "ScheduleNode") and not hasattr(layer_cls, "get_schedule_chunk")
    else:
        assert layer_cls.get_schedule_chunk is not installed


def test_async_handle_has_upstreams_methods_and_the_prs_spelling():
    calls = []
    handle = P2PAsyncHandle(lambda: calls.append("fw"), lambda t: calls.append(("fs", t)),
                            lambda: calls.append("bw"), lambda g: calls.append(("bs", g)))
    handle.forward_handle_wait()
    handle.forward_async_comm("out")
    handle.backward_handle_wait()
    handle.backwatd_async_comm("grads")  # the spelling in #71995's description
    assert calls == ["fw", ("fs", "out"), "bw", ("bs", "grads")]
    assert handle.forward_waited and handle.forward_sent and handle.backward_waited and handle.backward_sent


def test_the_schedule_layer_still_imports_no_paddle():
    import subprocess

    code = ("import sys; import paddle_ext.pipeline.schedule as s; "
            "s.overlap(s.generate(2, 2, 4)); assert 'paddle' not in sys.modules, 'paddle imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
