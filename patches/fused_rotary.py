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

A call the plugin refuses goes to Paddle's own function in dynamic mode (on a
GPU, Paddle's kernel takes k / v with a larger batch than q, leaving the rest
of their output unwritten, and rotary_emb_base <= 0, giving NaN / inf angles;
on CPU it has no kernel, so the plugin's error stands), as in the
flash_attention unit (patches/_unit.plugin_else_paddle). On CPU the plugin
computes a k / v of a larger batch itself, as the GPU kernel does for q's
batch (the entries it leaves unwritten are zeros).

Code that imported the function before enable() (`from
paddle.incubate.nn.functional import fused_rotary_position_embedding`) keeps
the object it imported.
"""

from __future__ import annotations

import functools
import importlib
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


def _with_3x_signature(original):
    @functools.wraps(original)
    def fused_rotary_position_embedding_3x(q, k=None, v=None, sin=None, cos=None, position_ids=None,
                                           use_neox_rotary_style=True, time_major=False,
                                           rotary_emb_base=10000.0):
        def plugin_call():
            return fused_rotary_position_embedding(
                q, k, v, sin=sin, cos=cos, position_ids=position_ids,
                use_neox_rotary_style=use_neox_rotary_style, time_major=time_major,
                rotary_emb_base=rotary_emb_base)

        if not compat.in_dynamic_mode():  # a static program: Paddle's op has no CPU kernel there
            return plugin_call()
        # 3.x's arguments only when set, so that 2.6's function fails only for a call that uses them
        extra = {name: value for name, value, default in (("time_major", time_major, False),
                                                          ("rotary_emb_base", rotary_emb_base, 10000.0))
                 if value != default}

        def paddle_call():
            return original(q, k, v, sin=sin, cos=cos, position_ids=position_ids,
                            use_neox_rotary_style=use_neox_rotary_style, **extra)

        return plugin_else_paddle(plugin_call, paddle_call)

    fused_rotary_position_embedding_3x.__paddle_ext_unit__ = "fused_rotary"
    return fused_rotary_position_embedding_3x


def _apply(patcher: Patcher) -> None:
    targets = owners()
    # One wrapper for both names, around the object the package exports.
    wrapper = _with_3x_signature(getattr(targets[0], NAME))
    for owner in targets:
        patcher.swap(owner, NAME, wrapper)


def _verify() -> bool:
    return all(getattr(getattr(owner, NAME), "__paddle_ext_unit__", None) == "fused_rotary"
               for owner in owners())


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
