"""Fused gradient buckets, the collective workers and the reducer's scheduling, in one
process (the gloo runs are tests/multiproc/test_grad_overlap.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import paddle
import pytest

from paddle_ext.comm.collectives import CollectiveError, InlineWorker, ThreadWorker, make_worker
from paddle_ext.pipeline.grad_buffers import build_buckets
from paddle_ext.pipeline.grad_sync import (
    ENV_BUCKET_MB,
    GradReducer,
    GradSyncError,
    GradSyncSettings,
    disable_optimizer_reduction,
)
from paddle_ext.pipeline.schedule.ir import B, GradSync


def _mlp(seed: int = 0, width: int = 8, layers: int = 3) -> paddle.nn.Layer:
    paddle.seed(seed)
    mods = []
    for _ in range(layers):
        mods += [paddle.nn.Linear(width, width), paddle.nn.Tanh()]
    return paddle.nn.Sequential(*mods)


def _copy(dst: paddle.nn.Layer, src: paddle.nn.Layer) -> None:
    for a, b in zip(dst.parameters(), src.parameters()):
        a.set_value(b)


# --- buckets ---------------------------------------------------------------------------

def test_buckets_follow_backward_order_size_owner_and_late_last():
    net = _mlp(width=4, layers=3)  # 3 x (weight 16 floats = 64 B, bias 4 floats = 16 B)
    params = list(net.parameters())
    late = [paddle.create_parameter([2, 2], "float32")]
    owners = {id(p): i % 2 for i, p in enumerate(params)}
    buckets = build_buckets([params], late, bucket_bytes=80, owner_of=lambda p: owners.get(id(p), 0))
    assert [b.index for b in buckets] == list(range(len(buckets)))
    assert buckets[-1].chunk is None and buckets[-1].slots[0].param is late[0]
    for b in buckets[:-1]:
        assert b.chunk == 0 and b.nbytes <= 80 or len(b.slots) == 1
        assert len({owners[id(s.param)] for s in b.slots}) == 1
        # contiguous regions in the buffer, in slot order
        assert [s.start for s in b.slots] == list(np.cumsum([0] + [s.numel for s in b.slots[:-1]]))
    # every parameter exactly once
    assert sorted(id(s.param) for b in buckets for s in b.slots) == sorted(map(id, params + late))
    # the first bucket holds the last layer's parameters (complete first in a backward)
    assert {id(s.param) for s in buckets[0].slots} <= {id(p) for p in params[-2:]}


def test_reduce_scatter_buckets_are_paddles_fused_comm_buffers():
    """split_param sharding: each bucket's buffer is the gradient buffer of Paddle's own
    FusedCommBuffer (what DygraphShardingOptimizerV2 collects), parameters at Paddle's padded
    offsets, their main_grads views of it, their values unchanged; a bucket holds one
    parameter dtype; shard() is this rank's slice; renew_slices() lets the optimizer's slices go."""
    import types

    import paddle_ext

    paddle_ext.enable()  # host_sharding: fleet's tensor fusion helper knows the host (3.x)
    try:
        paddle.seed(0)
        net = paddle.nn.Sequential(paddle.nn.Linear(3, 5), paddle.nn.Linear(5, 2))
        params = list(net.parameters())
        odd = paddle.create_parameter([3], "float16")  # float32 main_grad like the others
        for p in params + [odd]:
            p.main_grad = None  # MixPrecisionLayer's mark: float32 gradients in main_grad
        before = [p.numpy().copy() for p in params]
        group = types.SimpleNamespace(nranks=2, rank=1)
        buckets = build_buckets([params + [odd]], [], 1 << 20, reduce_scatter_group=group)
        assert sorted(len(b.slots) for b in buckets) == [1, 4]  # Paddle's buffer has one parameter dtype
        main = next(b for b in buckets if len(b.slots) == 4)
        views = main.comm_buffer._sharding_param_grad_view
        assert main.buffer is main.comm_buffer.grad_storage and main.owner is None
        assert "reduce-scattered" in main.label
        size = int(main.buffer.shape[0])
        assert size % 2 == 0 and size > sum(s.numel for s in main.slots)  # padded to split evenly
        for slot, want in zip(main.slots, before[::-1]):
            assert slot.start == views[slot.param.name]._index
            assert slot.param.main_grad.data_ptr() == slot.ptr  # the gradient is the buffer's region
            np.testing.assert_array_equal(slot.param.numpy(), want)  # moved into Paddle's buffer, same values
        mine = main.shard(1, 2)
        assert mine.data_ptr() == main.buffer._slice(size // 2, size).data_ptr()
        old = {name: v._slice_grad for name, v in views.items() if v._slice_grad is not None}
        assert old
        main.renew_slices()
        for name, tensor in old.items():
            assert not tensor._is_initialized() and views[name]._slice_grad._is_initialized()
            assert views[name]._slice_grad.data_ptr() == main.buffer._slice(
                views[name]._param_begin, views[name]._param_end).data_ptr()
        with pytest.raises(ValueError, match="exclude each other"):
            build_buckets([params], [], 1 << 20, owner_of=lambda p: 0, reduce_scatter_group=group)
    finally:
        paddle_ext.disable()


def test_a_parameter_larger_than_the_bucket_gets_one_of_its_own():
    big = paddle.create_parameter([64, 64], "float32")
    small = paddle.create_parameter([4], "float32")
    buckets = build_buckets([[small, big]], [], bucket_bytes=1024)
    assert sorted(len(b.slots) for b in buckets) == [1, 1]
    with pytest.raises(ValueError, match="positive"):
        build_buckets([[small]], [], bucket_bytes=0)


@pytest.mark.parametrize("set_to_zero", [True, False])
def test_grads_accumulate_in_the_buffer_bitwise_like_plain_accumulation(set_to_zero):
    m = 3
    net, ref = _mlp(1), _mlp(1)
    _copy(ref, net)
    (bucket,) = build_buckets([list(net.parameters())], [], bucket_bytes=1 << 20)
    for slot in bucket.slots:
        slot.param._register_backward_hook(lambda *_, s=slot: bucket.take(s, m))
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    ref_opt = paddle.optimizer.SGD(0.1, parameters=ref.parameters())
    pairs = dict(zip(map(id, net.parameters()), ref.parameters()))
    for step in range(3):
        bucket.reset(m)
        for mb in range(m):
            x = paddle.to_tensor(np.random.default_rng(10 * step + mb).standard_normal((2, 8)).astype("float32"))
            net(x).sum().backward()
            ref(x).sum().backward()
            assert bucket.todo == (m - mb - 1) * len(bucket.slots)
        for slot in bucket.slots:
            want = pairs[id(slot.param)].grad.numpy()
            assert np.array_equal(slot.param.grad.numpy(), want)
            assert slot.param.grad.data_ptr() == slot.ptr  # the gradient is the view
            start = slot.start
            assert np.array_equal(bucket.buffer.numpy()[start:start + slot.numel], want.ravel())
        bucket.learn(m)
        assert bucket.eligible
        opt.step()
        opt.clear_grad(set_to_zero)
        ref_opt.step()
        ref_opt.clear_grad(set_to_zero)
    for a, b in zip(net.parameters(), ref.parameters()):
        assert np.array_equal(a.numpy(), b.numpy())


def test_seal_zeroes_and_attaches_parameters_without_a_gradient():
    used, unused = paddle.nn.Linear(4, 4), paddle.nn.Linear(4, 4)
    (bucket,) = build_buckets([list(used.parameters()) + list(unused.parameters())], [], 1 << 20)
    bucket.buffer.set_value(paddle.full([bucket.numel], 7.0))
    bucket.reset(1)
    used(paddle.ones([1, 4])).sum().backward()
    used_ids = {id(p) for p in used.parameters()}
    for slot in bucket.slots:
        if id(slot.param) in used_ids:
            bucket.take(slot, 1)
    bucket.seal()
    for slot in bucket.slots:
        if id(slot.param) not in used_ids:
            assert slot.param.grad is not None and not slot.param.grad.numpy().any()
    bucket.learn(1)
    assert not bucket.eligible  # the unused ones had no gradient: no early launch for it


def test_main_grad_parameters_get_a_float32_view():
    p = paddle.create_parameter([3, 3], "float32")
    p.main_grad = None
    (bucket,) = build_buckets([[p]], [], 1 << 20)
    assert bucket.dtype == paddle.float32 and bucket.slots[0].main_grad
    p.main_grad = paddle.ones([3, 3])
    bucket.reset(1)
    bucket.take(bucket.slots[0], 1)
    assert p.main_grad.data_ptr() == bucket.slots[0].ptr
    assert np.array_equal(bucket.buffer.numpy(), np.ones(9, "float32"))


# --- workers -----------------------------------------------------------------------------

def test_thread_worker_runs_in_submission_order_and_after_dependencies_hold():
    log, lock = [], threading.Lock()

    def op(name, delay=0.0):
        def run():
            time.sleep(delay)
            with lock:
                log.append(name)
        return run

    first, second = ThreadWorker("sharding"), ThreadWorker("dp")
    try:
        a = first.submit("a", op("a", 0.05))
        b = second.submit("b", op("b"), after=a)  # must wait for a although it is free
        first.submit("c", op("c"))
        second.wait_all()
        first.wait_all()
        assert log.index("a") < log.index("b") and log.index("a") < log.index("c")
        assert a.started <= a.finished <= b.started
    finally:
        first.close()
        second.close()


def test_a_failure_fails_the_later_tickets_of_its_worker_without_running_them():
    ran = []
    worker = ThreadWorker("dp")
    try:
        worker.submit("bad", lambda: 1 / 0)
        worker.submit("next", lambda: ran.append(1))
        with pytest.raises(CollectiveError, match="bad failed: ZeroDivisionError"):
            worker.wait_all()
        assert not ran
        with pytest.raises(CollectiveError, match="not run: the earlier bad"):
            worker.tickets[1].wait()
    finally:
        worker.close()


def test_inline_worker_runs_only_when_drained_in_order():
    log = []
    sharding, dp = InlineWorker("sharding"), InlineWorker("dp")
    a = sharding.submit("a", lambda: log.append("a"))
    dp.submit("b", lambda: log.append("b"), after=a)
    assert log == []
    sharding.wait_all()
    dp.wait_all()
    assert log == ["a", "b"]
    out_of_order = InlineWorker("x")
    pending = InlineWorker("y").submit("p", lambda: None)
    out_of_order.submit("q", lambda: None, after=pending)
    with pytest.raises(CollectiveError, match="must be drained before"):
        out_of_order.wait_all()


def test_make_worker_picks_thread_inline_and_stream():
    assert isinstance(make_worker("dp", "cpu", overlap=False), InlineWorker)
    worker = make_worker("dp", "cpu", overlap=True)
    assert isinstance(worker, ThreadWorker)
    worker.close()


def test_stream_worker_orders_with_events_on_its_own_stream(monkeypatch):
    """The GPU path's logic with recording fakes (no device here): the communication
    stream waits for an event recorded on the compute stream, the collective runs under
    the stream guard, a `done` event is recorded after it, `after` makes this stream wait
    for the other ticket's `done`, and wait_all makes the compute stream wait for all."""
    from paddle_ext import devices
    from paddle_ext.comm.collectives import StreamWorker

    log = []

    class Stream:
        def __init__(self, name):
            self.name = name

    compute = Stream("compute")
    current = [compute]
    made = iter(range(100))

    class Event:
        def __init__(self):
            self.id = next(made)

        def record(self, stream):
            log.append(("record", self.id, stream.name))

        def wait(self, stream):
            log.append(("wait", self.id, stream.name))

    class Guard:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            current.append(self.stream)

        def __exit__(self, *exc):
            current.pop()

    streams = iter([Stream("comm-sharding"), Stream("comm-dp")])
    monkeypatch.setattr(devices, "new_stream", lambda: next(streams))
    monkeypatch.setattr(devices, "current_stream", lambda: current[-1])
    monkeypatch.setattr(devices, "stream_guard", Guard)
    sharding, dp = StreamWorker("sharding", Event), StreamWorker("dp", Event)
    first = sharding.submit("b0", lambda: log.append(("reduce", current[-1].name)))
    dp.submit("b0", lambda: log.append(("all_reduce", current[-1].name)), after=first)
    dp.wait_all()
    assert log == [
        ("record", 0, "compute"), ("wait", 0, "comm-sharding"),     # grads complete on compute
        ("reduce", "comm-sharding"), ("record", 1, "comm-sharding"),  # done
        ("record", 2, "compute"), ("wait", 2, "comm-dp"),
        ("wait", 1, "comm-dp"),                                       # after the sharding reduce
        ("all_reduce", "comm-dp"), ("record", 3, "comm-dp"),
        ("wait", 3, "compute"),                                       # before the optimizer step
    ]


# --- settings and the optimizer ------------------------------------------------------------

def test_bucket_size_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_BUCKET_MB, "0.5")
    assert GradSyncSettings().bucket_bytes == 512 * 1024
    monkeypatch.setenv(ENV_BUCKET_MB, "lots")
    with pytest.raises(ValueError, match=ENV_BUCKET_MB):
        GradSyncSettings()
    monkeypatch.delenv(ENV_BUCKET_MB)
    assert GradSyncSettings().bucket_bytes == 128 * 1024 * 1024
    with pytest.raises(ValueError, match="positive"):
        GradSyncSettings(bucket_mb=0)


def test_settings_from_strategy_pp_configs_and_paddlenlp_string():
    import paddle_ext
    from paddle_ext.pipeline.engine import PipelineSettings

    paddle_ext.enable()
    try:
        strategy = paddle.distributed.fleet.DistributedStrategy()
        strategy.hybrid_configs = {"pp_configs": "enable_dp_comm_overlap enable_delay_scale_loss"}
        strategy.pipeline_configs = {"accumulate_steps": 4, "micro_batch_size": 1}
        settings = PipelineSettings.from_strategy(strategy)
        assert settings.grad_sync.dp_overlap and not settings.grad_sync.sharding_overlap
        assert settings.delay_scale_loss
        strategy.hybrid_configs = {"pp_configs": {"sharding_comm_overlap": True}}
        assert PipelineSettings.from_strategy(strategy).grad_sync.sharding_overlap
    finally:
        paddle_ext.disable()


def test_the_hybrid_optimizers_own_reduction_is_switched_off():
    class Inner:
        def __init__(self):
            self._param2rank = {}

    class Hybrid:
        def __init__(self):
            self._inner_opt = Inner()
            self._dp_enable = self._sharding_enable = self._sep_enable = True

        def __getattr__(self, item):  # like HybridParallelOptimizer
            return getattr(self._inner_opt, item)

    opt = Hybrid()
    disable_optimizer_reduction(opt)
    # as fleet.distributed_optimizer does under dp_comm_overlap (sep with it: the engine
    # reduces over dp x sep)
    assert not opt._dp_enable and not opt._sharding_enable and not opt._sep_enable
    disable_optimizer_reduction(paddle.optimizer.SGD(0.1, parameters=_mlp().parameters()))  # no-op


# --- the reducer, with a fake dp group --------------------------------------------------------

class _Task:
    def wait(self):
        return True


class _FakeProcessGroup:
    """`nranks` identical peers: an all-reduce multiplies the buffer by nranks."""

    def __init__(self, nranks=2):
        self.calls = []
        self.nranks = nranks

    def all_reduce(self, tensor, op, sync_op):
        self.calls.append((time.perf_counter(), tensor.numpy().copy()))
        tensor.scale_(float(self.nranks))
        return _Task()


class _FakeGroup:
    def __init__(self, nranks=2):
        self.process_group = _FakeProcessGroup(nranks)
        self.nranks = nranks


class _FakeHcg:
    def __init__(self):
        self.group = _FakeGroup()

    def get_data_parallel_world_size(self):
        return 2

    def get_sharding_parallel_world_size(self):
        return 1

    def get_data_parallel_group(self):
        return self.group


class _Layers(paddle.nn.Layer):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.shared_layers = {}

    def get_num_virtual_stages(self):
        return 1


@pytest.mark.parametrize("overlap", [False, True])
def test_reducer_scales_once_launches_early_after_learning_and_refuses_late_grads(monkeypatch, overlap):
    m = 2
    net, ref = _mlp(2), _mlp(2)
    _copy(ref, net)
    layers = _Layers(net)
    hcg = _FakeHcg()
    reducer = GradReducer(layers, hcg, m, delay_scale_loss=True,
                          settings=GradSyncSettings(dp_overlap=overlap, bucket_mb=1e-4))
    actions = [B(0, 0), B(0, 1), GradSync(0)]
    pg = hcg.group.process_group
    pairs = dict(zip(map(id, net.parameters()), ref.parameters()))
    try:
        for step in range(2):
            reducer.begin_step(None, actions)
            for mb in range(m):
                x = paddle.to_tensor(np.random.default_rng(step * m + mb).standard_normal((2, 8)).astype("float32"))
                net(x).sum().backward()
                ref(x).sum().backward()
                if step == 1 and mb == m - 1:
                    # learned in step 0: every bucket handed over inside the last backward
                    assert all(b.submitted for b in reducer.order)
            handed_before_gs = sum(b.submitted for b in reducer.order)
            reducer.on_grad_sync(0)
            if not overlap:
                assert pg.calls == []  # overlap off: everything runs in finish()
            reducer.finish()
            assert len(pg.calls) == len(reducer.order)
            early = [r.early for r in reducer.last.records]
            assert all(early) if step == 1 else not any(early)
            assert handed_before_gs == (len(reducer.order) if step == 1 else 0)
            for p in net.parameters():
                want = pairs[id(p)].grad.numpy()
                # x2 (the fake peer) then x 1/(2 * M): one scale, exact for M = 2
                assert np.array_equal(p.grad.numpy(), want / 2), p.name
            pg.calls.clear()
            net.clear_gradients()
            ref.clear_gradients()
        # a parameter whose bucket was launched gets one more gradient: refused
        if overlap:
            reducer.begin_step(None, actions)
            x = paddle.ones([2, 8])
            for _ in range(m + 1):  # one backward too many: the buckets were launched after m
                net(x).sum().backward()
            with pytest.raises(GradSyncError, match="received a gradient after its bucket"):
                reducer.finish()
    finally:
        reducer.close()


class _FakeSepHcg(_FakeHcg):
    """dp 2 x sep 2 (x sharding): fleet's dp x sep group has 4 identical peers."""

    def __init__(self, sharding=1):
        super().__init__()
        self.dp_sep_group = _FakeGroup(4)
        self.sharding = sharding

    def get_sep_parallel_world_size(self):
        return 2

    def get_dp_sep_parallel_group(self):
        return self.dp_sep_group

    def get_data_parallel_group(self):
        raise AssertionError("with sep the engine reduces over fleet's dp x sep group")

    def get_sharding_parallel_world_size(self):
        return self.sharding

    def get_sharding_parallel_rank(self):
        return 0

    def get_sharding_parallel_group(self):
        return _FakeGroup(self.sharding)


def test_dp_overlap_with_sep_reduces_over_dp_x_sep_scaled_by_its_size():
    """fleet's PipelineParallel under dp_comm_overlap with sep: FusedCommBuffers all-reduce
    over the dp x sep group and scale by its size (the optimizer's own path, without
    overlap, scales by 1 / dp: the engine then defers)."""
    m = 2
    net, ref = _mlp(2), _mlp(2)
    _copy(ref, net)
    hcg = _FakeSepHcg()
    actions = [B(0, 0), B(0, 1), GradSync(0)]
    off = GradReducer(_Layers(net), hcg, m, delay_scale_loss=True, settings=GradSyncSettings())
    off.begin_step(None, actions)
    assert off.deferred
    off.close()
    reducer = GradReducer(_Layers(net), hcg, m, delay_scale_loss=True,
                          settings=GradSyncSettings(dp_overlap=True, bucket_mb=1e-4))
    try:
        reducer.begin_step(None, actions)
        assert not reducer.deferred
        for mb in range(m):
            x = paddle.to_tensor(np.random.default_rng(mb).standard_normal((2, 8)).astype("float32"))
            net(x).sum().backward()
            ref(x).sum().backward()
        reducer.on_grad_sync(0)
        reducer.finish()
        assert len(hcg.dp_sep_group.process_group.calls) == len(reducer.order)
        pairs = dict(zip(map(id, net.parameters()), ref.parameters()))
        for p in net.parameters():
            # x4 (the dp x sep peers) then x 1/(dp * sep * M) = 1/8: exact
            assert np.array_equal(p.grad.numpy(), pairs[id(p)].grad.numpy() / 2), p.name
    finally:
        reducer.close()


def test_sharding_overlap_with_sep_is_refused_as_fleet_refuses_it():
    reducer = GradReducer(_Layers(_mlp(1)), _FakeSepHcg(sharding=2), 2, delay_scale_loss=False,
                          settings=GradSyncSettings(sharding_overlap=True))
    try:
        with pytest.raises(GradSyncError, match=r"sharding_comm_overlap = True with sep_degree = 2: sep parallel "
                                                r"can not coexist with sharding_comm_overlap"):
            reducer.begin_step(None, [GradSync(0)])
    finally:
        reducer.close()


@pytest.mark.parametrize("which", ["dp_overlap", "sharding_overlap"])
def test_overlap_without_its_group_is_refused_as_fleet_asserts_it(which):
    """fleet's PipelineParallel asserts use_data_parallel (use_sharding_parallel) under
    dp_comm_overlap (sharding_comm_overlap): the plugin's error is an AssertionError too,
    and a ValueError naming the key."""

    class Hcg(_FakeHcg):
        def get_data_parallel_world_size(self):
            return 1

    name = "dp_comm_overlap" if which == "dp_overlap" else "sharding_comm_overlap"
    for catch in (AssertionError, ValueError):
        with pytest.raises(catch, match=rf"pp_configs.{name} = True needs"):
            GradReducer.for_engine(_Layers(_mlp(1)), Hcg(), 2, False, GradSyncSettings(**{which: True}))


class _DpShardingHcg(_FakeHcg):
    """dp 2 x sharding 2, no sep."""

    def get_sharding_parallel_world_size(self):
        return 2

    def get_sharding_parallel_rank(self):
        return 0

    def get_sharding_parallel_group(self):
        return _FakeGroup(2)


class DygraphShardingOptimizerV2:  # found by its name, as Paddle's class
    """sharding_configs.split_param's optimizer, built without (pp_overlap False) or with
    the strategy's pp_configs.sharding_comm_overlap."""

    def __init__(self, pp_overlap):
        self.pp_overlap = pp_overlap


class _Hybrid:
    def __init__(self, inner):
        self._inner_opt = inner
        self._dp_enable = self._sharding_enable = True


def test_split_param_without_the_pipelines_buffers_is_reduced_by_the_optimizer_and_refuses_overlap():
    """A DygraphShardingOptimizerV2 that kept buffers of its own reduces them at its step:
    the engine reduces nothing and leaves the optimizer's reduction on; asked to overlap it
    (dp_comm_overlap), the engine refuses, naming the strategy key that gives it the buffers.
    (Paddle's own path there fails too, at the first backward: the optimizer, built after the
    pipeline, relinks every gradient into its buffers, and the pipeline's dp buffers raise
    ValueError on the changed gradient address.)"""
    plain = GradReducer(_Layers(_mlp(1)), _DpShardingHcg(), 2, delay_scale_loss=False, settings=GradSyncSettings())
    overlapped = GradReducer(_Layers(_mlp(1)), _DpShardingHcg(), 2, delay_scale_loss=False,
                             settings=GradSyncSettings(dp_overlap=True))
    try:
        optimizer = _Hybrid(DygraphShardingOptimizerV2(pp_overlap=False))
        plain.begin_step(optimizer, [GradSync(0)])
        assert plain.deferred and plain.buckets is None
        assert optimizer._dp_enable and optimizer._sharding_enable
        with pytest.raises(GradSyncError, match=r"dp_comm_overlap / sharding_comm_overlap with "
                           r"sharding_configs.split_param = True: .* set pp_configs.sharding_comm_overlap = True "
                           r"in the strategy before fleet.init"):
            overlapped.begin_step(optimizer, [GradSync(0)])
    finally:
        plain.close()
        overlapped.close()
