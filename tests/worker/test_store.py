"""The tables' RocksDB store (streams/faustapp/table.py), on real RocksDB.

Its writes skip RocksDB's write-ahead log: the changelog topic is the log.
What that must never do is leave a persisted changelog offset ahead of the
states it stands for; after a crash the table is as it was at an earlier
moment, and recovery replays the changelog from that moment's offset.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import faust
from faust.types import TP

from streams.kafka import clients as kafka_clients
from streams.seams.faust import partition_db
from streams.faustapp.table import TableStore

CHANGELOG = TP("store-test-runs-changelog", 0)

ROOT = Path(__file__).resolve().parents[2]


def open_store(datadir: str) -> TableStore:
    """The run table's store of one partition in ``datadir``, on a Faust app with no broker."""
    app = faust.App(
        "store-test",
        **kafka_clients.faust_connection("localhost", transport="memory"),  # no broker: the store alone
        store="loopwarden://",
        datadir=datadir,
        autodiscover=False,
    )
    return app.Table("runs", partitions=1).data


def write(datadir: str, end: str) -> None:
    """Run in a child process: a first state and offset, flushed to disk, then
    a second state and offset; then the end it is told: ``kill`` (os._exit,
    nothing closed) or ``stop`` (as Faust stops its stores)."""
    store = open_store(datadir)
    store.write_in(0, [(b"run-a", b"state 1"), (b"run-b", b"state 1")])
    store.set_persisted_offset(CHANGELOG, 10)
    partition_db(store, 0).flush()
    store.write_in(0, [(b"run-a", b"state 2")])
    store.delete_in(0, b"run-b")
    store.set_persisted_offset(CHANGELOG, 12)
    if end == "kill":
        os._exit(9)
    asyncio.run(store.stop())


def write_then(end: str, datadir: Path) -> TableStore:
    child = f"from tests.worker.test_store import write; write({str(datadir)!r}, {end!r})"
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == (9 if end == "kill" else 0), done.stderr
    return open_store(str(datadir))


def test_after_a_crash_the_states_and_their_changelog_offset_are_from_one_earlier_moment(tmp_path: Path) -> None:
    store = write_then("kill", tmp_path)
    assert store.persisted_offset(CHANGELOG) == 10
    assert store.get_in(0, b"run-a") == b"state 1"
    assert store.get_in(0, b"run-b") == b"state 1"


def test_a_stopped_store_keeps_every_write(tmp_path: Path) -> None:
    store = write_then("stop", tmp_path)
    assert store.persisted_offset(CHANGELOG) == 12
    assert store.get_in(0, b"run-a") == b"state 2"
    assert store.get_in(0, b"run-b") is None
