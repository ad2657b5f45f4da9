"""Before gloo connects: is the address each rank advertises reachable from the other hosts?

Gloo publishes one address per rank in the store and every other rank connects to it
(connectFullMesh). Paddle picks that address in ProcessGroupGloo's creation (both
`ProcessGroupGloo::CreateProcessGroupGloo` and phi's `CreateGlooDevice`, 2.6.2 and 3.x
alike): GLOO_SOCKET_IFNAME when it is set and longer than one character (a one-character
value is ignored), the interface's first IPv4 or IPv6 address in getifaddrs' order
(gloo's `lookupAddrForIface`; no such interface, or one without an address: gloo throws
on that rank alone); otherwise the first address the machine's hostname resolves to that
a socket can bind (gloo's `lookupAddrForHostname`), and 127.0.0.1 when none does. Where
the hostname resolves to loopback (`127.0.0.1 vm` in /etc/hosts, common on single
machines and containers), ranks on other hosts are told to connect to 127.0.0.1: the rank
that connects fails ("connect [127.0.0.1]:PORT: Connection refused") and its peers hang in
connectFullMesh until the launcher's timeout.

`check_before_connect` runs before the job's first gloo group (the global one,
init_parallel_env's) connects: every rank works out the address gloo will advertise
(`advertised_address`, the same rules), judges it (`problem`: an interface that does not
exist or has no address, or a loopback address in a job whose ranks are on several hosts),
publishes the outcome in the job store and reads every rank's (`agree`, a bounded wait),
so that every rank raises `AddressCheckError` together, within seconds, naming each
offending rank's address, interface and what to set. PADDLE_EXT_ADDRESS_CHECK=off skips it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import ipaddress
import json
import os
import socket
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

IFNAME_ENV = "GLOO_SOCKET_IFNAME"
SWITCH_ENV = "PADDLE_EXT_ADDRESS_CHECK"
WAIT_S = 20.0  # for every rank's outcome; all ranks left the job store's rendezvous just before
READ_WAIT_S = 5.0  # rank 0 (the store's server) waits this long for the others to read the outcomes
_PREFIX = "paddle_ext/address_check"
_IFF_UP = 0x1
_SHOWN = 8  # problems named in full; the rest counted


class AddressCheckError(RuntimeError):
    """A rank of a job that spans hosts would advertise an address the other hosts cannot
    reach (or GLOO_SOCKET_IFNAME names no usable interface): raised on every rank before
    gloo connects, instead of one rank's "Connection refused" and the others' hang."""


@dataclass(frozen=True)
class Interface:
    name: str
    addresses: tuple[str, ...]  # IPv4 / IPv6, in getifaddrs' order (gloo takes the first)
    up: bool


@dataclass(frozen=True)
class Advertised:
    """What gloo will advertise for this rank, and why."""

    address: str          # "" when gloo cannot pick one (interface missing or without address)
    ifname: Optional[str]  # GLOO_SOCKET_IFNAME as gloo uses it (None: the hostname path)
    reason: str           # how the address was chosen, for the message
    unusable: str = ""    # why gloo cannot use the interface ("" when it can)


def interfaces() -> dict[str, Interface]:
    """This process's network interfaces (its network namespace's) through libc's
    getifaddrs, as gloo reads them: name -> addresses in getifaddrs' order, up flag."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs failed")
    found: dict[str, tuple[list[str], bool]] = {}
    try:
        node = head
        while node:
            entry = node.contents
            name = entry.ifa_name.decode(errors="replace")
            addresses, up = found.setdefault(name, ([], False))
            found[name] = (addresses, up or bool(entry.ifa_flags & _IFF_UP))
            address = _sockaddr_text(entry.ifa_addr)
            if address:
                addresses.append(address)
            node = entry.ifa_next
    finally:
        libc.freeifaddrs(head)
    for _, name in socket.if_nameindex():  # interfaces without any address entry
        found.setdefault(name, ([], False))
    return {name: Interface(name, tuple(addrs), up) for name, (addrs, up) in found.items()}


class _SockAddr(ctypes.Structure):
    _fields_ = [("sa_family", ctypes.c_ushort), ("sa_data", ctypes.c_ubyte * 14)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [("ifa_next", ctypes.POINTER(_IfAddrs)), ("ifa_name", ctypes.c_char_p),
                     ("ifa_flags", ctypes.c_uint), ("ifa_addr", ctypes.POINTER(_SockAddr)),
                     ("ifa_netmask", ctypes.POINTER(_SockAddr)), ("ifa_ifu", ctypes.POINTER(_SockAddr)),
                     ("ifa_data", ctypes.c_void_p)]


def _sockaddr_text(pointer: Any) -> str:
    if not pointer:
        return ""
    family = pointer.contents.sa_family
    raw = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_ubyte * 28)).contents
    if family == socket.AF_INET:  # sockaddr_in: family, port, 4 address bytes
        return socket.inet_ntop(socket.AF_INET, bytes(raw[4:8]))
    if family == socket.AF_INET6:  # sockaddr_in6: family, port, flowinfo, 16 address bytes
        return socket.inet_ntop(socket.AF_INET6, bytes(raw[8:24]))
    return ""


def bindable_addresses(hostname: str) -> list[str]:
    """The addresses `hostname` resolves to (getaddrinfo, any family, stream sockets) that a
    socket can bind, in order: gloo's lookupAddrForHostname takes the first."""
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError:
        return []
    usable = []
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((sockaddr[0], 0, *sockaddr[2:]))
        except OSError:
            continue
        usable.append(sockaddr[0])
    return usable


def advertised_address(ifname: Optional[str], ifaces: Mapping[str, Interface], hostname: str,
                       resolve: Callable[[str], Sequence[str]]) -> Advertised:
    """The address gloo will advertise, by Paddle's rules (module docstring). `ifname`:
    GLOO_SOCKET_IFNAME's value (None when unset); `resolve(hostname)`: the bindable
    addresses the hostname resolves to (`bindable_addresses`)."""
    ignored = ""
    if ifname is not None and len(ifname.encode()) > 1:
        iface = ifaces.get(ifname)
        if iface is None:
            return Advertised("", ifname, f"{IFNAME_ENV}={ifname}",
                              f"{IFNAME_ENV}={ifname} names no interface of this host "
                              f"(it has {', '.join(sorted(ifaces)) or 'none'})")
        if not iface.addresses:
            return Advertised("", ifname, f"{IFNAME_ENV}={ifname}",
                              f"interface {ifname} ({IFNAME_ENV}) has no IPv4 or IPv6 address")
        return Advertised(iface.addresses[0], ifname, f"{IFNAME_ENV}={ifname}")
    if ifname:
        ignored = f"; {IFNAME_ENV}={ifname!r} is one character, which Paddle ignores"
    resolved = list(resolve(hostname))
    if resolved:
        return Advertised(resolved[0], None, f"{IFNAME_ENV} is not set and the hostname "
                                             f"{hostname!r} resolves to it{ignored}")
    return Advertised("127.0.0.1", None, f"{IFNAME_ENV} is not set and the hostname {hostname!r} "
                                         f"resolves to no address: Paddle falls back to loopback{ignored}")


def job_hosts(env: Mapping[str, str]) -> tuple[set[str], int]:
    """(the hosts named by PADDLE_TRAINER_ENDPOINTS, PADDLE_NNODES) as the launcher set them.
    The launcher leaves PADDLE_TRAINER_ENDPOINTS out of very large jobs (2.6: past 120 KiB),
    then the set is empty."""
    endpoints = [e.strip() for e in env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e.strip()]
    hosts = {e.rpartition(":")[0] or e for e in endpoints}
    try:
        nnodes = int(env.get("PADDLE_NNODES", "1") or 1)
    except ValueError:
        nnodes = 1
    return hosts, nnodes


def spans_hosts(env: Mapping[str, str]) -> bool:
    """Whether the job's ranks are on several machines: the trainer endpoints name more
    than one address; without endpoints, more than one node. Several launchers on one
    machine (PADDLE_NNODES > 1, one address everywhere) reach each other over loopback."""
    hosts, nnodes = job_hosts(env)
    return len(hosts) > 1 if hosts else nnodes > 1


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return address == "localhost"


def _carrier(address: str, ifaces: Mapping[str, Interface]) -> Optional[str]:
    """The interface that holds `address`, if any."""
    return next((i.name for i in ifaces.values() if address in i.addresses), None)


def problem(env: Mapping[str, str], ifaces: Mapping[str, Interface], hostname: str,
            resolve: Callable[[str], Sequence[str]]) -> Optional[str]:
    """Why the other ranks could not connect to this rank's gloo address (one sentence
    naming the rank, its host, the address, the interface and what to set), or None."""
    advertised = advertised_address(env.get(IFNAME_ENV), ifaces, hostname, resolve)
    rank = env.get("PADDLE_TRAINER_ID", "?")
    host = env.get("PADDLE_CURRENT_ENDPOINT", "").rpartition(":")[0]
    across = spans_hosts(env)
    carrier = _carrier(host, ifaces) if host else None
    where = f"rank {rank} (host {host or 'unknown'})"
    remedy = (f"set {IFNAME_ENV}={carrier}, the interface that carries {host}, on this host"
              if carrier else f"set {IFNAME_ENV} to the interface that carries this host's address")
    if advertised.unusable:
        return f"{where}: {advertised.unusable}; gloo cannot start there: {remedy}"
    if across and _is_loopback(advertised.address):
        return (f"{where} would advertise {advertised.address} to gloo ({advertised.reason}), which "
                f"ranks on other hosts cannot reach: {remedy}, and launch every host with --host "
                "<that host's address>")
    if across and advertised.ifname is not None and not ifaces[advertised.ifname].up:
        return (f"{where}: interface {advertised.ifname} ({IFNAME_ENV}, address {advertised.address}) "
                f"is down, so ranks on other hosts cannot reach it: bring it up or {remedy}")
    return None


def agree(store: Any, rank: int, world_size: int, own_problem: Optional[str], wait_s: float = WAIT_S,
          read_wait_s: float = READ_WAIT_S) -> list[str]:
    """Publishes this rank's outcome in the job store and returns every rank's problems,
    the same list on every rank. Waits at most `wait_s` for all outcomes (past it: the
    problems published so far, with a warning); rank 0, whose process serves the store,
    then waits up to `read_wait_s` for the others to have read them before it returns."""
    if own_problem is not None:
        slot = store.add(f"{_PREFIX}/failed", 1)
        store.set(f"{_PREFIX}/problem/{slot}", json.dumps(own_problem))
    arrived = store.add(f"{_PREFIX}/arrived", 1)
    deadline = time.monotonic() + wait_s
    pause = 0.002
    while arrived < world_size and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)
        arrived = store.add(f"{_PREFIX}/arrived", 0)
    if arrived < world_size:
        warnings.warn(f"paddle_ext: only {arrived} of {world_size} ranks reported their gloo address "
                      f"check within {wait_s:g} s; going on with what they reported", RuntimeWarning,
                      stacklevel=2)
    failed = store.add(f"{_PREFIX}/failed", 0)
    # a slot is taken before its text is set: get waits for that moment (the arrivals came after)
    problems = [json.loads(store.get(f"{_PREFIX}/problem/{slot}")) for slot in range(1, failed + 1)]
    done = store.add(f"{_PREFIX}/read", 1)
    if problems and rank == 0:
        deadline = time.monotonic() + read_wait_s
        while done < min(arrived, world_size) and time.monotonic() < deadline:
            time.sleep(0.01)
            done = store.add(f"{_PREFIX}/read", 0)
    return sorted(problems, key=_rank_order)


def _rank_order(text: str) -> tuple[int, str]:
    word = text.split(" ", 2)[1] if text.startswith("rank ") else ""
    return (int(word) if word.isdigit() else 1 << 30, text)


def message(problems: Sequence[str]) -> str:
    shown = list(problems[:_SHOWN])
    if len(problems) > _SHOWN:
        shown.append(f"... and {len(problems) - _SHOWN} more rank(s)")
    return ("paddle_ext: gloo cannot connect this job's ranks with the addresses they "
            "would advertise; stopping every rank before it hangs:\n  " + "\n  ".join(shown)
            + "\nSee README, 'Across machines on CPU' (PADDLE_EXT_ADDRESS_CHECK=off skips this check).")


def enabled(env: Mapping[str, str]) -> bool:
    value = env.get(SWITCH_ENV, "on").strip().lower()
    if value not in {"1", "on", "true", "yes", "0", "off", "false", "no"}:
        raise ValueError(f"{SWITCH_ENV} = {value!r} is not allowed: on or off")
    return value in {"1", "on", "true", "yes"}


def check(store: Any, rank: int, world_size: int, env: Optional[Mapping[str, str]] = None,
          wait_s: float = WAIT_S) -> None:
    """Judges this rank's gloo address, agrees with every rank through `store` (the job
    store) and raises AddressCheckError on every rank if any rank's address is unusable."""
    env = os.environ if env is None else env
    if not enabled(env):
        return
    hostname = socket.gethostname()
    problems = agree(store, rank, world_size, problem(env, interfaces(), hostname, bindable_addresses),
                     wait_s=wait_s)
    if problems:
        raise AddressCheckError(message(problems))


def check_before_connect(original: Callable[..., Any]) -> Callable[..., Any]:
    """_new_process_group_impl (the name paddle.distributed.parallel imported from
    collective, through which init_parallel_env makes the job's global group, id 0, on
    every rank with the job store) that runs `check` before that group connects over gloo;
    other groups and backends go straight through."""

    @functools.wraps(original)
    def _new_process_group_impl(backend, store, rank, world_size, group_name, pg_options,
                                group_id=0, *args: Any, **kwargs: Any) -> Any:
        if backend == "gloo" and group_id == 0 and world_size > 1:
            check(store, rank, world_size)
        return original(backend, store, rank, world_size, group_name, pg_options, group_id, *args, **kwargs)

    _new_process_group_impl.__wrapped__ = original  # type: ignore[attr-defined]
    return _new_process_group_impl
