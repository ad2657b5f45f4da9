"""How the plugin's ops answer calls of Paddle's own names: the wrappers the patch units
install (paddle_ext.patches) live in this package's modules, one per op family, and
plugin_else_paddle is the rule they share, by which a wrapper refuses nothing Paddle accepts.

Nothing here imports paddle_ext.patches: a unit names what to swap and takes its wrapper
from here.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from paddle_ext.ops._checks import InvalidArgumentError, UnsupportedDtypeError


def plugin_else_paddle(plugin_call: Callable[[], Any], paddle_call: Callable[[], Any]) -> Any:
    """plugin_call's result; where the plugin refuses the call (its argument checks'
    errors, paddle_ext.ops._checks), paddle_call's: Paddle's own function, unchanged,
    so enabling the plugin refuses nothing Paddle accepts. The plugin's error is
    raised only when Paddle refuses the call too (its message names the argument),
    as an instance of Paddle's error class as well (both_refused). The checks run before any op is run or appended to a static program, so nothing
    is computed twice and a program gets only Paddle's ops for such a call."""
    try:
        return plugin_call()
    except (InvalidArgumentError, UnsupportedDtypeError) as refusal:
        try:
            return paddle_call()
        except Exception as paddle_error:
            raise both_refused(refusal, paddle_error) from None


@functools.cache
def _joint_class(plugin_cls: type, paddle_cls: type) -> type:
    return type(plugin_cls.__name__, (plugin_cls, paddle_cls), {"__module__": plugin_cls.__module__})


def both_refused(refusal: Exception, paddle_error: Exception) -> Exception:
    """The error for a call the plugin and Paddle both refuse: the plugin's message
    (it names the argument, the value and the allowed range), with Paddle's reason
    appended, as an instance of the plugin's error class and of Paddle's, so that code
    catching what Paddle raises (a ValueError where the plugin's check saw a dtype, say)
    catches it as before. Paddle's own error where the two classes cannot be joined."""
    if isinstance(refusal, type(paddle_error)):
        return refusal
    reason = str(paddle_error).strip().splitlines()
    message = f"{refusal}\n(Paddle's own function refuses the call too: {type(paddle_error).__name__}: " \
              f"{reason[0] if reason else ''})"
    try:
        return _joint_class(type(refusal), type(paddle_error))(message)
    except TypeError:  # instance layouts that conflict, or a class that needs other arguments
        return paddle_error
