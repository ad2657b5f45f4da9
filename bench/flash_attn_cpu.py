"""FlashAttention on CPU: paddle_ext's tiled kernel against Paddle's own CPU
flash_attention (the S x S math path) and, when PyTorch is importable (or
--torch-python names an interpreter that has it), PyTorch's CPU
scaled_dot_product_attention, all measured in this run.

B=1, H=8, D=64, float32 by default; for every S, causal or not, forward and
forward+backward, at each thread count (each library set to it: paddle_ext
with paddle_ext.ops.set_num_threads, Paddle with paddle.base.core.set_num_threads,
PyTorch with torch.set_num_threads) it prints:
  - paddle_ext's time (median of calls interleaved with the references', so a
    load change on this shared machine hits all of them alike), its GFLOP/s
    and that as a fraction of a GEMM measured here at the same thread count;
  - time ratios: reference time / paddle_ext time (> 1 = paddle_ext faster).
FLOPs count only what the attention needs: 4 S^2 D per head forward (exactly
half of it causal, flash-attention's convention), 2.5 times that for the
backward pass.

Then (--memory-seq, default 4096) the extra peak memory of one call beyond its
inputs (outputs included), each implementation in a fresh process: the peak
RSS during the call (VmHWM, reset just before through /proc/self/clear_refs)
minus the RSS before it.

Then (--flashmask-seq, default 4096) FlashMask with a causal document mask of
2 and 8 equal documents against plain causal attention at that S: time per
unmasked FLOP (the visible pairs, counted like causal's) as a ratio to plain
causal's (target <= 1.2), and the same for the documents run as separate
causal sequences (batch = documents): what short attention costs per FLOP
without any mask. The kernel reads such a mask as documents and runs them as
variable-length attention (no tile straddles a document end; other masks are
tiled, hidden tiles skipped), so the two columns should agree; what remains
above 1 is short causal attention's own cost (diagonal tiles, per-block and
per-call work weigh more on a small quadratic part).

Run: python bench/flash_attn_cpu.py [--seqs 512,1024,2048,4096] [--threads 1,2]
     [--repeats 5] [--torch-python /path/to/python] [--memory-seq 4096]
     [--paddle-max-seq 4096] [--clock wall|cpu] [--flashmask-repeats 15]
(--clock cpu times process CPU time, with --threads 1: steadier on a loaded
machine, since it leaves out the time spent waiting for a core.)
With more than one thread it runs with KMP_BLOCKTIME=0 unless told
otherwise, and each timed call follows an untimed one of the same
implementation (quiet_openmp()): no library is timed beside another's
spinning OpenMP workers or on a core still waking up.
Python's garbage collector is off while calls are timed (as in timeit; without_gc()).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.abspath(__file__)
# --clock cpu: process CPU time instead of wall time (1 thread only): on a shared,
# loaded machine it leaves out the time the process waited for a core.
CLOCK = time.process_time if os.environ.get("FLASH_ATTN_BENCH_CLOCK") == "cpu" else time.perf_counter


def attention_flops(s: int, heads: int, d: int, causal: bool, backward: bool) -> float:
    # Causal: half of the non-causal count, as flash-attention's own benchmark
    # counts it (the S/2 diagonal entries it leaves out would flatter causal).
    pairs = s * s / 2 if causal else s * s
    fwd = 4.0 * heads * pairs * d
    return fwd * 3.5 if backward else fwd


# ----------------------------------------------------------- implementations

class Paddle:
    """paddle_ext's kernel ("ext") or Paddle's own function ("paddle")."""

    def __init__(self, which: str, b: int, s: int, h: int, d: int, causal: bool, backward: bool):
        import paddle

        import paddle_ext.ops as ops
        from paddle_ext.ops.flash_attention import flash_attention

        self.paddle, self.ops = paddle, ops
        rng = np.random.default_rng(0)
        make = lambda: paddle.to_tensor(rng.standard_normal((b, s, h, d)).astype(np.float32),  # noqa: E731
                                        stop_gradient=not backward)
        self.q, self.k, self.v = make(), make(), make()
        self.dout = paddle.to_tensor(rng.standard_normal((b, s, h, d)).astype(np.float32))
        if which == "ext":
            self.fn = lambda: flash_attention(self.q, self.k, self.v, causal=causal)[0]
        else:
            import paddle.nn.functional.flash_attention as module

            original = module.flash_attention
            while getattr(original, "__paddle_ext_unit__", None) is not None:
                original = original.__wrapped__
            self.fn = lambda: original(self.q, self.k, self.v, 0.0, causal, False)[0]
        self.which, self.backward = which, backward

    def set_threads(self, n: int) -> None:
        self.paddle.base.core.set_num_threads(n)
        self.ops.set_num_threads(n)

    def __call__(self):
        out = self.fn()
        if self.backward:
            return self.paddle.grad([out], [self.q, self.k, self.v], [self.dout])
        return out


class FlashMask(Paddle):
    """paddle_ext's FlashMask kernel with a causal mask of `docs` equal documents."""

    def __init__(self, b: int, s: int, h: int, d: int, docs: int, backward: bool):
        super().__init__("ext", b, s, h, d, True, backward)
        from paddle_ext.ops.flashmask import flashmask_attention

        ends = (np.arange(s) // (s // docs) + 1) * (s // docs)
        mask = self.paddle.to_tensor(np.minimum(ends, s).astype(np.int32).reshape(1, 1, s, 1))
        self.fn = lambda: flashmask_attention(self.q, self.k, self.v, mask, causal=True)


def document_mask_flops(s: int, heads: int, d: int, docs: int, backward: bool) -> float:
    return docs * attention_flops(s // docs, heads, d, True, backward)


class Torch:
    def __init__(self, b: int, s: int, h: int, d: int, causal: bool, backward: bool):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F
        g = torch.Generator().manual_seed(0)
        make = lambda: torch.randn(b, h, s, d, generator=g, requires_grad=backward)  # noqa: E731
        self.q, self.k, self.v = make(), make(), make()
        self.dout = torch.randn(b, h, s, d, generator=g)
        self.causal, self.backward = causal, backward

    def set_threads(self, n: int) -> None:
        self.torch.set_num_threads(n)

    def __call__(self):
        out = self.F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=self.causal)
        if self.backward:
            return self.torch.autograd.grad(out, (self.q, self.k, self.v), self.dout)
        return out


def gemm_seconds(lib: str, n: int, threads: int) -> float:
    if lib == "paddle":
        import paddle

        paddle.base.core.set_num_threads(threads)
        a = paddle.to_tensor(np.ones((n, n), np.float32))
        fn = lambda: paddle.matmul(a, a)  # noqa: E731
    else:
        import torch

        torch.set_num_threads(threads)
        a = torch.ones(n, n)
        fn = lambda: a @ a  # noqa: E731
    fn()
    samples = []
    for _ in range(5):
        t0 = CLOCK()
        fn()
        samples.append(CLOCK() - t0)
    return statistics.median(samples)


# -------------------------------------------------- torch in another process

class TorchWorker:
    """PyTorch timings in-process when importable, else from a child running
    `--torch-python`; None when neither is available."""

    @staticmethod
    def start(torch_python: str | None):
        try:
            import torch  # noqa: F401
            return TorchWorker(None)
        except ImportError:
            pass
        if torch_python:
            return TorchWorker(torch_python)
        return None

    def __init__(self, python: str | None):
        self.proc = None
        self.current = None
        self.key = None
        if python:
            self.proc = subprocess.Popen([python, HERE, "--torch-worker"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
            self.version = self._ask({"op": "version"})["version"]
        else:
            import torch

            self.version = torch.__version__

    def _ask(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def setup(self, cfg: dict, threads: int) -> None:
        if self.proc:
            self._ask({"op": "setup", "cfg": cfg, "threads": threads})
            return
        key = json.dumps(cfg, sort_keys=True)
        if key != self.key:
            self.current, self.key = Torch(**cfg), key
        self.current.set_threads(threads)
        self.current()

    def once(self) -> float:
        if self.proc:
            return self._ask({"op": "once"})["seconds"]
        t0 = CLOCK()
        self.current()
        return CLOCK() - t0

    def gemm(self, n: int, threads: int) -> float:
        if self.proc:
            return self._ask({"op": "gemm", "n": n, "threads": threads})["seconds"]
        return gemm_seconds("torch", n, threads)

    def close(self) -> None:
        if self.proc:
            self.proc.stdin.close()
            self.proc.wait()


def torch_worker_main() -> None:
    import torch

    current = None
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "version":
            reply = {"version": torch.__version__}
        elif msg["op"] == "setup":
            current = Torch(**msg["cfg"])
            current.set_threads(msg["threads"])
            current()
            reply = {}
        elif msg["op"] == "once":
            t0 = CLOCK()
            current()
            reply = {"seconds": CLOCK() - t0}
        else:
            reply = {"seconds": gemm_seconds("torch", msg["n"], msg["threads"])}
        print(json.dumps(reply), flush=True)


def quiet_openmp(thread_counts: list[int]) -> str | None:
    """With more than one thread, KMP_BLOCKTIME=0 (unless set) before Paddle
    loads MKL: its Intel OpenMP workers otherwise spin for 200 ms after every
    parallel region (Paddle's calls and, since it shares those threads,
    paddle_ext's) and, with no spare core, take the core the PyTorch worker
    process's next call needs. Measured here at 2 threads, S=1024, when
    paddle_ext still ran on threads of its own: its forward took 14-15 ms back
    to back, 27 ms right after a Paddle call, and 15-28 ms after a pause of
    0.2-1 s (sleeping past the spin does not help: this VM's idle second core
    comes back slowly, which is why, at more than one thread, every timed call
    follows an untimed one of the same implementation). The price: Paddle's math
    path, many small MKL calls, gets slower at 2 threads (S=2048: about 1.5 s
    instead of 0.4 s), so its ratio there flatters paddle_ext; the note
    printed says so."""
    if max(thread_counts) <= 1 or "KMP_BLOCKTIME" in os.environ:
        return None
    os.environ["KMP_BLOCKTIME"] = "0"  # the PyTorch worker process inherits it
    return ("KMP_BLOCKTIME=0 set by this bench (OpenMP workers sleep at once; it slows Paddle's "
            "math path at > 1 thread, so the Paddle ratios there flatter paddle_ext)")


@contextlib.contextmanager
def without_gc():
    """Python's cyclic garbage collector off while calls are timed, as timeit does. A
    collection starts inside whichever call crosses the allocation threshold and costs
    the same whatever the call: measured at 2 threads, the 8 x 512-token fwd+bwd
    (~47 ms) took 55-62 ms in 5 of 9 runs with it on, and in none of 5 with it off,
    while the 340 ms causal call beside it hardly moved."""
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def warm_up(impls: list, seconds: float) -> None:
    """Calls each of `impls` once, then all of them in turn until `seconds` have passed.
    After a 1-thread phase this VM's second core stays slow for a few hundred ms once
    work returns to it (measured: 2-thread fwd+bwd calls over 8 x 512 tokens took 74-76 ms
    for the first three, then 46-55 ms), longer than one warm-up call of a 14 ms forward;
    a second of work on both cores brings it back before anything is timed."""
    for impl in impls:
        impl()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for impl in impls:
            impl()


# ------------------------------------------------------------------- memory

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_child(which: str, s: int, causal: bool, backward: bool) -> None:
    """Peak RSS during one call minus RSS before it: the peak (VmHWM) is reset
    first through /proc/self/clear_refs, so the imports' own peak is not seen."""
    threads = int(os.environ.get("BENCH_THREADS", "2"))
    if which == "torch":
        impl = Torch(1, s, 8, 64, causal, backward)
    else:
        impl = Paddle(which, 1, s, 8, 64, causal, backward)
    impl.set_threads(threads)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kb("VmRSS")
    result = impl()
    peak = _status_kb("VmHWM")
    del result
    print(json.dumps({"extra_mb": (peak - before) / 1024.0}))


def measure_memory(which: str, s: int, causal: bool, backward: bool, python: str) -> float | None:
    cmd = [python, HERE, "--memory-child", which, str(s), str(int(causal)), str(int(backward))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])["extra_mb"] if proc.returncode == 0 and lines else None


# --------------------------------------------------------------------- main

def main() -> None:
    from _timing import print_cpu_math_path  # bench/ is sys.path[0] for a script

    print_cpu_math_path()
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", default="512,1024,2048,4096")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slow-seconds", type=float, default=3.0,
                        help="an implementation whose warm-up call took longer gets 2 timed calls")
    parser.add_argument("--paddle-max-seq", type=int, default=4096,
                        help="skip Paddle's math path above this length (it is slow and quadratic)")
    parser.add_argument("--torch-python", default=os.environ.get("PADDLE_EXT_BENCH_TORCH_PYTHON"))
    parser.add_argument("--memory-seq", type=int, default=4096, help="0 skips the memory table")
    parser.add_argument("--modes", default="fwd,fwd+bwd")
    parser.add_argument("--flashmask-seq", type=int, default=4096, help="0 skips the FlashMask rows")
    parser.add_argument("--flashmask-docs", default="2,8")
    parser.add_argument("--flashmask-repeats", type=int, default=15,
                        help="interleaved calls per FlashMask row (its 8-document forward takes ~14 ms at "
                             "2 threads: a median of 5 moved with every slow phase of this VM's second core)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time (only with --threads 1), for a loaded machine")
    args = parser.parse_args()
    if args.clock == "cpu":
        if args.threads != "1":
            parser.error("--clock cpu needs --threads 1 (CPU time adds up the threads)")
        os.environ["FLASH_ATTN_BENCH_CLOCK"] = "cpu"  # for the PyTorch worker process too
        global CLOCK
        CLOCK = time.process_time

    seqs = [int(x) for x in args.seqs.split(",")]
    thread_counts = [int(x) for x in args.threads.split(",")]
    openmp_note = quiet_openmp(thread_counts)

    import paddle

    from paddle_ext.ops.flash_attention import cpu_isa

    modes = [m == "fwd+bwd" for m in args.modes.split(",")]
    h, d = args.heads, args.head_dim
    torch_worker = TorchWorker.start(args.torch_python)
    print(f"flash attention on CPU: B=1 H={h} D={d} float32; paddle_ext ({cpu_isa()} kernels) vs Paddle "
          f"{paddle.__version__} flash_attention (math path)"
          + (f" and PyTorch {torch_worker.version} scaled_dot_product_attention" if torch_worker
             else " (PyTorch not importable: no PyTorch column; --torch-python PATH adds it)"))
    print(f"ratios: reference time / paddle_ext time (> 1: paddle_ext is faster); medians of "
          f"{args.repeats} interleaved calls; {args.clock} clock")
    if openmp_note:
        print(openmp_note)

    summary = []
    for threads in thread_counts:
        gemm_n = 2048
        gemm = 2.0 * gemm_n ** 3 / gemm_seconds("paddle", gemm_n, threads) / 1e9
        gemm_text = f"Paddle (MKL) {gemm:.0f}"
        if torch_worker:
            torch_gemm = 2.0 * gemm_n ** 3 / torch_worker.gemm(gemm_n, threads) / 1e9
            gemm_text += f", PyTorch {torch_gemm:.0f}"
            gemm = max(gemm, torch_gemm)
        print(f"\n== threads={threads}: float32 GEMM {gemm_n}^3 {gemm_text} GFLOP/s (ceiling used: {gemm:.0f})")
        for backward in modes:
            # causal right after non-causal at each S: their GFLOP/s ratio is
            # the figure most hurt by load drifting on a shared machine
            for s in seqs:
                for causal in (False, True):
                    cfg = dict(b=1, s=s, h=h, d=d, causal=causal, backward=backward)
                    impls = {"ext": Paddle("ext", **cfg)}
                    if s <= args.paddle_max_seq:
                        impls["paddle"] = Paddle("paddle", **cfg)
                    warm = {}
                    for name, impl in impls.items():
                        impl.set_threads(threads)
                        t0 = CLOCK()
                        impl()  # warm-up
                        warm[name] = CLOCK() - t0
                    if torch_worker:
                        torch_worker.setup(cfg, threads)
                    samples = {name: [] for name in list(impls) + (["torch"] if torch_worker else [])}
                    with without_gc():
                        for rep in range(args.repeats):
                            for name, impl in impls.items():
                                if warm[name] > args.slow_seconds and rep >= 2:
                                    continue  # Paddle's math path at large S: a median of 2 calls
                                if threads > 1 and warm[name] <= args.slow_seconds:
                                    impl()  # see quiet_openmp(): both cores awake for the timed call
                                t0 = CLOCK()
                                impl()
                                samples[name].append(CLOCK() - t0)
                            if torch_worker:
                                if threads > 1:
                                    torch_worker.once()
                                samples["torch"].append(torch_worker.once())
                    med = {name: statistics.median(v) for name, v in samples.items()}
                    flops = attention_flops(s, h, d, causal, backward) / 1e9
                    ours = med["ext"]
                    line = (f"S={s:5d} {'causal' if causal else 'full  '} {'fwd+bwd' if backward else 'fwd    '}: "
                            f"paddle_ext {ours * 1e3:8.1f} ms {flops / ours:6.1f} GFLOP/s "
                            f"({flops / ours / gemm:.2f} of GEMM)")
                    row = {"threads": threads, "s": s, "causal": causal, "backward": backward,
                           "ext_ms": ours * 1e3, "gflops": flops / ours}
                    if torch_worker:
                        line += f" | PyTorch {med['torch'] * 1e3:8.1f} ms -> {med['torch'] / ours:5.2f}x"
                        row["torch_ratio"] = med["torch"] / ours
                    if "paddle" in med:
                        line += f" | Paddle {med['paddle'] * 1e3:8.1f} ms -> {med['paddle'] / ours:5.2f}x"
                        row["paddle_ratio"] = med["paddle"] / ours
                    print(line, flush=True)
                    summary.append(row)
                    del impls
    if torch_worker:
        torch_worker.close()
        print("\nagainst PyTorch, S >= 1024 (targets: forward >= 0.8x, i.e. within 1.25x of its time; "
              "forward+backward >= 0.67x, i.e. within 1.5x):")
        for backward in modes:
            ratios = [r["torch_ratio"] for r in summary if r["backward"] == backward and r["s"] >= 1024]
            if ratios:
                print(f"  {'fwd+bwd' if backward else 'fwd'}: worst {min(ratios):.2f}x, median "
                      f"{statistics.median(ratios):.2f}x over {len(ratios)} configurations")
    per_flop = [(r, c) for r in summary if not r["causal"] for c in summary
                if c["causal"] and (c["threads"], c["s"], c["backward"]) == (r["threads"], r["s"], r["backward"])]
    if per_flop:
        print("\ncausal GFLOP/s / non-causal GFLOP/s (target for S >= 1024: >= 1, masked blocks skipped):")
        for r, c in per_flop:
            print(f"  threads={r['threads']} S={r['s']:5d} {'fwd+bwd' if r['backward'] else 'fwd    '}: "
                  f"{c['gflops'] / r['gflops']:.2f}")
        big = [c["gflops"] / r["gflops"] for r, c in per_flop if r["s"] >= 1024]
        if big:
            print(f"  worst for S >= 1024: {min(big):.2f}")

    if args.flashmask_seq:
        s, docs_list = args.flashmask_seq, [int(x) for x in args.flashmask_docs.split(",")]
        print(f"\nFlashMask, causal document mask, S={s}: time per unmasked FLOP / plain causal's "
              f"(target <= 1.2); medians of {args.flashmask_repeats} interleaved calls:")
        for threads in thread_counts:
            for backward in modes:
                impls = {"causal": Paddle("ext", 1, s, h, d, True, backward)}
                impls.update({docs: FlashMask(1, s, h, d, docs, backward) for docs in docs_list})
                # the same unmasked work as separate causal sequences (batch = documents)
                impls.update({-docs: Paddle("ext", docs, s // docs, h, d, True, backward) for docs in docs_list})
                samples = {name: [] for name in impls}
                for impl in impls.values():
                    impl.set_threads(threads)
                warm_up(list(impls.values()), 1.0 if threads > 1 else 0.0)
                with without_gc():
                    for _ in range(args.flashmask_repeats):
                        for name, impl in impls.items():
                            if threads > 1:
                                impl()
                            t0 = CLOCK()
                            impl()
                            samples[name].append(CLOCK() - t0)
                med = {name: statistics.median(v) for name, v in samples.items()}
                per_flop_causal = med["causal"] / attention_flops(s, h, d, True, backward)
                for docs in docs_list:
                    per_flop = med[docs] / document_mask_flops(s, h, d, docs, backward)
                    separate = med[-docs] / document_mask_flops(s, h, d, docs, backward)
                    print(f"  threads={threads} {'fwd+bwd' if backward else 'fwd    '} {docs} documents: "
                          f"{med[docs] * 1e3:8.1f} ms (plain causal {med['causal'] * 1e3:8.1f} ms) -> "
                          f"{per_flop / per_flop_causal:.2f}; as {docs} separate sequences of {s // docs}: "
                          f"{med[-docs] * 1e3:.1f} ms -> {separate / per_flop_causal:.2f}", flush=True)
                del impls

    if args.memory_seq:
        s = args.memory_seq
        python = sys.executable
        print(f"\nextra peak memory of one call beyond its inputs, S={s}, fresh process each (MB):")
        for backward in modes:
            for causal in (False, True):
                parts = []
                for which in ("ext", "paddle", "torch"):
                    py = args.torch_python if which == "torch" else python
                    if which == "torch" and not torch_worker:
                        continue
                    if which == "torch" and not py:
                        py = python
                    mb = measure_memory(which, s, causal, backward, py)
                    name = {"ext": "paddle_ext", "paddle": "Paddle", "torch": "PyTorch"}[which]
                    parts.append(f"{name} {mb:7.1f}" if mb is not None else f"{name} failed")
                print(f"  {'causal' if causal else 'full  '} {'fwd+bwd' if backward else 'fwd    '}: "
                      + " | ".join(parts))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        torch_worker_main()
    elif len(sys.argv) > 1 and sys.argv[1] == "--memory-child":
        which, s, causal, backward = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1"
        if which != "torch":
            sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
        memory_child(which, s, causal, backward)
    else:
        main()
