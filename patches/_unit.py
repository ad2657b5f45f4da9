"""What a patch unit is, the Patcher that makes every unit revertible, and
plugin_else_paddle, the rule by which a unit's wrapper refuses nothing Paddle accepts."""

from __future__ import annotations

import functools
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

_MISSING = object()


class Patcher:
    """Replaces attributes and remembers the originals, so that revert() puts
    back the very same objects (`is`-identical), in reverse order."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []
        self._imported: list[tuple[Any, Any]] = []  # (new, original) swapped with imported=True

    def swap(self, owner: Any, attr: str, new: Any, *, imported: bool = False) -> None:
        """owner.attr = new. imported=True: also every global of a loaded module
        (outside paddle_ext) bound to the same original object, the name a caller
        took with `from paddle... import f` before enable(); revert() puts the
        original back there, and in modules that imported `new` meanwhile."""
        # Read the owner's own dict: for classes that keeps staticmethod and
        # property objects intact, and an inherited attribute is deleted again.
        own = vars(owner) if hasattr(owner, "__dict__") else {}
        original = own.get(attr, _MISSING)
        setattr(owner, attr, new)
        self._undo.append((owner, attr, original))
        if imported and original is not _MISSING:
            for module, name in module_bindings(original):
                setattr(module, name, new)
                self._undo.append((module, name, original))
            self._imported.append((new, original))

    def revert(self) -> None:
        while self._undo:
            owner, attr, original = self._undo.pop()
            if original is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        while self._imported:
            new, original = self._imported.pop()
            for module, name in module_bindings(new):
                setattr(module, name, original)

    @property
    def active(self) -> bool:
        return bool(self._undo)


@dataclass(frozen=True)
class PatchUnit:
    """One cherry-picked upstream change, wired into stock Paddle.

    apply(patcher) installs it through the patcher (so revert is automatic);
    verify() checks that it is in place; native(version) says whether that
    Paddle release already ships the feature (then the unit does nothing);
    unavailable() gives a reason it cannot apply here, or None.
    """

    name: str
    upstream: tuple[int, ...]
    title: str
    summary: str
    apply: Callable[[Patcher], None]
    verify: Callable[[], bool]
    native: Callable[[tuple[int, int, int]], bool] = lambda version: False
    unavailable: Callable[[], str | None] = lambda: None
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def upstream_text(self) -> str:
        return ", ".join(f"#{n}" for n in self.upstream)


def module_bindings(obj: Any) -> list[tuple[types.ModuleType, str]]:
    """(module, name) for every global of a loaded module bound to obj itself (`is`),
    paddle_ext's own modules left out (they keep what they chose to hold). Reads the
    modules' dicts only, so lazy modules (transformers') import nothing."""
    found = []
    for module_name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType) or module_name.split(".", 1)[0] == "paddle_ext":
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        found.extend((module, name) for name, value in list(namespace.items()) if value is obj)
    return found


def plugin_else_paddle(plugin_call: Callable[[], Any], paddle_call: Callable[[], Any]) -> Any:
    """plugin_call's result; where the plugin refuses the call (its argument checks'
    errors, paddle_ext.ops._checks), paddle_call's: Paddle's own function, unchanged,
    so enabling the plugin refuses nothing Paddle accepts. The plugin's error is
    raised only when Paddle refuses the call too (its message names the argument),
    as an instance of Paddle's error class as well (both_refused). The checks run before any op is run or appended to a static program, so nothing
    is computed twice and a program gets only Paddle's ops for such a call."""
    from paddle_ext.ops._checks import InvalidArgumentError, UnsupportedDtypeError

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
