"""paddle.incubate.nn.functional.fused_rotary_position_embedding (and the paddle._C_ops op
Paddle's function calls) answered by the plugin's kernel: the wrappers the fused_rotary
patch unit installs (patches/fused_rotary.py says which call goes where and why).
"""

from __future__ import annotations

import contextvars
import functools
import inspect

from paddle_ext import devices
from paddle_ext.ops._modes import in_dynamic_mode
from paddle_ext.ops.rotary import fused_rotary_position_embedding
from paddle_ext.ops.routes import plugin_else_paddle

OPS = ("pe_rotary",)

OPTIONAL_3X = (("time_major", False), ("rotary_emb_base", 10000.0))  # (argument, default) 3.x added

# Set while the Python wrapper asks Paddle's own function after the plugin refused the
# call: the _C_ops wrapper below then hands it straight to Paddle's op instead of
# running the plugin's checks a second time.
_ASKING_PADDLE = contextvars.ContextVar("paddle_ext_rotary_asking_paddle", default=False)


def plugin_serves(q) -> bool:
    """Whether the plugin answers this call of Paddle's name: CPU tensors in dynamic
    mode, static programs on CPU builds (Paddle has no CPU kernel for either);
    elsewhere Paddle's kernel answers (patches/fused_rotary.py says why)."""
    import paddle

    if in_dynamic_mode():
        return isinstance(q, paddle.Tensor) and q.place.is_cpu_place()
    return devices.device_build() == "cpu"


def with_3x_signature(original):
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
        if not in_dynamic_mode():  # a static program on a CPU build: Paddle's op has no kernel
            return plugin_call()
        return plugin_else_paddle(plugin_call, paddle_call)

    return fused_rotary_position_embedding_3x


def c_op(original):
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

        if not in_dynamic_mode():
            return plugin_call()
        return plugin_else_paddle(plugin_call, lambda: original(*args))

    return fused_rotary_position_embedding_op
