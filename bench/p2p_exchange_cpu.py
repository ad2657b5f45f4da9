"""Batched p2p exchanges on gloo without threads, against blocking send + recv.

Why this bench: a pipeline rank's steady state on gloo sends one tensor to a
neighbour and receives one from it, each a blocking rendezvous on the compute
thread (pipeline/runtime/transport.py). Without a communication thread the only
ways to carry both in fewer operations are a two-rank collective (all_gather of
both tensors: one operation, both directions) or, for two tensors going the same
way, one message holding both (concat, then split on the receiver). This bench
times each against the reference, the pair of blocking send + recv the pipeline
uses, on one two-rank group, at the pipeline bench's activation size
(4 x 128 x 512 fp32 = 1 MiB) and at one 4x smaller. A ratio above 1 is slower than
the reference. (Measured: docs/zero_bubble.md, "Transfers".)

    python bench/p2p_exchange_cpu.py [--iters 100] [--numels 262144,65536]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench._launch import launch_ranks  # noqa: E402

REFERENCE = "send+recv"


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["launch", "rank"], default="launch")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--numels", default="262144,65536", help="fp32 elements per tensor, comma-separated")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def rank(a) -> None:
    import paddle.distributed as dist

    dist.init_parallel_env()
    group = dist.new_group([0, 1])
    pg, me = group.process_group, group.rank
    results = {numel: _time_variants(pg, group, me, numel, a.iters) for numel in (int(x) for x in a.numels.split(","))}
    if me == 0:
        with open(a.out, "w") as f:
            json.dump(results, f)


def _time_variants(pg, group, me: int, numel: int, iters: int) -> dict:
    """Seconds per iteration of each variant, ABBA-averaged, for one tensor size."""
    import paddle
    import paddle.distributed as dist

    peer = 1 - me
    mine, theirs = paddle.ones([numel]), paddle.empty([numel])
    gathered, both = paddle.empty([2 * numel]), paddle.empty([2 * numel])

    def send_recv():  # the reference: rank 0 sends first, rank 1 receives first
        if me == 0:
            pg.send(mine, peer, True).wait()
            pg.recv(theirs, peer, True).wait()
        else:
            pg.recv(theirs, peer, True).wait()
            pg.send(mine, peer, True).wait()

    def all_gather():  # both directions in one collective
        pg.all_gather(gathered, mine, True).wait()
        gathered[peer * numel:(peer + 1) * numel].clone()

    def two_sends():  # two tensors one way, two messages
        if me == 0:
            pg.send(mine, peer, True).wait()
            pg.send(mine, peer, True).wait()
        else:
            pg.recv(theirs, peer, True).wait()
            pg.recv(theirs, peer, True).wait()

    def one_message():  # the same two tensors as one message
        if me == 0:
            pg.send(paddle.concat([mine, mine]), peer, True).wait()
        else:
            pg.recv(both, peer, True).wait()
            paddle.split(both, 2)

    variants = {REFERENCE: send_recv, "all_gather exchange": all_gather,
                "2 sends one way": two_sends, "concat, 1 send": one_message}
    times: dict = {name: [] for name in variants}
    for order in (list(variants), list(variants)[::-1]):  # ABBA
        for name in order:
            fn = variants[name]
            for _ in range(5):
                fn()
            dist.barrier(group)
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            times[name].append((time.perf_counter() - start) / iters)
    return {name: sum(ts) / len(ts) for name, ts in times.items()}


def launch(a) -> None:
    out = launch_ranks(__file__, [f"--iters={a.iters}", f"--numels={a.numels}"], "p2p.json", nproc=2,
                       prefix="p2p_exchange_bench_", timeout=600)
    with open(out) as f:
        results = json.load(f)
    print(f"p2p_exchange_cpu: 2 gloo ranks, 1 thread each, {a.iters} iterations x 2 (ABBA); "
          f"load average {os.getloadavg()[0]:.1f}")
    for numel, row in results.items():
        ref = row[REFERENCE]
        print(f"  {int(numel) * 4 / 2**20:.2f} MiB per tensor: " + "; ".join(
            f"{name} {t * 1e3:.3f} ms ({t / ref:.2f}x {REFERENCE})" for name, t in row.items()))


def main(argv=None) -> None:
    a = parse_args(argv)
    {"launch": launch, "rank": rank}[a.mode](a)


if __name__ == "__main__":
    main()
