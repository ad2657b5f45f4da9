"""The communication tracer on a real one-rank gloo group, and its settings."""

import json
import os
import socket

import paddle
import pytest
from paddle.base import core

from paddle_ext.comm import debug, trace
from paddle_ext.comm.settings import CommSettings, from_source
from paddle_ext.comm.trace import CommTracer, chrome_trace, traced_method


@pytest.fixture(scope="module")
def gloo_group():
    """A real ProcessGroupGloo of one rank (its own TCPStore); one per process, as
    Paddle keys its communication contexts by the group id."""
    saved = os.environ.get("PADDLE_TRAINER_ID")
    os.environ["PADDLE_TRAINER_ID"] = "0"  # read by the process group's constructor
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        store = core.TCPStore("127.0.0.1", port, True, 1, 30)
        pg = core.ProcessGroupGloo.create(store, 0, 1, 4321)
    finally:
        if saved is None:
            del os.environ["PADDLE_TRAINER_ID"]
        else:
            os.environ["PADDLE_TRAINER_ID"] = saved
    yield pg


@pytest.fixture()
def fresh_tracer(monkeypatch):
    t = CommTracer(ring=8)
    monkeypatch.setattr(trace, "_TRACER", t)
    return t


def test_call_records_op_group_seq_shapes_and_result(gloo_group, fresh_tracer):
    x = paddle.to_tensor([1.0, 2.0, 3.0])
    trace.call(gloo_group, "all_reduce", x, core.ReduceOp.SUM, True, tensors=(x,), what="bucket 0").wait()
    y = paddle.zeros([2, 5], dtype="float64")
    trace.call(gloo_group, "broadcast", y, 0, True, tensors=(y,), what="loss").wait()
    assert x.numpy().tolist() == [1.0, 2.0, 3.0]  # one rank: the sum is the tensor itself
    first, second = fresh_tracer.records
    assert (first.op, first.seq, first.shapes, first.dtype, first.what) == ("all_reduce", 0, ((3,),), "float32",
                                                                              "bucket 0")
    assert (second.op, second.seq, second.shapes, second.dtype) == ("broadcast", 1, ((2, 5),), "float64")
    assert first.group == second.group < 0  # a group Paddle's group map does not know
    assert first.start <= first.end <= second.start <= second.end
    assert not fresh_tracer.in_flight


def test_ring_is_bounded_and_counters_keep_counting(gloo_group, fresh_tracer):
    x = paddle.ones([1])
    for _ in range(20):
        trace.call(gloo_group, "all_reduce", x, core.ReduceOp.SUM, True, tensors=(x,)).wait()
    assert len(fresh_tracer.records) == 8
    assert [r.seq for r in fresh_tracer.records] == list(range(12, 20))
    assert list(fresh_tracer.counts.values()) == [20]


def test_traced_method_records_callers_line_once(gloo_group, fresh_tracer, monkeypatch):
    cls = type(gloo_group).__mro__[1]  # the pybind ProcessGroup base defines all_reduce
    original = vars(cls)["all_reduce"]
    monkeypatch.setattr(cls, "all_reduce", traced_method("all_reduce", original))
    x = paddle.ones([4])
    gloo_group.all_reduce(x, core.ReduceOp.SUM, True).wait()  # this line is the caller
    (rec,) = fresh_tracer.records
    assert rec.what.startswith("test_trace.py:") and rec.op == "all_reduce"
    # inside trace.call the wrapped method is not recorded a second time
    trace.call(gloo_group, "all_reduce", x, core.ReduceOp.SUM, True, tensors=(x,), what="plugin").wait()
    assert [r.what for r in fresh_tracer.records][1:] == ["plugin"]


def test_failed_call_is_recorded_with_its_error_and_leaves_flight(gloo_group, fresh_tracer):
    with pytest.raises((RuntimeError, ValueError, IndexError)):  # Paddle's error type for a bad peer
        trace.call(gloo_group, "send", paddle.ones([2]), 5, True, tensors=(), peer=5, what="bad peer")
    (rec,) = fresh_tracer.records
    assert rec.error and rec.end is not None and not fresh_tracer.in_flight


def test_disabled_tracer_records_nothing(gloo_group, fresh_tracer):
    fresh_tracer.enabled = False
    x = paddle.ones([2])
    trace.call(gloo_group, "all_reduce", x, core.ReduceOp.SUM, True, tensors=(x,)).wait()
    assert not fresh_tracer.records


def test_in_flight_record_is_the_oldest_and_appears_in_snapshot(fresh_tracer):
    a = fresh_tracer.begin(3, "recv", [paddle.ones([2, 2])], 1, "RA0.1<0")
    b = fresh_tracer.begin(4, "all_reduce", [], None, "x.py:1")
    fresh_tracer.end(b)
    assert fresh_tracer.oldest_in_flight() is a
    snap = json.loads(json.dumps(fresh_tracer.snapshot()))
    assert [d["what"] for d in snap["in_flight"]] == ["RA0.1<0"]
    assert snap["counts"] == {"3": 1, "4": 1}


def test_chrome_trace_puts_compute_p2p_and_groups_on_rows(fresh_tracer):
    class Act:  # the pipeline IR's shape: str() and, for transfers, .peer
        def __init__(self, text, peer=None):
            self.text, self.peer = text, peer

        def __str__(self):
            return self.text

    rec = fresh_tracer.begin(7, "send", [paddle.ones([3])], 1, "SA0.0>1")
    fresh_tracer.end(rec)
    events = chrome_trace(fresh_tracer.records, [(0, Act("F0.0"), 1.0, 1.5), (1, Act("SA0.0>1", 1), 1.5, 1.6)],
                          rank=2, groups={7: (2, 3)})
    rows = {(e["name"], e.get("tid")) for e in events if e["ph"] == "X"}
    assert ("F0.0", "compute") in rows and ("SA0.0>1", "pipeline p2p") in rows
    assert ("send #0", "group 7 [2, 3]") in rows
    assert all(e["pid"] == 2 for e in events)
    f = next(e for e in events if e["name"] == "F0.0")
    assert f["ts"] == 1.0e6 and f["dur"] == pytest.approx(0.5e6)


@pytest.mark.parametrize("config, error, pattern", [
    ({"comm": {"ring": 0}}, ValueError, r"comm.ring = 0 is not allowed: an int in \[1, "),
    ({"comm": {"hang_timeout": -1}}, ValueError, r"comm.hang_timeout = -1 is not allowed"),
    ({"comm": {"trace": "yes"}}, TypeError, "comm.trace must be True or False"),
    ({"comm": {"timeout": 3}}, ValueError, r"unknown paddle_ext comm keys \['timeout'\]"),
])
def test_bad_settings_name_the_key_and_range(config, error, pattern):
    with pytest.raises(error, match=pattern):
        from_source({"paddle_ext": config})


def test_environment_overrides_config(monkeypatch):
    monkeypatch.setenv("PADDLE_EXT_HANG_TIMEOUT", "2.5")
    monkeypatch.setenv("PADDLE_EXT_COMM_TRACE", "off")
    s = from_source({"paddle_ext": {"comm": {"hang_timeout": 60, "ring": 10}}})
    assert s == CommSettings(trace=False, ring=10, hang_timeout=2.5)
    monkeypatch.setenv("PADDLE_EXT_COMM_RING", "ten")
    with pytest.raises(ValueError, match="PADDLE_EXT_COMM_RING = 'ten' is not allowed: an int"):
        from_source(None)


def test_configure_resizes_the_ring_keeping_the_newest(fresh_tracer):
    for i in range(8):
        fresh_tracer.end(fresh_tracer.begin(1, "barrier", [], None, str(i)))
    try:
        debug.configure({"paddle_ext": {"comm": {"ring": 3}}})
        assert [r.what for r in fresh_tracer.records] == ["5", "6", "7"]
    finally:
        debug.configure(None)


def test_device_ops_stay_in_flight_until_their_task_completes(fresh_tracer):
    class Task:  # the is_completed() of a NCCL task (a CUDA event query); no GPU here
        done = False

        def is_completed(self):
            return self.done

    task = Task()
    rec = fresh_tracer.begin(2, "all_reduce", [paddle.ones([8])], None, "grad bucket c0b0")
    fresh_tracer.end(rec)  # the host call returned: enqueued
    fresh_tracer.watch(rec, task)
    assert fresh_tracer.oldest_in_flight() is rec
    assert "enqueued, not finished on the device" in rec.describe()
    assert [d["on_device"] for d in fresh_tracer.snapshot()["in_flight"]] == [True]
    task.done = True
    assert fresh_tracer.oldest_in_flight() is None and not fresh_tracer.device_pending
    assert not rec.on_device


def test_long_wait_sets_the_limit_of_operations_begun_inside_and_nests(fresh_tracer):
    now = [100.0]
    fresh_tracer.clock = lambda: now[0]
    outside = fresh_tracer.begin(0, "all_reduce", [], None, "a.py:1")
    with trace.long_wait(50):
        inside = fresh_tracer.begin(0, "barrier", [], None, "a.py:2")
        with trace.long_wait():  # no limit
            unlimited = fresh_tracer.begin(0, "barrier", [], None, "a.py:3")
        after_inner = fresh_tracer.begin(0, "barrier", [], None, "a.py:4")
    assert (outside.limit, inside.limit, unlimited.limit, after_inner.limit) == (None, 50.0, float("inf"), 50.0)
    assert fresh_tracer.wait_limit is None
    assert fresh_tracer.overdue(10) is None
    now[0] = 111.0  # past hang_timeout 10, within 50
    assert fresh_tracer.overdue(10) is outside
    fresh_tracer.end(outside)
    assert fresh_tracer.overdue(10) is None
    now[0] = 151.0
    assert fresh_tracer.overdue(10) is inside
    fresh_tracer.end(inside)
    fresh_tracer.end(after_inner)
    now[0] = 1e9
    assert fresh_tracer.overdue(10) is None  # the unlimited one never is
    assert trace.CommRecord.from_dict(json.loads(json.dumps(unlimited.to_dict()))).limit == float("inf")


@pytest.mark.parametrize("bad", [0, -1, True, "60", float("nan")])
def test_long_wait_refuses_a_limit_that_is_not_a_positive_number(fresh_tracer, bad):
    with pytest.raises(ValueError, match=r"long_wait: seconds = .* is not allowed: a number > 0"):
        with trace.long_wait(bad):
            pass
    assert fresh_tracer.wait_limit is None


def test_long_wait_restores_the_limit_when_the_block_raises(fresh_tracer):
    with pytest.raises(KeyError):
        with trace.long_wait(5):
            raise KeyError("boom")
    assert fresh_tracer.wait_limit is None
