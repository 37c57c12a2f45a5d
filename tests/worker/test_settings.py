"""Worker options: parsing, defaults, and the argv that `loopwarden up` hands
to the worker subprocess."""

from __future__ import annotations

import pytest

from streams.cli import build_parser
from streams.argtypes import duration, format_duration
from streams.worker.settings import Settings, settings_from_args, worker_argv


def parse(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["worker", *argv]))


def test_defaults_match_the_settings_dataclass() -> None:
    """Every option left out gives the dataclass default (those read from the
    environment, and the data dir made absolute, aside)."""
    parsed = parse()
    for name in Settings.__dataclass_fields__:
        if name not in ("bootstrap", "app_id", "data_dir"):
            assert getattr(parsed, name) == getattr(Settings(), name), name


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in (
        "(default 1h; e.g. 30m, 2h)",
        "(default 250ms)",
        "(default 2.8s)",
        "(default 20000)",
        "(default 1ms;",
    ):
        assert shown in text, shown


@pytest.mark.parametrize(
    "seconds", [0.0, 0.005, 0.04, 0.25, 1.0, 1.5, 2.8, 45.0, 60.0, 90.0, 3600.0, 5400.0, 86400.0, 1e-4]
)
def test_durations_are_printed_as_they_are_read(seconds: float) -> None:
    assert duration(format_duration(seconds)) == seconds


def test_flush_interval_accepts_durations() -> None:
    assert parse("--flush-interval", "1s").flush_interval == 1.0
    assert parse("--flush-interval", "40ms").flush_interval == pytest.approx(0.04)
    assert parse("--flush-interval", "0").flush_interval == 0.0


def test_bad_flush_interval_is_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--flush-interval", "soon")
    assert exit_info.value.code == 2
    assert "--flush-interval" in capsys.readouterr().err


def test_worker_argv_reproduces_every_setting() -> None:
    settings = parse(
        "--batch-size",
        "500",
        "--flush-interval",
        "75ms",
        "--max-in-flight",
        "900",
        "--linger",
        "0",
        "--fetch-hold",
        "5ms",
        "--max-batch-bytes",
        "4000000",
        "--changelog-compression",
        "gzip",
        "--ttl",
        "2h",
        "--standby-replicas",
        "0",
        "--commit-interval",
        "1s",
        "--web-port",
        "7001",
        "--trace-stages",
        "/tmp/stages.jsonl",
    )
    again = parse(*worker_argv(settings))
    assert again == settings
    assert (again.batch_size, again.flush_interval, again.max_in_flight) == (500, 0.075, 900)
    assert again.fetch_hold == 0.005
    assert again.max_batch_bytes == 4_000_000
    assert again.changelog_compression == "gzip"


def test_an_unknown_changelog_compression_is_refused_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--changelog-compression", "brotli")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--changelog-compression" in err and "'brotli'" in err and "zstd" in err
