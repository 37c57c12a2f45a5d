"""Which engine runs: the mypyc-compiled modules, or their Python sources.

setup.py compiles the per-event modules with mypyc where it can (the list is
setup.py's) and records the sha256 of each source it compiled in
`compiled.json`, beside them. An extension module shadows its `.py` on import,
so a build older than its source (an editable install edited since) would
silently run old code. Before the engine is imported, `select()` therefore
checks the record against the sources and, unless every one matches, makes
the imports load the sources.
`LOOPWARDEN_NO_EXTENSIONS=1` (`schemas.extensions`) asks for the sources (and
pure-Python hashing) outright. Either way the verdicts are the same; only the speed differs.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from schemas.extensions import EXTENSIONS_OFF

HERE = Path(__file__).resolve().parent
RECORD = HERE / "compiled.json"
PACKAGE = __name__.rpartition(".")[0]


def source_digest(name: str) -> str:
    return hashlib.sha256((HERE / f"{name}.py").read_bytes()).hexdigest()


def shadowed() -> frozenset[str]:
    """The modules of this package with a compiled module beside their source (which it shadows on import)."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return frozenset(
        source.stem for source in HERE.glob("*.py") if any(source.with_suffix(suffix).exists() for suffix in suffixes)
    )


def _reason_for_sources(modules: frozenset[str]) -> str | None:
    """Why the sources must run, or None when the compiled modules are current."""
    if EXTENSIONS_OFF:
        return "LOOPWARDEN_NO_EXTENSIONS is set"
    if not modules:
        return "not compiled (no C compiler or mypyc at install time)"
    try:
        built = json.loads(RECORD.read_bytes())
    except (OSError, ValueError) as exc:
        return f"no record of what was compiled ({RECORD.name}: {exc})"
    if set(built) != modules:
        return f"{RECORD.name} lists {sorted(built)} but {sorted(modules)} are compiled: reinstall to recompile"
    stale = sorted(name for name in modules if built[name] != source_digest(name))
    if stale:
        return f"compiled from older sources ({', '.join(f'{name}.py' for name in stale)} changed since): reinstall to recompile"
    return None


def _is_here(path: object) -> bool:
    """Whether a search path is this package's (another copy of the tree may be imported in the same process)."""
    return isinstance(path, list) and any(Path(entry).resolve() == HERE for entry in path)


class _Sources(importlib.abc.MetaPathFinder):
    """Loads the engine's modules from their `.py` files even where a compiled one sits beside them."""

    def __init__(self, modules: frozenset[str]) -> None:
        self.modules = modules

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != PACKAGE or name not in self.modules or not _is_here(path):
            return None
        return importlib.util.spec_from_file_location(fullname, HERE / f"{name}.py")


def select() -> str:
    """Arrange for the current engine to be imported; returns how it runs, for logs and bench records."""
    modules = shadowed()
    reason = _reason_for_sources(modules)
    if reason is None:
        return "compiled (mypyc)"
    if modules and not any(isinstance(finder, _Sources) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Sources(modules))
    return f"Python sources: {reason}"


MODE = select()
"""How this process's engine runs: "compiled (mypyc)", or "Python sources: <why>"."""
