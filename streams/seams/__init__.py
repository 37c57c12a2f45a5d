"""The members of faust-streaming, mode-streaming and aiokafka that are not
public but that loopwarden relies on: one module per package, and nowhere else.

Each use says why no public API does the same. Each module declares what it
relies on in ``RELIED_ON``: a class's member, or a module's global (a name
another module of the package looks up at each call, so replacing it there
changes what that module does). tests/seams/test_seams.py checks every
entry against the installed packages (presence, and a method's or a
constructor's parameters), so an upgrade that renames or reshapes one fails
there, naming it. The three
packages are pinned to the versions these were checked against
(pyproject.toml); docs/UPGRADING.md says how to move them.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple


class Seam(NamedTuple):
    """One non-public member relied on, and why."""

    #: The class, or the module whose global it is.
    owner: type | ModuleType
    name: str
    #: A method's parameter names as ``inspect.signature`` gives them on the
    #: class (``self`` first); None for a data attribute.
    params: tuple[str, ...] | None
    #: Set by the owner's constructor, not on the class: checked on a real instance.
    on_instance: bool
    reason: str
    #: For a compiled class's ``__init__``, which has no signature to read:
    #: one value per parameter, to build an instance by keyword with.
    example: tuple[Any, ...] | None = None

    @property
    def where(self) -> str:
        """The member's dotted name."""
        if isinstance(self.owner, ModuleType):
            return f"{self.owner.__name__}.{self.name}"
        return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.name}"


def method(owner: type, name: str, params: tuple[str, ...], reason: str) -> Seam:
    return Seam(owner, name, params, False, reason)


def attribute(owner: type, name: str, reason: str, *, on_instance: bool = True) -> Seam:
    return Seam(owner, name, None, on_instance, reason)


def module_global(module: ModuleType, name: str, reason: str, params: tuple[str, ...] | None = None) -> Seam:
    return Seam(module, name, params, False, reason)


def compiled_constructor(owner: type, params: tuple[str, ...], example: tuple[Any, ...], reason: str) -> Seam:
    return Seam(owner, "__init__", params, False, reason, example)
