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
patches too, so such callers reach the plugin for the calls above as well. The wrappers live in
paddle_ext.ops.routes.rotary.
"""

from __future__ import annotations

import importlib
import sys

from paddle_ext.ops.routes import rotary as routes
from paddle_ext.patches._unit import Patcher, PatchUnit, Wrap, install

PACKAGE = "paddle.incubate.nn.functional"
MODULE = PACKAGE + ".fused_rotary_position_embedding"
NAME = "fused_rotary_position_embedding"


def _c_ops():
    import paddle

    return paddle._C_ops


def _defining_module():
    """The module that defines the function: the package attribute of the same name is
    the function, not the module, so it is read from sys.modules."""
    importlib.import_module(MODULE)
    return sys.modules[MODULE]


# The package (what users call) and the defining module share one wrapper (install
# wraps one original once); the _C_ops op, where the release has it, gets its own.
TABLE = (
    Wrap(PACKAGE, NAME, routes.with_3x_signature),
    Wrap(_defining_module, NAME, routes.with_3x_signature),
    Wrap(_c_ops, NAME, routes.c_op, optional=True),
)


def owners() -> list:
    """The package and the module that define the function."""
    return [importlib.import_module(PACKAGE), _defining_module()]


def _apply(patcher: Patcher) -> None:
    install(patcher, TABLE)


UNIT = PatchUnit(
    name="fused_rotary",
    upstream=(54351, 56401, 61417),
    title="Add fused_rope forward op, rotate_half and time_major",
    summary="fused_rotary_position_embedding runs on CPU, static graphs too, and with the 3.x signature on 2.6.2",
    apply=_apply,
    requires_modules=(PACKAGE, MODULE),
    requires_ops=routes.OPS,
)
