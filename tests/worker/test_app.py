"""The worker app: its correction of Faust's flow control, its loggers, a refused start."""

from __future__ import annotations

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
    from streams.worker.transport import Consumer, LoopConsumer

    names = {cls.__name__: cls.logger.name for cls in (WorkerApp, TableStore, Consumer, LoopConsumer)}
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
