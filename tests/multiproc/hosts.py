"""Emulated hosts for jobs across machines: Linux network namespaces made by the test itself.

`EmulatedHosts(n)` (a context manager; needs root and iproute2) makes n namespaces, each a
"host" with one interface (a veth) plugged into a bridge that lives in a namespace of its
own, so the hosts reach each other only through that link, by their own addresses, as
machines on one switch do. `link_down(i)` pulls host i's cable (its bridge port goes
down: no FIN, no RST, as a host that loses power). Everything is torn down on exit, also
when the test fails. `launch_hosts` runs `paddle.distributed.launch` in its multi-node
mode on every host (`--master`, `--nnodes`, `--rank`, `--host`), with GLOO_SOCKET_IFNAME
naming the host's interface, under one deadline for all, and gathers every rank's log by
its global rank. Addresses: 10.213.<k>.0/24 inside the namespaces only (k from the
process id, so two runs side by side do not meet); nothing leaves the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

from tests.multiproc.launch import (
    RANK_ENTRY,
    SCRIPTS,
    LaunchResult,
    communicate_by,
    launcher_port_range,
)

_NETNS_ETC = "/etc/netns"  # ip netns exec's per-namespace /etc files
MASTER_PORT = 36789  # every namespace has its own port space: the master's port is free there


def can_make_hosts() -> Optional[str]:
    """None where namespaces can be made here, else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "emulated hosts need root (ip netns)"
    if shutil.which("ip") is None:
        return "emulated hosts need iproute2's ip"
    probe = f"pe{os.getpid()}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, netns: Optional[str] = None) -> None:
    cmd = (["ip", "netns", "exec", netns, "ip"] if netns else ["ip"]) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


@dataclass
class Host:
    netns: str
    address: str
    iface: str       # the host's interface, inside its namespace
    bridge_port: str  # its peer, on the bridge


@dataclass
class EmulatedHosts:
    count: int
    hosts: list[Host] = field(default_factory=list)

    def __post_init__(self) -> None:
        tag = f"pe{os.getpid() % 100000}"
        self.prefix = tag
        self.bridge_ns = f"{tag}br"
        self.subnet = 10 + os.getpid() % 200

    def __enter__(self) -> EmulatedHosts:
        try:
            _ip("netns", "add", self.bridge_ns)
            _ip("link", "add", "br0", "type", "bridge", netns=self.bridge_ns)
            _ip("link", "set", "br0", "up", netns=self.bridge_ns)
            for i in range(self.count):
                host = Host(f"{self.prefix}h{i}", f"10.213.{self.subnet}.{i + 1}", f"{self.prefix}v{i}",
                            f"{self.prefix}b{i}")
                self.hosts.append(host)
                _ip("netns", "add", host.netns)
                _ip("link", "add", host.iface, "type", "veth", "peer", "name", host.bridge_port)
                _ip("link", "set", host.iface, "netns", host.netns)
                _ip("link", "set", host.bridge_port, "netns", self.bridge_ns)
                _ip("link", "set", host.bridge_port, "master", "br0", netns=self.bridge_ns)
                _ip("link", "set", host.bridge_port, "up", netns=self.bridge_ns)
                _ip("addr", "add", f"{host.address}/24", "dev", host.iface, netns=host.netns)
                _ip("link", "set", host.iface, "up", netns=host.netns)
                _ip("link", "set", "lo", "up", netns=host.netns)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in [h.netns for h in self.hosts] + [self.bridge_ns]:
            # processes left in a namespace keep it alive: kill them first
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(os.path.join(_NETNS_ETC, ns), ignore_errors=True)
        self.hosts.clear()

    def hostname_resolves_to_own_address(self, i: int) -> None:
        """On host i the machine's hostname resolves to the host's own address, as on a
        machine whose /etc/hosts or DNS names it (here it resolves to 127.0.0.1): `ip netns
        exec` mounts /etc/netns/<netns>/hosts over /etc/hosts for what it starts afterwards."""
        folder = os.path.join(_NETNS_ETC, self.hosts[i].netns)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hosts"), "w") as f:
            f.write(f"127.0.0.1 localhost\n{self.hosts[i].address} {socket.gethostname()}\n")

    def link_down(self, i: int) -> None:
        """Host i drops off the network: its bridge port goes down (no FIN, no RST)."""
        _ip("link", "set", self.hosts[i].bridge_port, "down", netns=self.bridge_ns)


def launch_hosts(hosts: EmulatedHosts, script: str, *args: str, nproc_per_host: int = 1,
                 timeout: float = 120.0, env: Optional[dict[str, str]] = None,
                 host_env: Optional[dict[int, dict[str, str]]] = None, advertise: bool = True,
                 ifname: bool = True, after_start=None) -> LaunchResult:
    """Runs `script` on every host through the launcher's multi-node mode. advertise:
    pass `--host <the host's address>` (without it the launcher advertises what the
    hostname resolves to); ifname: set GLOO_SOCKET_IFNAME to the host's interface.
    host_env: per host index, more environment. after_start(procs): called once the
    launchers started (e.g. to pull a cable mid-job). logs: by global rank."""
    base = dict(os.environ)
    base.update({"OMP_NUM_THREADS": "1", "PADDLE_EXT_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                 **launcher_port_range()})
    base.update(env or {})
    master = f"{hosts.hosts[0].address}:{MASTER_PORT}"
    work_dirs, procs = [], []
    start = time.monotonic()
    for i, host in enumerate(hosts.hosts):
        work_dir = tempfile.mkdtemp(prefix=f"paddle_ext_host{i}_")
        work_dirs.append(work_dir)
        host_vars = dict(base)
        if ifname:
            host_vars["GLOO_SOCKET_IFNAME"] = host.iface
        host_vars.update((host_env or {}).get(i, {}))
        cmd = ["ip", "netns", "exec", host.netns, sys.executable, "-m", "paddle.distributed.launch",
               "--master", master, "--nnodes", str(hosts.count), "--rank", str(i),
               "--nproc_per_node", str(nproc_per_host), "--log_dir", work_dir]
        if advertise:
            cmd += ["--host", host.address]
        cmd += [RANK_ENTRY, os.path.join(SCRIPTS, script), *args]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=host_vars, cwd=work_dir, start_new_session=True))
    if after_start is not None:
        after_start(procs)
    outputs, timed_out = [], False
    try:
        for proc in procs:
            out, late = communicate_by(proc, max(0.1, timeout - (time.monotonic() - start)))
            timed_out |= late
            outputs.append(out)
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elapsed = time.monotonic() - start
    logs = {}
    for i, work_dir in enumerate(work_dirs):
        for local in range(nproc_per_host):
            path = os.path.join(work_dir, f"workerlog.{local}")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    logs[i * nproc_per_host + local] = f.read()
        shutil.rmtree(work_dir, ignore_errors=True)
    codes = [p.returncode for p in procs]
    returncode = next((c for c in codes if c != 0), 0)
    output = "".join(f"=== host {i} (rc {c}) ===\n{o}" for i, (c, o) in enumerate(zip(codes, outputs)))
    return LaunchResult(returncode, elapsed, output, logs, timed_out)
