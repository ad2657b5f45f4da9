"""The gloo address check (paddle_ext.comm.address_check) in real launches.

Across emulated hosts (network namespaces, tests/multiproc/hosts.py): the loopback mistake
(no GLOO_SOCKET_IFNAME, the hostname resolving to 127.0.0.1) stops every rank within
seconds with the address, the interface and what to set, where stock Paddle had one rank
refused and the other hanging in connectFullMesh; a correct launch passes, by either of
gloo's rules (GLOO_SOCKET_IFNAME on one host, the hostname resolving to the host's own
address on the other), and the addresses the check predicts are the ones gloo connected
on. On one host, loopback everywhere is never refused."""

import socket

import pytest

from paddle_ext.comm.address_check import bindable_addresses
from tests.multiproc.hosts import EmulatedHosts, can_make_hosts, launch_hosts
from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

_NO_HOSTS = can_make_hosts()
multihost = pytest.mark.skipif(_NO_HOSTS is not None, reason=_NO_HOSTS or "")

STOPPED = "paddle_ext: gloo cannot connect this job's ranks with the addresses they would advertise"


@multihost
def test_the_loopback_mistake_stops_every_rank_within_seconds_naming_address_interface_and_what_to_set():
    with EmulatedHosts(2) as hosts:
        named = [(h.address, h.iface) for h in hosts.hosts]
        result = launch_hosts(hosts, "address_check.py", timeout=30, ifname=False)
    assert not result.timed_out and result.returncode != 0, result.describe()
    assert result.elapsed < 30, result.describe()
    assert sorted(result.logs) == [0, 1], result.describe()
    for log in result.logs.values():
        assert "AddressCheckError: " + STOPPED in log, result.describe()
        for rank, (address, iface) in enumerate(named):  # every rank names every offending rank
            assert (f"rank {rank} (host {address}) would advertise 127.0.0.1 to gloo (GLOO_SOCKET_IFNAME "
                    f"is not set and the hostname {socket.gethostname()!r} resolves to it), which ranks on "
                    f"other hosts cannot reach: set GLOO_SOCKET_IFNAME={iface}, the interface that carries "
                    f"{address}, on this host, and launch every host with --host") in log, result.describe()
        assert "all_reduce" not in log
    # stopped before gloo connected: no rank was refused by a peer's loopback address
    assert "Connection refused" not in result.all_text(), result.describe()


@multihost
def test_a_correct_launch_across_hosts_passes_by_either_rule_and_gloo_uses_the_predicted_addresses():
    with EmulatedHosts(2) as hosts:
        addresses = [h.address for h in hosts.hosts]
        hosts.hostname_resolves_to_own_address(1)
        # host 0: GLOO_SOCKET_IFNAME names its interface; host 1: unset (empty, which Paddle
        # ignores), its hostname resolving to its own address
        result = launch_hosts(hosts, "address_check.py", timeout=60, host_env={1: {"GLOO_SOCKET_IFNAME": ""}})
    assert not result.timed_out and result.returncode == 0, result.describe()
    for rank, address in enumerate(addresses):
        log = result.logs[rank]
        assert f"predicted gloo address {address};" in log, result.describe()
        assert f"rank {rank}: all_reduce 3" in log, result.describe()  # 1 + 2: gloo connected both ways
    assert "AddressCheckError" not in result.all_text()


def test_one_host_with_loopback_everywhere_is_never_refused():
    predicted = (bindable_addresses(socket.gethostname()) or ["127.0.0.1"])[0]
    result = launch("address_check.py", nproc=2, timeout=60)
    assert not result.timed_out and result.returncode == 0, result.describe()
    for rank in (0, 1):
        assert f"predicted gloo address {predicted};" in result.logs[rank], result.describe()
        assert f"rank {rank}: all_reduce 3" in result.logs[rank], result.describe()
    assert "AddressCheckError" not in result.all_text()
