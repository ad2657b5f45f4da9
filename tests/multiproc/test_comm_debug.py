"""Communication debugging on gloo: hang reports, lost ranks, eager connection, traces."""

import json
import os
import re

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

HANG = {"PADDLE_EXT_HANG_TIMEOUT": "3"}


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_rank_that_skips_an_all_reduce_is_named_with_the_diverging_sequence_number(nproc):
    result = launch("comm_skip_allreduce.py", "1", nproc=nproc, timeout=120, env=HANG)
    assert not result.timed_out and result.returncode == 3, result.describe()
    for rank in range(nproc):
        log = result.logs[rank]
        assert (f"[rank {rank}]   group 0 (ranks {list(range(nproc))}): ranks diverge at sequence number 3: "
                "rank 1 reached it from a different place in the program") in log, result.describe()
        assert f"[rank {rank}] ending every rank with exit code 3" in log
    assert "rank 1: finished the loop" in result.logs[1]
    assert not any("finished the loop" in result.logs[r] for r in range(nproc) if r != 1)


def test_a_wait_inside_long_wait_outlasts_hang_timeout_and_the_same_wait_outside_ends_the_job():
    """With a 1.5 s heartbeat bound too: a checkpoint barrier of 6 s is no silence."""
    result = launch("comm_long_wait.py", nproc=2, timeout=120,
                    env={"PADDLE_EXT_HANG_TIMEOUT": "2", "PADDLE_EXT_HEARTBEAT_TIMEOUT": "1.5"})
    assert not result.timed_out and result.returncode == 3, result.describe()
    for rank in (0, 1):
        assert f"rank {rank}: past the long wait" in result.logs[rank], result.describe()
        assert f"[rank {rank}] ending every rank with exit code 3" in result.logs[rank]
    assert "made no progress" in result.all_text()
    assert "past the unguarded wait" not in result.all_text()
    assert " lost" not in result.all_text(), result.describe()


@pytest.mark.parametrize("pp, victim, placement", [(2, 1, ""), (4, 2, ""), (2, 1, "v")])
def test_a_rank_killed_mid_step_is_named_by_every_other_rank(pp, victim, placement):
    """placement v: dualpipev on the V placement (the same transport and watchdog)."""
    result = launch("pipeline_failure.py", str(pp), str(victim), "kill", *((placement,) if placement else ()),
                    nproc=pp, timeout=120)
    assert not result.timed_out and result.returncode != 0, result.describe()
    assert f"rank {victim}: SIGKILL to myself" in result.logs[victim]
    killed_at = result.elapsed
    for rank in set(range(pp)) - {victim}:
        assert re.search(rf"\[rank {rank}\] paddle_ext comm watchdog: .*rank {victim} lost", result.logs[rank]), \
            result.describe()
    assert killed_at < 60, result.describe()
    assert "finished without failure" not in result.all_text()


def test_a_mismatched_send_recv_pair_names_both_ranks_and_actions():
    result = launch("comm_mismatch.py", nproc=2, timeout=120, env=HANG)
    assert not result.timed_out and result.returncode == 3, result.describe()
    assert "validator refused the schedule: deadlock" in result.logs[0]
    for rank in (0, 1):
        log = result.logs[rank]
        assert "rank 0 and rank 1: a send/recv pair that does not match (both receive: neither sends)" in log
        assert re.search(r"rank 0: recv #\d+ from rank 1 \[float32 2x8x16\] \(RG0\.0<1\)", log), result.describe()
        assert re.search(r"rank 1: recv #\d+ from rank 0 \[float32 2x8x16\] \(RA0\.1<0\)", log), result.describe()
    assert "finished without a hang" not in result.all_text()


def test_eager_connection_leaves_the_first_step_no_communicator_to_make_and_traces_a_step(tmp_path):
    result = launch("comm_eager.py", str(tmp_path), nproc=2, timeout=120,
                    env={"FLAGS_eager_communication_connection": "1"})
    assert result.returncode == 0, result.describe()
    for rank in (0, 1):
        match = re.search(rf"rank {rank}: eager=True made during init: (\d+) .* made in the first train_batch: "
                          r"(\d+);", result.logs[rank])
        assert match, result.describe()
        assert int(match.group(1)) >= 3 and int(match.group(2)) == 0  # global, pipeline pair, ... groups
        events = json.loads((tmp_path / f"step_rank{rank}.json").read_text())["traceEvents"]
        compute = [e["name"] for e in events if e.get("tid") == "compute"]
        comm = [e for e in events if e.get("cat") == "comm"]
        assert len([n for n in compute if n.startswith("F")]) == 4 and len(compute) == 8
        # the transfers: on the pipeline's own row (the engine's spans; over TCP streams no
        # group operation exists to record), the loss broadcast as a group operation
        whats = {e["args"]["what"] for e in comm} | {e["name"] for e in events if e.get("tid") == "pipeline p2p"}
        assert ({"SA0.0>1", "RG0.3<1"} if rank == 0 else {"RA0.0<0", "SG0.3>0"}) <= whats
        assert "loss broadcast" in whats
        assert all(e["pid"] == rank for e in events)
    assert os.path.exists(tmp_path / "step_rank1.json")
