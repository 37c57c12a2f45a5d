"""The layout's rules, read from the source with `ast`: the wire contract
(`schemas/`) imports nothing of `streams`, no module of `streams/` imports
itself back through others, and the engine, the Kafka plumbing and the seams
import nothing of the commands built on them.

An import counts when it runs as its module loads: at module level, in a
class body, or in a module-level `try`/`if`. Two kinds are left out, because
they never run while the module loads and so can make no circle at import
time: imports inside a function (the CLI and the tools import their heavy
parts when a command runs), and imports under `if TYPE_CHECKING:` (for
annotations only). The schemas rule counts every import, functions included:
the wire contract must not reach into the processor at all.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(package: str) -> dict[str, Path]:
    return {module_name(path): path for path in sorted((ROOT / package).rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _load_time(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run as a module loads (see the module docstring)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _load_time(node.body)
            yield from _load_time(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(handler.body for handler in node.handlers)):
                yield from _load_time(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _load_time(node.body)


def imported(module: str, node: ast.stmt, modules: Collection[str] = ()) -> list[str]:
    """The modules an import statement in `module` loads: `from P import m`
    loads the submodule P.m where `modules` has it, and P otherwise."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    stem = node.module or ""
    if node.level:  # relative: resolved from the module's package
        is_package = (ROOT / Path(*module.split(".")) / "__init__.py").exists()
        package = (module if is_package else module.rpartition(".")[0]).split(".")
        base = ".".join(package[: len(package) - node.level + 1])
        stem = f"{base}.{stem}" if stem else base
    return [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem for alias in node.names]


def load_time_imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other modules of `modules`, as it loads."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = (name for node in _load_time(tree.body) for name in imported(module, node, modules))
        graph[module] = {name for name in names if name in modules and name != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as its path (first module repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph[module]):
            if target in on_path:
                return path[path.index(target) :] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
        on_path.discard(path.pop())
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def test_schemas_import_nothing_of_streams() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
        for module, path in sources("schemas").items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in imported(module, node)
        if name == "streams" or name.startswith("streams.")
    ]
    assert not found, "schemas/ imports streams/: " + "; ".join(found)


def test_no_import_cycle_among_streams_modules() -> None:
    cycle = find_cycle(load_time_imports(sources("streams")))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_is_found_and_told_by_its_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_in_functions_and_for_type_checking_are_not_load_time() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import streams.a\n"
        "if TYPE_CHECKING:\n    import streams.b\n"
        "try:\n    import streams.c\nexcept ImportError:\n    import streams.d\n"
        "def f():\n    import streams.e\n"
        "class K:\n    import streams.f\n"
    )
    names = {name for node in _load_time(tree.body) for name in imported("streams.x", node)}
    assert {"streams.a", "streams.c", "streams.d", "streams.f"} <= names
    assert not {"streams.b", "streams.e"} & names


#: The ground floors and what they must not reach up to: the engine is pure,
#: and the Kafka plumbing and the seams serve every command alike.
LOWER = ("streams.engine", "streams.kafka", "streams.seams")
UPPER = ("streams.worker", "streams.fleet", "streams.tools", "streams.client", "streams.cli")


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in packages)


def test_the_lower_packages_import_nothing_above_them() -> None:
    modules = sources("streams")
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
        for module, path in modules.items()
        if _within(module, LOWER)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in imported(module, node, modules)
        if _within(name, UPPER)
    ]
    assert not found, "a lower package imports an upper one: " + "; ".join(found)
