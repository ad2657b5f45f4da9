"""Jobs across machines: two hosts emulated by network namespaces (tests/multiproc/hosts.py),
the launcher's multi-node mode (--master, --nnodes, --rank, --host, GLOO_SOCKET_IFNAME).

fleet.init and collectives on 2 hosts x 2 ranks; pp2 parity with one rank per host; pp2 x
dp2 parity on 2 hosts x 2 ranks; a rank SIGKILLed on one host named as lost by the other;
and issue 39's acceptance: no connect retry ("... while the server is not yet listening",
Paddle's 3 s sleep) in 10 consecutive pp2 jobs across hosts, and fleet.init across hosts
within 2x its time on one host (medians). One set of namespaces serves the whole module.
"""

from __future__ import annotations

import os
import re
import statistics

import pytest

from tests.multiproc.hosts import EmulatedHosts, can_make_hosts, launch_hosts
from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

RETRY = "while the server is not yet listening"
# 10 (the acceptance); CI's 2.6.2 leg runs 3 (PADDLE_EXT_TEST_MULTIHOST_JOBS): 20 jobs measured
# there without a retry, and each job is mostly Paddle's start-up, CPU the CI run is short of
ACCEPTANCE_JOBS = int(os.environ.get("PADDLE_EXT_TEST_MULTIHOST_JOBS", "10"))
ONE_HOST_JOBS = 3


@pytest.fixture(scope="module")
def hosts():
    reason = can_make_hosts()
    if reason is not None:
        pytest.skip(reason)
    with EmulatedHosts(2) as made:
        yield made


def _retries(result) -> list[str]:
    """The connect retries Paddle logged (each rank's log also reaches the launcher's output)."""
    return sorted({line for line in result.all_text().splitlines() if RETRY in line})


def _fleet_init_time(result, nranks: int) -> float:
    """fleet.init's time on the rank that reached it last (the least of the ranks'): the
    others' also hold the wait for a rank still starting, which across hosts includes the
    launchers' own skew (the HTTP master's random start-up sleep, its 0.5 s polls)."""
    times = [float(m) for r in range(nranks) for m in re.findall(rf"rank {r}: fleet.init ([\d.]+) s",
                                                                  result.logs.get(r, ""))]
    assert len(times) == nranks, result.describe()
    return min(times)


def test_fleet_init_and_collectives_on_two_hosts_of_two_ranks(hosts):
    result = launch_hosts(hosts, "multihost_collectives.py", "dp", nproc_per_host=2, timeout=90)
    assert result.returncode == 0, result.describe()
    for rank in range(4):
        log = result.logs[rank]
        for case in ("all_reduce", "broadcast"):
            assert f"rank {rank}: {case} ok" in log, result.describe()
        # ranks 0, 1 on host 0 and 2, 3 on host 1: both groups span the hosts
        members = [0, 2] if rank % 2 == 0 else [1, 3]
        assert f"rank {rank}: new_group {members} all_reduce ok" in log, result.describe()
    assert not _retries(result), result.describe()


def test_pp2_across_hosts_equals_one_process_bitwise(hosts):
    result = launch_hosts(hosts, "pipeline_parity.py", "2", "1:3,2:5", timeout=120)
    assert result.returncode == 0, result.describe()
    for rank in (0, 1):
        log = result.logs[rank]
        assert f"rank {rank}: all pairs passed" in log, result.describe()
        assert len(re.findall(rf"rank {rank}: pp=2 vpp=\d M=\d+ .*bitwise equal", log)) == 2, result.describe()


def test_pp2_dp2_on_two_hosts_of_two_ranks_equals_the_reference(hosts):
    result = launch_hosts(hosts, "grad_overlap_parity.py", "2", "1", "1:4:0", nproc_per_host=2, timeout=150)
    assert result.returncode == 0, result.describe()
    for rank in range(4):
        log = result.logs[rank]
        assert f"rank {rank}: all configs passed" in log, result.describe()
        assert re.search(rf"rank {rank}: dp=2 sharding=1 .*: on == off bitwise; max abs diff to reference 0",
                         log), result.describe()


def test_a_rank_killed_on_one_host_is_named_by_the_other(hosts):
    result = launch_hosts(hosts, "pipeline_failure.py", "2", "1", "kill", timeout=90)
    assert not result.timed_out and result.returncode != 0, result.describe()
    assert "rank 1: SIGKILL to myself" in result.logs[1], result.describe()
    # by its host's own address (the hosts share one hostname)
    lost = rf"\[rank 0\] paddle_ext comm watchdog: .*rank 1 lost \(on {re.escape(hosts.hosts[1].address)}\b"
    assert re.search(lost, result.logs[0]), result.describe()
    assert "finished without failure" not in result.all_text()
    # start-up (two launchers' rendezvous, two Paddle imports) and the report, not gloo's
    # ~30 s timeout on the dead peer's connection
    assert result.elapsed < 30, result.describe()


def test_no_connect_retry_in_consecutive_pp2_jobs_across_hosts_and_fleet_init_as_fast_as_on_one_host(hosts):
    """Issue 39's acceptance. Before the group stores were published only once listening
    (and the job store's clients waited across hosts too), 1-3 retries of 3 s each in most
    such jobs."""
    across, retried = [], []
    for job in range(ACCEPTANCE_JOBS):
        result = launch_hosts(hosts, "multihost_collectives.py", "pp", timeout=90)
        assert result.returncode == 0, f"job {job}: {result.describe()}"
        assert all(f"rank {r}: train_batch ok" in result.logs[r] for r in (0, 1)), result.describe()
        retried += [f"job {job}: {line}" for line in _retries(result)]
        across.append(_fleet_init_time(result, 2))
    one_host = []
    for _ in range(ONE_HOST_JOBS):
        result = launch("multihost_collectives.py", "pp", nproc=2, timeout=90)
        assert result.returncode == 0, result.describe()
        retried += [f"one host: {line}" for line in _retries(result)]
        one_host.append(_fleet_init_time(result, 2))
    across_median, one_host_median = statistics.median(across), statistics.median(one_host)
    print(f"fleet.init median: across hosts {across_median:.3f} s {sorted(across)}, "
          f"one host {one_host_median:.3f} s {sorted(one_host)}")
    assert not retried, "\n".join(retried)
    assert across_median <= 2 * one_host_median, (across, one_host)
