"""Every non-public member of faust-streaming, mode-streaming and aiokafka
that loopwarden relies on is there, with the parameters it is called with,
and is reached only through the seams.

The list is the seams modules' own ``RELIED_ON``: an upgrade of one of the
three packages that renames or reshapes a member fails here, naming it."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import faust
import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.subscription_state import SubscriptionState
from mode.utils.logging import CompositeLogger

from streams.kafka import clients as kafka_clients
from streams.worker import transport
from streams.seams import Seam
from streams.seams import aiokafka as aiokafka_seams
from streams.seams import faust as faust_seams
from streams.seams import mode as mode_seams

MODULES = {"aiokafka": aiokafka_seams, "faust": faust_seams, "mode": mode_seams}
SEAMS = [(package, seam) for package, module in MODULES.items() for seam in module.RELIED_ON]
REPO = Path(__file__).resolve().parents[2]


async def real_instances() -> list[Any]:
    """One real object of each class whose instances carry a relied-on attribute, none started."""
    app = faust.App(
        "seams-check",
        **kafka_clients.faust_connection("127.0.0.1:1", transport=transport.SCHEME),
        autodiscover=False,
        datadir=tempfile.mkdtemp(prefix="lw-seams-"),
    )
    consumer = app.consumer  # the worker's transport: its Consumer and its LoopConsumer
    client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1")
    fetcher = Fetcher(client, SubscriptionState())
    aiokafka_consumer = kafka_clients.aio_consumer("127.0.0.1:1")
    await fetcher.close()
    await client.close()
    await aiokafka_consumer.stop()
    return [
        consumer,
        consumer.loop_consumer,
        aiokafka_consumer,
        fetcher,
        CompositeLogger(logging.getLogger("loopwarden.seams")),
    ]


@pytest.fixture(scope="module")
def instances() -> Iterator[list[Any]]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield loop.run_until_complete(real_instances())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@pytest.mark.parametrize("package,seam", SEAMS, ids=[f"{package}:{seam.where}" for package, seam in SEAMS])
def test_a_relied_on_member_is_there_as_expected(package: str, seam: Seam, instances: list[Any]) -> None:
    where = seam.where
    assert where.split(".")[0] == package, f"{where} is declared by the {package} seams"
    if seam.example is not None:  # a compiled constructor: no signature to read, so build one by keyword
        assert seam.params is not None and len(seam.example) == len(seam.params), f"{where}: one example per parameter"
        try:
            seam.owner(**dict(zip(seam.params, seam.example, strict=True)))
        except TypeError as exc:
            pytest.fail(f"{where} no longer takes {seam.params}: {exc}: {seam.reason}")
        return
    if seam.on_instance:
        found = [obj for obj in instances if isinstance(obj, seam.owner)]
        assert found, f"no real {seam.owner.__qualname__} to look for {seam.name} on (add one to real_instances)"
        assert all(hasattr(obj, seam.name) for obj in found), f"{where} is gone: {seam.reason}"
        return
    assert hasattr(seam.owner, seam.name), f"{where} is gone: {seam.reason}"
    if seam.params is not None:
        member = getattr(seam.owner, seam.name)
        assert callable(member), f"{where} is no longer a method"
        params = tuple(inspect.signature(member).parameters)
        assert params == seam.params, f"{where} takes {params}, the seam expects {seam.params}: {seam.reason}"


def test_each_seam_has_a_reason() -> None:
    assert all(seam.reason.strip() for _, seam in SEAMS)


#: An attribute access of a name with one leading underscore (``obj._name``).
PRIVATE = re.compile(r"\.(_[a-z][a-z0-9_]*)\b")


def test_no_module_outside_the_seams_names_a_relied_on_private_member() -> None:
    """The seams are the only place: a relied-on name used anywhere else
    in the project's code, benchmarks or tests is a seam bypassed."""
    private = {seam.name for _, seam in SEAMS if seam.name.startswith("_") and not seam.name.startswith("__")}
    seams_dir = REPO / "streams" / "seams"
    bypassed = []
    for root in ("streams", "bench", "tests"):
        for path in (REPO / root).rglob("*.py"):
            if seams_dir in path.parents:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for name in PRIVATE.findall(line):
                    if name in private:
                        bypassed.append(f"{path.relative_to(REPO)}:{number}: {name}")
    assert not bypassed, bypassed


#: The modules whose globals a seam relies on (or replaces).
GLOBALS_OF = {seam.owner.__name__ for _, seam in SEAMS if isinstance(seam.owner, ModuleType)}


def _imported(tree: ast.AST) -> Iterator[str]:
    """Every module a file imports, ``from a import b`` counted as ``a`` and ``a.b``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_no_module_outside_the_seams_imports_a_module_whose_globals_are_relied_on() -> None:
    """A module global (a class or a function another module looks up) has
    no leading underscore to search for, so its module is the mark: reaching
    it means importing that module, which only the seams (and this check's
    real instances) do."""
    assert GLOBALS_OF, "no module global is relied on: this check checks nothing"
    seams_dir = REPO / "streams" / "seams"
    bypassed = []
    for root in ("streams", "bench", "tests"):
        for path in (REPO / root).rglob("*.py"):
            if seams_dir in path.parents or path == Path(__file__).resolve():
                continue
            for module in _imported(ast.parse(path.read_text(), str(path))):
                if module in GLOBALS_OF:
                    bypassed.append(f"{path.relative_to(REPO)}: imports {module}")
    assert not bypassed, bypassed
