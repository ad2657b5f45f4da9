"""Split backward for zero-bubble schedules: I(chunk, mb) computes the input
gradients now, W(chunk, mb) the deferred weight gradients later.

Why this shape. A zero-bubble schedule needs the gradient a rank sends upstream
(I) without the weight gradients nothing downstream waits for (W). Paddle's own
answer (`WeightGradStore.put` in PyLayers such as SplitBWLinear, used by its
DualPipeV) needs the model written with those layers; torch.distributed.pipelining
splits the autograd graph and recomputes paths. Here the model stays as the user
wrote it: while a chunk's forward runs under `WeightGradStore.capture`, the
matmuls whose weight is a parameter - paddle.nn.Linear (through
paddle.nn.functional.linear), fleet's ColumnParallelLinear / RowParallelLinear
(their `linear` member) and `paddle.matmul(x, param)` in the model's own code -
run as `_SplitMatmul`, a PyLayer that gets the weight without an autograd edge:
its backward returns dX and records (x, dY) for W. The bias (an `add` after the
matmul) and every other parameter get their gradients from autograd in I, exactly
as in a plain backward. Only the forwards of micro-batches whose backward is an I
are captured; a B stays Paddle's own backward.

Exactness (bitwise equal to B, fp32 CPU). dX and dW are Paddle's own matmul
kernel with the transposes matmul_grad uses (tests compare them with the native
backward bit for bit). W hands dW to the weight's own accumulation node (a
backward started at the leaf), so `grad` accumulation, GradScaler-scaled
gradients, `main_grad` hooks (fleet's MixPrecisionLayer) and the dp/sharding
bucket hooks (grad_sync.py) see the very same additions as in a plain backward,
in W order. A weight used by several captured matmuls of one forward (a Linear
applied twice, two layers sharing a weight) gets their dWs summed in the order
their backwards ran in I, which is the order autograd sums them in before the
accumulation. Weights held by two chunks of this rank are not captured (their
cross-chunk order is the schedule's). A weight that also gets a native gradient in
I (a use not captured: an Embedding lookup of a weight tied to a head matmul in
the same chunk) has that step's sum split, (grad + native) + deferred instead of
grad + (native + deferred): the step names it in `mixed` (one rounding of
difference at most) and the weight is left to autograd from then on. W for one
chunk must run in its I order (the schedules do) for the cross-micro-batch sums
to match B's; `reordered` names the exceptions.

Devices. Linear is captured where F.linear is a matmul then an add (CPU:
linear_is_matmul_then_add); elsewhere it keeps Paddle's kernel (possibly a
fused GEMM with bias) and its gradients come in I. Bitwise equality is tested on
fp32 CPU.

Memory. A pending W holds x and dY of each deferred matmul (x is the saved
activation a plain backward would have freed at B); `pending_bytes` /
`peak_pending_bytes` account for them (each tensor counted once).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import paddle
from paddle import _C_ops

from paddle_ext import devices

__all__ = ["WeightGradStore", "SplitStats"]

Key = tuple[int, int]  # (chunk, micro-batch)


def _mp_linear_types() -> tuple[type, ...]:
    try:
        from paddle.distributed.fleet.layers.mpu import mp_layers
    except ImportError:  # a build without fleet
        return ()
    return tuple(getattr(mp_layers, n) for n in ("ColumnParallelLinear", "RowParallelLinear") if hasattr(mp_layers, n))


def linear_is_matmul_then_add() -> bool:
    """Whether paddle.nn.functional.linear in dygraph computes a matmul, then adds the bias
    (Paddle's `linear` op on CPU, 2.6 and 3.x; tested bit for bit against a split matmul).
    On CUDA builds 3.x may run a fused GEMM with the bias in its epilogue (linear_v2,
    cublasLt), whose rounding a separate matmul and add need not reproduce."""
    return devices.tensor_device_kind() == "cpu"


def _nbytes(t: paddle.Tensor) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n * int(t.element_size())


@dataclass
class _Deferred:
    """What one matmul's dW needs: y = x @ w (trans_y: x @ w^T)."""

    weight: Any
    x: paddle.Tensor
    dy: paddle.Tensor
    trans_y: bool

    def weight_grad(self) -> paddle.Tensor:
        k = int(self.x.shape[-1])
        n = int(self.dy.shape[-1])
        x2 = self.x.reshape([-1, k]) if len(self.x.shape) != 2 else self.x
        dy2 = self.dy.reshape([-1, n]) if len(self.dy.shape) != 2 else self.dy
        if self.trans_y:  # w is [n, k]: dW = dY^T x
            return _C_ops.matmul(dy2, x2, True, False)
        return _C_ops.matmul(x2, dy2, True, False)  # w is [k, n]: dW = x^T dY


@dataclass
class SplitStats:
    """One step's figures: deferred matmuls, the bytes pending W held at most, and
    the exceptions to exactness described in the module docstring."""

    deferred: int = 0
    peak_pending_bytes: int = 0
    mixed: list = field(default_factory=list)      # parameter names whose sum was split
    reordered: list = field(default_factory=list)  # (chunk, mb) Ws run out of their I order


@dataclass(frozen=True)
class _Weight:
    param: Any


class _SplitMatmul(paddle.autograd.PyLayer):
    """y = x @ w (or x @ w^T) with w detached: the backward returns dX and records
    (x, dY) for W; the weight has no autograd edge, so I leaves it untouched."""

    @staticmethod
    def forward(ctx: Any, x: paddle.Tensor, weight: _Weight, trans_y: bool, store: Any, key: Key) -> paddle.Tensor:
        w = weight.param  # in a holder: a tensor argument would get an autograd edge
        ctx.w, ctx.trans_y, ctx.store, ctx.key = w, trans_y, store, key
        ctx.save_for_backward(x)
        return _C_ops.matmul(x, w.detach(), False, trans_y)

    @staticmethod
    def backward(ctx: Any, dy: paddle.Tensor) -> paddle.Tensor:
        (x,) = ctx.saved_tensor()
        w = ctx.w
        dx = _C_ops.matmul(dy, w.detach(), False, not ctx.trans_y)
        store = ctx.store()
        if store is not None:
            store.record(ctx.key, _Deferred(w, x.detach(), dy, ctx.trans_y))
        return dx


class WeightGradStore:
    """Deferred weight gradients of one pipeline rank, keyed by (chunk, mb).

    Use: `bind(chunks)` once (the rank's model chunks, chunk index order); run each
    forward whose backward will be an I inside `capture(chunk, mb)`; run I as
    `input_backward(chunk, mb, fn)` (fn: the backward, e.g. loss.backward); later
    `weight_backward(chunk, mb)`. `begin_step` / `end_step` around a training step.
    A forward not captured is a plain one (its B computes everything)."""

    def __init__(self) -> None:
        self._chunk_layers: list[list[Any]] = []
        self._deferrable: dict[int, int] = {}  # id(param) -> the one chunk of this rank holding it
        self._never: set[int] = set()           # learned: it also gets a native gradient
        self._captured: dict[Key, set[int]] = {}
        self._pending: dict[Key, list[_Deferred]] = {}
        self._i_order: dict[int, list[int]] = {}
        self._input_key: Optional[Key] = None
        self._hooked: set[int] = set()
        self.pending_bytes = 0
        self.stats = SplitStats()
        self.last: Optional[SplitStats] = None

    # --- set-up ----------------------------------------------------------------------
    def bind(self, chunks: Sequence[Any]) -> WeightGradStore:
        """chunks: per local chunk, its layers (a Layer or a list of them)."""
        owners: dict[int, set[int]] = {}
        self._chunk_layers = []
        mp_types = _mp_linear_types()
        for c, chunk in enumerate(chunks):
            layers = [chunk] if isinstance(chunk, paddle.nn.Layer) else list(chunk)
            mp: list[Any] = []
            for layer in layers:
                if not isinstance(layer, paddle.nn.Layer):
                    continue
                for p in layer.parameters():
                    owners.setdefault(id(p), set()).add(c)
                mp += [s for s in [layer, *layer.sublayers()] if mp_types and isinstance(s, mp_types)]
            self._chunk_layers.append(mp)
        self._deferrable = {pid: next(iter(cs)) for pid, cs in owners.items() if len(cs) == 1}
        return self

    def _hook_native(self, param: Any) -> None:
        """Learns weights that also get a native gradient: their accumulation runs in I."""
        if id(param) in self._hooked:
            return
        self._hooked.add(id(param))
        store = weakref.ref(self)
        pid, name = id(param), param.name

        def hook(*_: Any) -> None:
            self = store()
            if self is None or self._input_key is None or pid in self._never:
                return
            if pid in self._captured.get(self._input_key, ()):
                self._never.add(pid)
                self.stats.mixed.append(name)

        param._register_backward_hook(hook)

    # --- one step -----------------------------------------------------------------
    def begin_step(self) -> None:
        """A new step; what a failed step left behind is dropped."""
        self.stats = SplitStats()
        self._i_order = {}
        self._pending.clear()
        self._captured.clear()
        self.pending_bytes = 0

    def end_step(self) -> SplitStats:
        if self._pending:
            left = ", ".join(f"{c}.{m}" for c, m in sorted(self._pending))
            self._pending.clear()
            self.pending_bytes = 0
            raise RuntimeError(f"weight gradients of {left} were deferred and never computed: the schedule "
                               "has an I without its W")
        self.last = self.stats
        return self.stats

    def _capturable(self, chunk: int, x: Any, w: Any) -> bool:
        return (isinstance(w, paddle.Tensor) and isinstance(x, paddle.Tensor) and not w.stop_gradient
                and not x.stop_gradient and w.is_leaf and len(w.shape) == 2 and len(x.shape) >= 2
                and self._deferrable.get(id(w), -1) == chunk and id(w) not in self._never
                and paddle.is_grad_enabled())

    @contextlib.contextmanager
    def capture(self, chunk: int, mb: int) -> Iterator[None]:
        """Runs the forward of (chunk, mb) with its parameter matmuls split."""
        key = (chunk, mb)
        captured = self._captured.setdefault(key, set())
        store = weakref.ref(self)
        f_linear = paddle.nn.functional.linear
        p_matmul = paddle.matmul

        def split(x: Any, w: Any, trans_y: bool) -> Optional[paddle.Tensor]:
            if not self._capturable(chunk, x, w):
                return None
            captured.add(id(w))
            self._hook_native(w)
            return _SplitMatmul.apply(x, _Weight(w), trans_y, store, key)

        split_linear = linear_is_matmul_then_add()  # else Linear keeps Paddle's own kernel

        def linear(x: Any, weight: Any, bias: Any = None, name: Any = None) -> Any:
            out = split(x, weight, False) if split_linear else None
            if out is None:
                return f_linear(x, weight, bias, name)
            return out if bias is None else _C_ops.add(out, bias)

        def matmul(x: Any, y: Any, transpose_x: bool = False, transpose_y: bool = False, name: Any = None) -> Any:
            out = None if transpose_x else split(x, y, transpose_y)
            return p_matmul(x, y, transpose_x, transpose_y, name) if out is None else out

        mp_layers = self._chunk_layers[chunk] if chunk < len(self._chunk_layers) else []
        swapped = [layer for layer in mp_layers if layer.__dict__.get("linear") is f_linear]
        paddle.nn.functional.linear = linear
        paddle.matmul = matmul
        for layer in swapped:
            layer.__dict__["linear"] = linear
        try:
            yield
        finally:
            for layer in swapped:
                layer.__dict__["linear"] = f_linear
            paddle.matmul = p_matmul
            paddle.nn.functional.linear = f_linear

    def record(self, key: Key, entry: _Deferred) -> None:
        """A split matmul's backward ran: keep what its dW needs until W(key)."""
        entries = self._pending.setdefault(key, [])
        held = {t.data_ptr() for e in entries for t in (e.x, e.dy)}
        for t in (entry.x, entry.dy):
            if t.data_ptr() not in held:
                held.add(t.data_ptr())
                self.pending_bytes += _nbytes(t)
        entries.append(entry)
        self.stats.deferred += 1
        self.stats.peak_pending_bytes = max(self.stats.peak_pending_bytes, self.pending_bytes)

    def input_backward(self, chunk: int, mb: int, backward: Callable[[], None]) -> None:
        """I(chunk, mb): runs `backward`; the captured weights' gradients wait for W."""
        key = (chunk, mb)
        self._input_key = key
        try:
            backward()
        finally:
            self._input_key = None
        self._i_order.setdefault(chunk, []).append(mb)

    def weight_backward(self, chunk: int, mb: int) -> int:
        """W(chunk, mb): each recorded weight's dW (several uses summed in the order their
        backwards ran, as autograd sums them) accumulated through the weight's own
        accumulation node. Returns how many weights got one."""
        key = (chunk, mb)
        order = self._i_order.get(chunk, [])
        if order and order[0] != mb:
            self.stats.reordered.append(key)
        if mb in order:
            order.remove(mb)
        self._captured.pop(key, None)
        entries = self._pending.pop(key, [])
        held = {t.data_ptr(): _nbytes(t) for e in entries for t in (e.x, e.dy)}
        grads: dict[int, list] = {}
        for e in entries:
            grad = e.weight_grad()
            slot = grads.setdefault(id(e.weight), [e.weight, None])
            slot[1] = grad if slot[1] is None else slot[1] + grad
            e.x = e.dy = None  # type: ignore[assignment]
        if grads:  # one backward for all: each weight still gets exactly one addition
            weights, dws = zip(*grads.values())
            paddle.autograd.backward(list(weights), list(dws))
        self.pending_bytes -= sum(held.values())
        return len(grads)

    def has_pending(self, chunk: int, mb: int) -> bool:
        return (chunk, mb) in self._pending
