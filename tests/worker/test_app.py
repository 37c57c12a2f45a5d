"""The worker app: its correction of Faust's flow control, its loggers, a refused start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from mode.utils.queues import FlowControlEvent

from helpers import queue_after_resumes
from streams.faustapp.app import FlowControl
from streams.worker.settings import Settings


def test_a_resume_without_a_suspension_keeps_queued_events() -> None:
    assert queue_after_resumes(FlowControlEvent(), suspend_between=False) == 0  # Faust's own: dropped
    assert queue_after_resumes(FlowControl(), suspend_between=False) == 1


def test_a_resume_after_a_suspension_empties_the_queues() -> None:
    assert queue_after_resumes(FlowControl(), suspend_between=True) == 0


def test_faust_lines_of_the_worker_subclasses_stay_under_the_faust_logger() -> None:
    """--faust-loglevel holds the faust loggers; a subclass of a Faust service
    would otherwise log Faust's lifecycle lines under its own module's name."""
    from streams.worker.app import WorkerApp
    from streams.faustapp.table import TableStore
    from streams.faustapp.producer import IdempotentProducer
    from streams.worker.transport import Consumer, LoopConsumer, Producer

    classes = (WorkerApp, TableStore, Consumer, LoopConsumer, IdempotentProducer, Producer)
    names = {cls.__name__: cls.logger.name for cls in classes}
    assert all(name.startswith("faust.") for name in names.values()), names


def test_a_changelog_compression_without_its_library_stops_the_worker_before_it_connects(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from streams.worker import transport
    from streams.worker.app import run_worker

    monkeypatch.setitem(transport.CODECS, "zstd", (lambda: False, transport.CODECS["zstd"][1]))
    settings = Settings(bootstrap="127.0.0.1:1", data_dir=tmp_path / "data", changelog_compression="zstd")
    assert run_worker(settings) == 2
    out = capsys.readouterr()
    line = (out.out + out.err).strip().splitlines()[-1]
    assert "event=startup_failed" in line
    assert "--changelog-compression: zstd compression needs the cramjam package" in line
    assert not (tmp_path / "data").exists()  # nothing made, nothing connected to


def test_a_batch_bound_below_the_event_bound_stops_the_worker_before_it_connects(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from streams.worker.app import run_worker

    settings = Settings(bootstrap="127.0.0.1:1", data_dir=tmp_path / "data", max_batch_bytes=1000)
    assert run_worker(settings) == 2
    out = capsys.readouterr()
    line = (out.out + out.err).strip().splitlines()[-1]
    assert "event=startup_failed" in line
    assert "--max-batch-bytes 1000 < --max-event-bytes 1048576: no event that size could pass" in line
    assert not (tmp_path / "data").exists()


def test_the_worker_and_the_fleet_stage_produce_idempotently_with_acks_all(tmp_path: Path) -> None:
    """Faust makes an idempotent producer only for transactions: the two
    apps' transports make theirs idempotent, with acks=all, always."""
    from schemas.configfile import load_config
    from streams.fleet.settings import FleetSettings
    from streams.fleet.stage import create_fleet_app
    from streams.worker.app import create_app

    async def delivery() -> list[tuple[bool, str | None, int]]:
        worker, _ = create_app(Settings(bootstrap="127.0.0.1:1", data_dir=tmp_path / "w"), load_config(None).config, 2)
        stage = create_fleet_app(FleetSettings(bootstrap="127.0.0.1:1", data_dir=tmp_path / "f"))
        found = []
        for app in (worker, stage):
            producer = app.producer._new_producer()  # the aiokafka producer Faust starts
            manager = producer._txn_manager
            found.append((manager is not None, manager and manager.transactional_id, producer._sender._acks))
            await producer.stop()
        return found

    assert asyncio.run(delivery()) == [(True, None, -1), (True, None, -1)]  # idempotent, not transactional, acks=all
