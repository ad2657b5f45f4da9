"""paddle_ext.comm.address_check: the address gloo will advertise (Paddle's rules), when it
cannot be reached from the other hosts, and the ranks' agreement through the job store."""

import fcntl
import socket
import struct
import threading
import time

import pytest

from paddle_ext.comm import address_check as ac
from paddle_ext.comm.address_check import Interface

IFACES = {
    "lo": Interface("lo", ("127.0.0.1", "::1"), True),
    "eth0": Interface("eth0", ("10.0.0.2", "fd00::2"), True),
    "eth1": Interface("eth1", ("fd01::7", "192.168.5.2"), True),  # an IPv6 address listed first
    "bare0": Interface("bare0", (), True),
    "down0": Interface("down0", ("10.9.0.2",), False),
}


def resolves_to(*addresses):
    return lambda hostname: list(addresses)


def env(**extra):
    base = {"PADDLE_TRAINER_ID": "1", "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6071",
            "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6070,10.0.0.2:6071", "PADDLE_NNODES": "2"}
    base.update(extra)
    return {k: v for k, v in base.items() if v is not None}


# -- which address gloo advertises -------------------------------------------------------

def test_gloo_socket_ifname_gives_the_interfaces_first_address_in_getifaddrs_order():
    assert ac.advertised_address("eth0", IFACES, "vm", resolves_to("127.0.0.1")).address == "10.0.0.2"
    assert ac.advertised_address("eth1", IFACES, "vm", resolves_to("127.0.0.1")).address == "fd01::7"


def test_without_gloo_socket_ifname_the_hostnames_first_bindable_address_else_loopback():
    got = ac.advertised_address(None, IFACES, "vm", resolves_to("10.0.0.2", "127.0.0.1"))
    assert (got.address, got.ifname) == ("10.0.0.2", None)
    assert got.reason == "GLOO_SOCKET_IFNAME is not set and the hostname 'vm' resolves to it"
    got = ac.advertised_address(None, IFACES, "vm", resolves_to())
    assert got.address == "127.0.0.1"
    assert "resolves to no address: Paddle falls back to loopback" in got.reason


def test_a_one_character_gloo_socket_ifname_is_ignored_as_paddle_does():
    # Paddle: `if (ifname && strlen(ifname) > 1)`; an empty value is unset too
    got = ac.advertised_address("e", IFACES, "vm", resolves_to("127.0.0.1"))
    assert (got.address, got.ifname) == ("127.0.0.1", None)
    assert "GLOO_SOCKET_IFNAME='e' is one character, which Paddle ignores" in got.reason
    assert ac.advertised_address("", IFACES, "vm", resolves_to("10.0.0.2")).address == "10.0.0.2"


def test_a_missing_or_addressless_interface_is_unusable_and_named():
    got = ac.advertised_address("eth9", IFACES, "vm", resolves_to("10.0.0.2"))
    assert got.address == "" and got.unusable == (
        "GLOO_SOCKET_IFNAME=eth9 names no interface of this host (it has bare0, down0, eth0, eth1, lo)")
    got = ac.advertised_address("bare0", IFACES, "vm", resolves_to("10.0.0.2"))
    assert got.unusable == "interface bare0 (GLOO_SOCKET_IFNAME) has no IPv4 or IPv6 address"


# -- whether the job spans hosts -----------------------------------------------------------

@pytest.mark.parametrize("endpoints, nnodes, spans", [
    ("10.0.0.1:6070,10.0.0.2:6071", "2", True),
    ("10.0.0.1:6070,10.0.0.1:6071,10.0.0.2:6072", "2", True),
    ("127.0.0.1:6070,127.0.0.1:6071", "1", False),
    ("127.0.0.1:6070,127.0.0.1:6071", "2", False),  # two launchers on one machine
    ("10.0.0.1:6070,10.0.0.1:6071", "2", False),
    (None, "2", True),  # the launcher leaves the endpoints out of very large jobs
    (None, "1", False),
    (None, None, False),
    ("[fd00::1]:6070,[fd00::2]:6071", "2", True),
])
def test_a_job_spans_hosts_when_its_endpoints_name_several_addresses_else_by_node_count(endpoints, nnodes, spans):
    assert ac.spans_hosts(env(PADDLE_TRAINER_ENDPOINTS=endpoints, PADDLE_NNODES=nnodes)) is spans


# -- the problem a rank reports ------------------------------------------------------------

def test_loopback_across_hosts_names_rank_host_address_interface_and_what_to_set():
    text = ac.problem(env(), IFACES, "vm", resolves_to("127.0.0.1"))
    assert text == ("rank 1 (host 10.0.0.2) would advertise 127.0.0.1 to gloo (GLOO_SOCKET_IFNAME is not set "
                    "and the hostname 'vm' resolves to it), which ranks on other hosts cannot reach: set "
                    "GLOO_SOCKET_IFNAME=eth0, the interface that carries 10.0.0.2, on this host, and launch "
                    "every host with --host <that host's address>")
    text = ac.problem(env(GLOO_SOCKET_IFNAME="lo"), IFACES, "vm", resolves_to("10.0.0.2"))
    assert text.startswith("rank 1 (host 10.0.0.2) would advertise 127.0.0.1 to gloo (GLOO_SOCKET_IFNAME=lo)")
    text = ac.problem(env(PADDLE_CURRENT_ENDPOINT="172.16.0.9:6071"), IFACES, "vm", resolves_to("::1"))
    assert "would advertise ::1 to gloo" in text
    assert "set GLOO_SOCKET_IFNAME to the interface that carries this host's address" in text  # none holds it


def test_one_host_jobs_with_loopback_everywhere_are_never_refused():
    one_host = env(PADDLE_TRAINER_ENDPOINTS="127.0.0.1:6070,127.0.0.1:6071", PADDLE_NNODES="1",
                   PADDLE_CURRENT_ENDPOINT="127.0.0.1:6071")
    assert ac.problem(one_host, IFACES, "vm", resolves_to("127.0.0.1")) is None
    assert ac.problem(dict(one_host, GLOO_SOCKET_IFNAME="lo"), IFACES, "vm", resolves_to()) is None


def test_a_reachable_address_across_hosts_passes():
    assert ac.problem(env(GLOO_SOCKET_IFNAME="eth0"), IFACES, "vm", resolves_to("127.0.0.1")) is None
    assert ac.problem(env(), IFACES, "vm", resolves_to("10.0.0.2", "127.0.0.1")) is None


def test_an_unusable_interface_is_refused_on_one_host_too_and_a_down_one_across_hosts():
    one_host = env(PADDLE_TRAINER_ENDPOINTS="127.0.0.1:6070,127.0.0.1:6071", PADDLE_CURRENT_ENDPOINT="127.0.0.1:6071",
                   GLOO_SOCKET_IFNAME="eth9")
    assert ac.problem(one_host, IFACES, "vm", resolves_to("127.0.0.1")) == (
        "rank 1 (host 127.0.0.1): GLOO_SOCKET_IFNAME=eth9 names no interface of this host (it has bare0, "
        "down0, eth0, eth1, lo); gloo cannot start there: set GLOO_SOCKET_IFNAME=lo, the interface that "
        "carries 127.0.0.1, on this host")
    assert ac.problem(env(GLOO_SOCKET_IFNAME="down0"), IFACES, "vm", resolves_to()) == (
        "rank 1 (host 10.0.0.2): interface down0 (GLOO_SOCKET_IFNAME, address 10.9.0.2) is down, so ranks on "
        "other hosts cannot reach it: bring it up or set GLOO_SOCKET_IFNAME=eth0, the interface that carries "
        "10.0.0.2, on this host")


# -- this machine: interfaces and name resolution, against independent readings ------------

def _ioctl_ipv4(name: str):
    """The interface's primary IPv4 address through SIOCGIFADDR, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def test_interfaces_lists_every_interface_with_the_kernels_addresses():
    found = ac.interfaces()
    assert set(found) == {name for _, name in socket.if_nameindex()}
    assert found["lo"].up and found["lo"].addresses[0] == "127.0.0.1"
    for name, iface in found.items():
        ipv4 = _ioctl_ipv4(name)
        v4 = [a for a in iface.addresses if ":" not in a]
        assert (v4[0] if v4 else None) == ipv4, name


def test_bindable_addresses_resolve_as_getaddrinfo_does():
    assert "127.0.0.1" in ac.bindable_addresses("localhost")
    assert ac.bindable_addresses("no-such-host.invalid") == []
    assert ac.bindable_addresses("192.0.2.250") == []  # resolves, but no interface of this machine holds it


# -- agreement through the store -----------------------------------------------------------

class FakeStore:
    """TCPStore's add / set / get (get waits for the key) in one process."""

    def __init__(self):
        self.values, self.cond = {}, threading.Condition()

    def add(self, key, n):
        with self.cond:
            self.values[key] = int(self.values.get(key, 0)) + n
            self.cond.notify_all()
            return self.values[key]

    def set(self, key, value):
        with self.cond:
            self.values[key] = value.encode() if isinstance(value, str) else value
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.values, timeout=5), key
            return self.values[key]


def _run_ranks(problems, world_size=None, **kw):
    store, results = FakeStore(), {}
    world_size = len(problems) if world_size is None else world_size

    def rank_main(rank):
        try:
            results[rank] = ac.agree(store, rank, world_size, problems[rank], **kw)
        except Exception as error:  # noqa: BLE001 - reported by the assertion
            results[rank] = error

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(problems))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_every_rank_reads_every_ranks_problems_in_rank_order():
    results = _run_ranks([None, "rank 1 (host b) bad", None, "rank 3 (host d) bad"])
    assert results == {r: ["rank 1 (host b) bad", "rank 3 (host d) bad"] for r in range(4)}
    assert _run_ranks([None, None, None]) == {0: [], 1: [], 2: []}


def test_a_rank_that_never_reports_bounds_the_wait_and_is_warned_about():
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="only 2 of 3 ranks reported their gloo address check within 0.3 s"):
        results = _run_ranks([None, "rank 1 (host b) bad"], world_size=3, wait_s=0.3, read_wait_s=0.3)
    assert results == {0: ["rank 1 (host b) bad"], 1: ["rank 1 (host b) bad"]}
    assert time.monotonic() - start < 3


def test_check_raises_on_every_rank_with_all_problems_and_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(ac, "problem", lambda env, *a: "rank 9 (host z) bad" if env.get("PADDLE_TRAINER_ID") == "9"
                        else None)
    store = FakeStore()
    errors = []

    def rank_main(rank):
        with pytest.raises(ac.AddressCheckError) as caught:
            ac.check(store, rank, 2, env={"PADDLE_TRAINER_ID": str(rank)})
        errors.append(str(caught.value))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 9)]
    # world_size 2 with ranks 0 and 9: only the count of arrivals matters to the agreement
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 2 and errors[0] == errors[1]
    assert errors[0] == ("paddle_ext: gloo cannot connect this job's ranks with the addresses they would "
                         "advertise; stopping every rank before it hangs:\n  rank 9 (host z) bad\nSee README, "
                         "'Across machines on CPU' "
                         "(PADDLE_EXT_ADDRESS_CHECK=off skips this check).")
    untouched = FakeStore()
    ac.check(untouched, 0, 2, env={"PADDLE_EXT_ADDRESS_CHECK": "off", "PADDLE_TRAINER_ID": "9"})
    assert untouched.values == {}
    with pytest.raises(ValueError, match="PADDLE_EXT_ADDRESS_CHECK = 'maybe' is not allowed: on or off"):
        ac.check(untouched, 0, 2, env={"PADDLE_EXT_ADDRESS_CHECK": "maybe"})


def test_the_message_names_at_most_eight_ranks_and_counts_the_rest():
    text = ac.message([f"rank {r} (host h{r}) bad" for r in range(11)])
    assert "rank 7 (host h7) bad\n  ... and 3 more rank(s)\n" in text and "rank 8 (host" not in text


def test_only_the_global_gloo_group_is_checked(monkeypatch):
    calls, made = [], []
    monkeypatch.setattr(ac, "check", lambda store, rank, size: calls.append((store, rank, size)))
    impl = ac.check_before_connect(lambda *a, **k: made.append((a, k)) or "pg")
    assert impl("gloo", "store", 1, 2, "_default_pg", None, nccl_config=None) == "pg"
    assert calls == [("store", 1, 2)]
    impl("gloo", "store", 0, 2, "g", None, 3)   # a later group
    impl("nccl", "store", 0, 2, "g", None, 0)   # another backend
    impl("gloo", "store", 0, 1, "g", None, 0)   # one rank: nothing to connect
    assert calls == [("store", 1, 2)]
    assert made[0] == (("gloo", "store", 1, 2, "_default_pg", None, 0), {"nccl_config": None})
