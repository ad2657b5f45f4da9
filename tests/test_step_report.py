"""pp_configs enable_timer and profiling (pipeline/step_report.py): the timer line in
Paddle's Timers.log format, the profile records in PipelineParallel's format, and the
keys read from the strategy as Paddle's protobuf holds them. On gloo, through a real
pipeline: tests/multiproc/scripts/fleet_surface.py, item 7."""

import json
import re

import paddle.distributed.fleet as fleet
import pytest

import paddle_ext
from paddle_ext.pipeline.engine import PipelineSettings
from paddle_ext.pipeline.schedule.ir import (
    FB,
    B,
    F,
    GradSync,
    I,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    W,
)
from paddle_ext.pipeline.step_report import (
    PROFILE_FILE_PREFIX,
    StepTimers,
    profile_records,
    timer_name,
    write_profile_records,
)


def test_each_action_counts_under_paddles_timer_name():
    assert timer_name(F(0, 1)) == "forward_step"
    assert {timer_name(a) for a in (B(0, 1), I(0, 1), W(0, 1))} == {"backward_step"}
    assert timer_name(FB(F(0, 2), B(1, 0))) == "forward_backward_step"
    assert [timer_name(c(0, 1, 1)) for c in (SendAct, RecvAct, SendGrad, RecvGrad)] == [
        "send_forward", "recv_forward", "send_backward", "recv_backward"]
    assert timer_name(GradSync(0)) is None


def test_the_line_sums_spans_in_first_seen_order_and_keeps_names_at_zero_after():
    timers = StepTimers()
    timers.add_spans([(0, RecvAct(0, 0, 0), 10.0, 10.004), (1, F(0, 0), 10.004, 10.0165),
                      (2, GradSync(0), 10.02, 10.5), (3, F(0, 1), 10.0165, 10.0205),
                      (4, B(0, 0), 10.03, 10.04), (5, W(0, 0), 10.04, 10.0425)])
    timers.add("broadcast_final_loss", 0.00125)
    assert timers.line() == ("time (ms) | recv_forward: 4.00 | forward_step: 16.50 | backward_step: 12.50 | "
                             "broadcast_final_loss: 1.25")
    timers.add_spans([(0, F(0, 0), 1.0, 1.001)])  # a step without a receive: Paddle's timers stay
    assert timers.line() == ("time (ms) | recv_forward: 0.00 | forward_step: 1.00 | backward_step: 0.00 | "
                             "broadcast_final_loss: 0.00")


def _paddle_record(name, category, phase, tid, ts, colour):
    # PipelineParallel's _record_format filled as its _record_stamp fills it
    return "{" + (f'"name": "{name}", "cat": "{category}", "ph": "{phase}", "pid": 0, "tid": {tid}, '
                  f'"ts": {ts}, "cname": "{colour}"') + "}"


def test_profile_records_without_virtual_stages():
    spans = [(0, RecvAct(0, 0, 0), 5.0, 5.5), (1, F(0, 2), 7.0004, 7.0109), (2, B(0, 2), 8.25, 8.5),
             (3, GradSync(0), 9.0, 9.1)]
    assert profile_records(spans, stage_id=1, virtual=False) == [
        _paddle_record("F2", "pipeline timeline", "B", 2, 7000, "thread_state_running"),
        _paddle_record("F2", "pipeline timeline", "E", 2, 7010, "thread_state_running"),
        _paddle_record("B2", "pipeline timeline", "B", 2, 8250, "rail_idle"),
        _paddle_record("B2", "pipeline timeline", "E", 2, 8500, "rail_idle")]


def test_profile_records_with_virtual_stages_name_the_chunk_and_alternate_colours():
    spans = [(0, F(1, 3), 1.0, 2.0), (1, I(0, 0), 2.0, 3.0), (2, W(1, 0), 3.0, 4.0), (3, FB(F(0, 4), B(1, 1)), 4.0, 5.0)]
    records = [json.loads(r) for r in profile_records(spans, stage_id=0, virtual=True)]
    assert [(r["name"], r["ph"], r["cname"]) for r in records] == [
        ("F3_VP1", "B", "thread_state_unknown"), ("F3_VP1", "E", "thread_state_unknown"),
        ("I0_VP0", "B", "rail_load"), ("I0_VP0", "E", "rail_load"),
        ("W0_VP1", "B", "rail_idle"), ("W0_VP1", "E", "rail_idle"),
        ("F4B1_VP0", "B", "thread_state_running"), ("F4B1_VP0", "E", "thread_state_running")]
    assert {r["cat"] for r in records} == {"virtual pipeline timeline"} and {r["tid"] for r in records} == {1}
    assert [r["ts"] for r in records] == [1000, 2000, 2000, 3000, 3000, 4000, 4000, 5000]


def test_records_append_to_the_ranks_file_under_paddles_name(tmp_path):
    first = profile_records([(0, F(0, 0), 1.0, 2.0)], 0, False)
    second = profile_records([(0, B(0, 0), 3.0, 4.0)], 0, False)
    path = write_profile_records(first, 3, str(tmp_path))
    assert write_profile_records(second, 3, str(tmp_path)) == path == str(tmp_path / f"{PROFILE_FILE_PREFIX}3")
    assert PROFILE_FILE_PREFIX == "profile_record_tmp_file_for_rank_"
    with open(path) as f:
        assert f.read().splitlines() == first + second


@pytest.fixture
def enabled():
    paddle_ext.enable()
    yield
    paddle_ext.disable()


@pytest.mark.parametrize("pp_configs, timer, profiling", [
    ({}, False, False),
    ({"enable_timer": True}, True, False),
    ({"profiling": True, "enable_timer": False}, False, True),
    ("enable_timer", True, False),  # PaddleNLP's pipeline_parallel_config word
])
def test_the_keys_come_from_the_strategy(enabled, pp_configs, timer, profiling):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2, "pp_configs": pp_configs}
    strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": 1}
    settings = PipelineSettings.from_strategy(strategy)
    assert (settings.enable_timer, settings.profiling) == (timer, profiling)


def test_the_line_format_is_paddles_timers_log(capsys):
    from paddle.distributed.fleet.utils import timer_helper

    paddle_timers = timer_helper.Timers()
    for name, seconds in (("forward_step", 0.0123), ("backward_step", 0.02)):
        paddle_timers(name).elapsed_ = seconds  # what start() / stop() would have summed
    paddle_timers.log(["forward_step", "backward_step"])
    ours = StepTimers()
    ours.add("forward_step", 0.0123)
    ours.add("backward_step", 0.02)
    assert capsys.readouterr().out.strip() == ours.line()
    assert re.fullmatch(r"time \(ms\)( \| \w+: \d+\.\d\d)+", ours.line())
