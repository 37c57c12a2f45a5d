"""Worker options: parsing, defaults, and the argv that `loopwarden up` hands
to the worker subprocess."""

from __future__ import annotations

import pytest

from streams.cli import build_parser
from streams.settings import Settings, settings_from_args, worker_argv


def parse(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["worker", *argv]))


def test_defaults_match_the_settings_dataclass() -> None:
    parsed = parse()
    default = Settings()
    for name in ("batch_size", "flush_interval", "max_in_flight", "linger_ms", "commit_interval", "ttl"):
        assert getattr(parsed, name) == getattr(default, name), name


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
        "--batch-size", "500", "--flush-interval", "75ms", "--max-in-flight", "900", "--linger", "0",
        "--ttl", "2h", "--standby-replicas", "0", "--commit-interval", "1s", "--web-port", "7001",
    )  # fmt: skip
    again = parse(*worker_argv(settings))
    assert again == settings
    assert (again.batch_size, again.flush_interval, again.max_in_flight) == (500, 0.075, 900)
