"""What a patch unit is, and the Patcher that makes every unit revertible and verifiable.

A unit is data: its names, the upstream PRs it carries, what it needs here
(requires_ops / requires_modules / requires), from which Paddle release it is native
(native_from), and apply(patcher), which installs the implementation from paddle_ext
through the patcher (often from a table of Wrap rows, installed by one loop). The
patcher records every swap, so revert() puts back the very objects, and verify is the
same for every unit: each recorded swap still holds (Patcher.problems).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import itertools
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from paddle_ext import compat

MISSING = object()  # Swap.original where the owner had no attribute of its own
_ORDER = itertools.count()


@dataclass
class Swap:
    """One recorded owner.attr = new (in place of original), with the module globals an
    imported=True swap rebound to new as well; seq orders every swap of every patcher."""

    owner: Any
    attr: str
    new: Any
    original: Any  # MISSING where the owner's own dict had no such attribute
    bindings: list[tuple[types.ModuleType, str]] = field(default_factory=list)
    seq: int = field(default_factory=lambda: next(_ORDER))

    def placements(self) -> list[tuple[Any, str]]:
        """Where this swap put `new`: owner.attr and each module global it rebound."""
        return [(self.owner, self.attr), *self.bindings]


def _expected(swap: Swap, owner: Any, attr: str, others: Iterable[Swap]) -> Any:
    """What owner.attr holds while `swap` holds: its object, or the object of a later swap
    (another unit's, in order) that wrapped it there (comm_debug traces the gloo methods
    gloo_calc_stream installed)."""
    expected = swap.new
    later = sorted((o for o in others if o.seq > swap.seq), key=lambda o: o.seq)
    for other in later:
        if any(o is owner and a == attr for o, a in other.placements()) and other.original is expected:
            expected = other.new
    return expected


def describe(owner: Any, attr: str) -> str:
    """owner.attr as a reader finds it: module.attr, module.Class.attr."""
    if isinstance(owner, types.ModuleType):
        where = owner.__name__
    elif isinstance(owner, type):
        where = f"{owner.__module__}.{owner.__qualname__}"
    else:
        where = f"{type(owner).__module__}.{type(owner).__qualname__} object"
    return f"{where}.{attr}"


def _own(owner: Any, attr: str) -> Any:
    """owner.attr from the owner's own dict (a class keeps its staticmethod and property
    objects there), or MISSING."""
    try:
        return vars(owner).get(attr, MISSING)
    except TypeError:  # no __dict__
        return getattr(owner, attr, MISSING)


class Patcher:
    """Replaces attributes and remembers the originals, so that revert() puts
    back the very same objects (`is`-identical), in reverse order; what it installed
    is recorded too (swaps), so that problems() can say which swap no longer holds."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []
        self._imported: list[tuple[Any, Any]] = []  # (new, original) swapped with imported=True
        self.swaps: list[Swap] = []

    def swap(self, owner: Any, attr: str, new: Any, *, imported: bool = False) -> None:
        """owner.attr = new. imported=True: also every global of a loaded module
        (outside paddle_ext) bound to the same original object, the name a caller
        took with `from paddle... import f` before enable(); revert() puts the
        original back there, and in modules that imported `new` meanwhile."""
        # Read the owner's own dict: for classes that keeps staticmethod and
        # property objects intact, and an inherited attribute is deleted again.
        original = _own(owner, attr)
        setattr(owner, attr, new)
        self._undo.append((owner, attr, original))
        record = Swap(owner, attr, new, original)
        if imported and original is not MISSING:
            for module, name in module_bindings(original):
                setattr(module, name, new)
                self._undo.append((module, name, original))
                record.bindings.append((module, name))
            self._imported.append((new, original))
        self.swaps.append(record)

    def revert(self) -> None:
        while self._undo:
            owner, attr, original = self._undo.pop()
            if original is MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        while self._imported:
            new, original = self._imported.pop()
            for module, name in module_bindings(new):
                setattr(module, name, original)
        self.swaps.clear()

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def problems(self, others: Iterable[Swap] = ()) -> list[str]:
        """For each recorded swap whose owner.attr is no longer the object installed
        (and each module global an imported=True swap rebound, while that module is
        still the one loaded under its name): what is wrong, naming the attribute.
        others: the swaps of the other units applied, which may have wrapped this one's."""
        others = list(others)
        found = []
        for swap in self.swaps:
            if _own(swap.owner, swap.attr) is not _expected(swap, swap.owner, swap.attr, others):
                found.append(f"{describe(swap.owner, swap.attr)} is not the object the unit installed")
            for module, name in swap.bindings:
                if (sys.modules.get(module.__name__) is module
                        and vars(module).get(name, MISSING) is not _expected(swap, module, name, others)):
                    found.append(f"{module.__name__}.{name} (bound where {describe(swap.owner, swap.attr)} was "
                                 "imported by name) is not the object the unit installed")
        return found


@dataclass(frozen=True)
class Wrap:
    """One row of a unit's wrapper table: owner.attr = wrapper(owner.attr).

    owner: a module name or a function giving the owner (None: not in this release);
    optional: an owner without attr is left alone (an op or name some releases lack);
    imported: Patcher.swap's imported=True. Rows whose originals are one object get one
    wrapper (a function a package re-exports from its module is wrapped once)."""

    owner: str | Callable[[], Any]
    attr: str
    wrapper: Callable[[Any], Any]
    imported: bool = False
    optional: bool = False


def resolve(owner: str | Callable[[], Any]) -> Any:
    return importlib.import_module(owner) if isinstance(owner, str) else owner()


def install(patcher: Patcher, table: Iterable[Wrap]) -> None:
    """Installs every row of a wrapper table through the patcher, in order."""
    made: dict[tuple[int, Any], tuple[Any, Any]] = {}  # (id(original), factory) -> (original, wrapper)
    for row in table:
        owner = resolve(row.owner)
        if owner is None or (row.optional and not hasattr(owner, row.attr)):
            continue
        original = getattr(owner, row.attr)
        if any(swap.new is original for swap in patcher.swaps):
            continue  # already installed here, through an earlier row's imported=True binding
        key = (id(original), row.wrapper)
        if key not in made:
            made[key] = (original, row.wrapper(original))
        patcher.swap(owner, row.attr, made[key][1], imported=row.imported)


class ImportHook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches one module right after it is executed, once (on_import). `active` is set
    through the unit's patcher: after the unit is reverted the hook is inert (and leaves
    sys.meta_path at its next call)."""

    active = False

    def __init__(self, patcher: Patcher, module: str, patch: Callable[[Patcher, Any], None]) -> None:
        self.patcher = patcher
        self.module = module
        self.patch = patch
        self._loader: Any = None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not self.active:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            return None
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # find the real spec, and hook only once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self.patch(self.patcher, module)


def on_import(patcher: Patcher, module: str, patch: Callable[[Patcher, Any], None]) -> None:
    """patch(patcher, the module) now where `module` is loaded, else right after it is
    (for packages the user imports maybe after enable(): PaddleFormers)."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        patch(patcher, loaded)
        return
    hook = ImportHook(patcher, module, patch)
    patcher.swap(hook, "active", True)
    sys.meta_path.insert(0, hook)


def import_hook_problems(patcher: Patcher) -> list[str]:
    """A unit's check where it patches modules on import: the hook of each module not
    loaded yet is still waiting in sys.meta_path (the swaps made once it is loaded are
    recorded, and verified, as any other)."""
    return [f"the import hook for {swap.owner.module} is not in sys.meta_path, and {swap.owner.module} is "
            "not loaded" for swap in patcher.swaps
            if isinstance(swap.owner, ImportHook) and swap.owner.module not in sys.modules
            and swap.owner not in sys.meta_path]


def _module_missing(name: str) -> str | None:
    try:
        importlib.import_module(name)
    except ImportError as err:
        return f"{name} cannot be imported here ({err})"
    return None


@dataclass(frozen=True)
class PatchUnit:
    """One cherry-picked upstream change, wired into stock Paddle.

    apply(patcher) installs it through the patcher (so revert and verify are
    generic). It applies where the Paddle release does not ship it yet
    (native_from=(major, minor): native from that release on, read through
    compat.paddle_before; native_probe: a probe of the running Paddle where a release
    number does not say it) and nothing is missing:
    requires_modules (importable), requires_ops (in paddle_ext's op library, loaded
    and built with them), requires (any other reason, or None). check(patcher): the
    problems verification finds beyond the recorded swaps' identity, for a unit whose
    installation is more than swaps.
    """

    name: str
    upstream: tuple[int, ...]
    title: str
    summary: str
    apply: Callable[[Patcher], None]
    requires_ops: tuple[str, ...] = ()
    requires_modules: tuple[str, ...] = ()
    requires: Callable[[], str | None] | None = None
    native_from: tuple[int, int] | None = None
    native_probe: Callable[[], bool] | None = None
    check: Callable[[Patcher], list[str]] | None = None

    @property
    def upstream_text(self) -> str:
        return ", ".join(f"#{n}" for n in self.upstream)

    def native(self) -> bool:
        """Whether the running Paddle already ships the change (then the unit does nothing)."""
        if self.native_from is not None and not compat.paddle_before(*self.native_from):
            return True
        return self.native_probe is not None and self.native_probe()

    def unavailable(self) -> str | None:
        """Why the unit cannot apply here, or None."""
        reason = self.requires() if self.requires is not None else None
        for module in self.requires_modules:
            reason = reason or _module_missing(module)
        if reason is None and self.requires_ops:
            from paddle_ext.ops import _library

            reason = _library.unavailable(self.requires_ops)
        return reason

    def problems(self, patcher: Patcher, others: Iterable[Swap] = ()) -> list[str]:
        """What verification finds wrong with this unit as `patcher` applied it: every
        recorded swap must still hold (or be wrapped by a later unit's swap, among
        `others`), and the unit's own check, if it has one."""
        found = patcher.problems(others)
        if not patcher.swaps:
            found.append("it recorded no swap")
        if self.check is not None:
            found += self.check(patcher)
        return [f"unit {self.name}: {p}" for p in found]


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
