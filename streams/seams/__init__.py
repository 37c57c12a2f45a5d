"""The members of faust-streaming, mode-streaming and aiokafka that are not
public but that loopwarden relies on: one module per package, and nowhere else.

Each use says why no public API does the same. Each module declares what it
relies on in ``RELIED_ON``; tests/worker/test_seams.py checks every entry
against the installed packages (presence, and a method's parameters), so an
upgrade that renames or reshapes one fails there, naming it. The three
packages are pinned to the versions these were checked against
(pyproject.toml); docs/UPGRADING.md says how to move them.
"""

from __future__ import annotations

from typing import NamedTuple


class Seam(NamedTuple):
    """One non-public member relied on, and why."""

    owner: type
    name: str
    #: A method's parameter names as ``inspect.signature`` gives them on the
    #: class (``self`` first); None for a data attribute.
    params: tuple[str, ...] | None
    #: Set by the owner's constructor, not on the class: checked on a real instance.
    on_instance: bool
    reason: str


def method(owner: type, name: str, params: tuple[str, ...], reason: str) -> Seam:
    return Seam(owner, name, params, False, reason)


def attribute(owner: type, name: str, reason: str, *, on_instance: bool = True) -> Seam:
    return Seam(owner, name, None, on_instance, reason)
