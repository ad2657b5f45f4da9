"""part-1 cherry from: Add fused_rope forward op (#54351), with its follow-ups
rotate_half (#56401) and time_major (#61417).

Upstream added paddle.incubate.nn.functional.fused_rotary_position_embedding
with GPU (and later XPU) kernels only: on CPU every release fails with "kernel
fused_rotary_position_embedding is not registered", and 2.6.2's function lacks
the 3.x arguments time_major and rotary_emb_base. This unit points Paddle's
function name at paddle_ext.ops.fused_rotary_position_embedding (CPU, CUDA and
HIP kernels, 3.3.1's signature and semantics), in dynamic mode and in static
graphs (paddle.static, to_static: the plugin's custom op, since Paddle's op has
no CPU kernel there either).

Which calls the plugin serves: CPU tensors in dynamic mode (Paddle has no CPU
kernel) and static programs on CPU builds. GPU (and other devices') tensors,
and static programs on GPU builds, keep Paddle's own kernel, which answers
there: the plugin's CUDA kernel computes float32 in double and would change
Paddle's bits (and has not yet run on a device). Only a call Paddle's function
cannot take at all, 3.x's time_major / rotary_emb_base on 2.6.2, goes to the
plugin on a GPU too.

A call the plugin refuses goes to Paddle's own function in dynamic mode (on CPU
it has no kernel, so the plugin's error stands), as in the flash_attention unit
(patches/_unit.plugin_else_paddle). On CPU the plugin computes a k / v of a
larger batch itself, as the GPU kernel does for q's batch (the entries it leaves
unwritten are zeros).

Code that imported the function before enable() (`from
paddle.incubate.nn.functional import fused_rotary_position_embedding as
fused_rope`, as PaddleFormers' ERNIE 4.5 models do at import) keeps the object
it imported, Paddle's function; that function calls
`paddle._C_ops.fused_rotary_position_embedding` at each call, which the unit
patches too, so such callers reach the plugin for the calls above as well.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import sys

from paddle_ext import compat
from paddle_ext.ops import _library
from paddle_ext.ops.rotary import fused_rotary_position_embedding
from paddle_ext.patches._unit import Patcher, PatchUnit, plugin_else_paddle

PACKAGE = "paddle.incubate.nn.functional"
MODULE = PACKAGE + ".fused_rotary_position_embedding"
NAME = "fused_rotary_position_embedding"


def owners() -> list:
    """The package (what users call) and the module that defines the function;
    the package attribute of the same name is the function, not the module."""
    package = importlib.import_module(PACKAGE)
    importlib.import_module(MODULE)
    return [package, sys.modules[MODULE]]


OPTIONAL_3X = (("time_major", False), ("rotary_emb_base", 10000.0))  # (argument, default) 3.x added

# Set while the Python wrapper asks Paddle's own function after the plugin refused the
# call: the _C_ops wrapper below then hands it straight to Paddle's op instead of
# running the plugin's checks a second time.
_ASKING_PADDLE = contextvars.ContextVar("paddle_ext_rotary_asking_paddle", default=False)


def plugin_serves(q) -> bool:
    """Whether the plugin answers this call of Paddle's name: CPU tensors in dynamic
    mode, static programs on CPU builds (Paddle has no CPU kernel for either);
    elsewhere Paddle's kernel answers (module docstring)."""
    import paddle

    if compat.in_dynamic_mode():
        return isinstance(q, paddle.Tensor) and q.place.is_cpu_place()
    return compat.device_build() == "cpu"


def _with_3x_signature(original):
    takes = set(inspect.signature(original).parameters)

    @functools.wraps(original)
    def fused_rotary_position_embedding_3x(q, k=None, v=None, sin=None, cos=None, position_ids=None,
                                           use_neox_rotary_style=True, time_major=False,
                                           rotary_emb_base=10000.0):
        def plugin_call():
            return fused_rotary_position_embedding(
                q, k, v, sin=sin, cos=cos, position_ids=position_ids,
                use_neox_rotary_style=use_neox_rotary_style, time_major=time_major,
                rotary_emb_base=rotary_emb_base)

        # 3.x's arguments only when set, so that 2.6's function fails only for a call that uses them
        given = {"time_major": time_major, "rotary_emb_base": rotary_emb_base}
        extra = {name: given[name] for name, default in OPTIONAL_3X if given[name] != default}

        def paddle_call():
            token = _ASKING_PADDLE.set(True)
            try:
                return original(q, k, v, sin=sin, cos=cos, position_ids=position_ids,
                                use_neox_rotary_style=use_neox_rotary_style, **extra)
            finally:
                _ASKING_PADDLE.reset(token)

        if not plugin_serves(q):
            # Paddle's kernel answers; the plugin only for what its function cannot take
            return paddle_call() if takes.issuperset(extra) else plugin_call()
        if not compat.in_dynamic_mode():  # a static program on a CPU build: Paddle's op has no kernel
            return plugin_call()
        return plugin_else_paddle(plugin_call, paddle_call)

    fused_rotary_position_embedding_3x.__paddle_ext_unit__ = "fused_rotary"
    return fused_rotary_position_embedding_3x


def _c_op(original):
    """paddle._C_ops' op, which Paddle's function calls with its arguments in order
    (3.x: q, k, v, sin, cos, position_ids, use_neox_rotary_style, time_major,
    rotary_emb_base; 2.6 without the last two): the plugin for the calls it serves,
    when the caller is not the Python wrapper above."""

    @functools.wraps(original)
    def fused_rotary_position_embedding_op(*args):
        if _ASKING_PADDLE.get() or not args or not plugin_serves(args[0]):
            return original(*args)
        q, k, v, sin, cos, position_ids, neox, *rest = args
        extra = dict(zip((name for name, _ in OPTIONAL_3X), rest))

        def plugin_call():
            return fused_rotary_position_embedding(q, k, v, sin=sin, cos=cos, position_ids=position_ids,
                                                   use_neox_rotary_style=neox, **extra)

        if not compat.in_dynamic_mode():
            return plugin_call()
        return plugin_else_paddle(plugin_call, lambda: original(*args))

    fused_rotary_position_embedding_op.__paddle_ext_unit__ = "fused_rotary"
    return fused_rotary_position_embedding_op


def _c_ops():
    import paddle

    return paddle._C_ops


def _apply(patcher: Patcher) -> None:
    targets = owners()
    # One wrapper for both names, around the object the package exports.
    wrapper = _with_3x_signature(getattr(targets[0], NAME))
    for owner in targets:
        patcher.swap(owner, NAME, wrapper)
    ops = _c_ops()
    if hasattr(ops, NAME):
        patcher.swap(ops, NAME, _c_op(getattr(ops, NAME)))


def _verify() -> bool:
    ops = _c_ops()
    return all(getattr(getattr(owner, NAME), "__paddle_ext_unit__", None) == "fused_rotary"
               for owner in owners() + ([ops] if hasattr(ops, NAME) else []))


def _unavailable() -> str | None:
    try:
        owners()
    except ImportError as err:
        return f"this Paddle has no {MODULE} ({err})"
    try:
        _library.load()
    except _library.OpLibraryError as err:
        return str(err)
    return None


UNIT = PatchUnit(
    name="fused_rotary",
    upstream=(54351, 56401, 61417),
    title="Add fused_rope forward op, rotate_half and time_major",
    summary="fused_rotary_position_embedding runs on CPU, static graphs too, and with the 3.x signature on 2.6.2",
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
