"""The runs table's RocksDB store (streams/worker/store.py), on real RocksDB.

Its writes skip RocksDB's write-ahead log: the changelog topic is the log.
What that must never do is leave a persisted changelog offset ahead of the
states it stands for; after a crash the table is as it was at an earlier
moment, and recovery replays the changelog from that moment's offset.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import faust
from faust.types import TP

from streams import kafka_clients
from streams.worker.store import RunStore

CHANGELOG = TP("store-test-runs-changelog", 0)

#: Writes a first state and offset and flushes them to disk, then a second
#: state and offset, and ends as told: killed (os._exit, nothing closed), or
#: stopped as Faust stops its stores.
WRITER = textwrap.dedent(
    """
    import asyncio, os, sys
    import faust
    from faust.types import TP

    from streams import kafka_clients

    app = faust.App(
        "store-test",
        **kafka_clients.faust_connection("localhost", transport="memory"),  # no broker: the store alone
        store="loopwarden://",
        datadir=sys.argv[1],
        autodiscover=False,
    )
    store = app.Table("runs", partitions=1).data
    tp = TP("store-test-runs-changelog", 0)
    store.write_in(0, [(b"run-a", b"state 1"), (b"run-b", b"state 1")])
    store.set_persisted_offset(tp, 10)
    store._db_for_partition(0).flush()
    store.write_in(0, [(b"run-a", b"state 2")])
    store.delete_in(0, b"run-b")
    store.set_persisted_offset(tp, 12)
    if sys.argv[2] == "kill":
        os._exit(9)
    asyncio.run(store.stop())
    """
)


def reopen(datadir: Path) -> RunStore:
    app = faust.App(
        "store-test",
        **kafka_clients.faust_connection("localhost", transport="memory"),
        store="loopwarden://",
        datadir=str(datadir),
        autodiscover=False,
    )
    return app.Table("runs", partitions=1).data


def write_then(end: str, datadir: Path) -> RunStore:
    subprocess.run([sys.executable, "-c", WRITER, str(datadir), end], check=False, timeout=60)
    return reopen(datadir)


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
