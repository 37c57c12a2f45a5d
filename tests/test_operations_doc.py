"""docs/OPERATIONS.md stays complete: every option of `loopwarden worker` and
every metric the worker exposes is documented there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from streams.observability.metrics import WorkerMetrics

DOC = (Path(__file__).resolve().parents[1] / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")


def worker_options() -> list[str]:
    """The long options `loopwarden worker --help` lists."""
    usage = subprocess.run(
        [sys.executable, "-m", "streams.cli", "worker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    return sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", usage)) - {"--help"})


def test_every_worker_option_is_documented():
    options = worker_options()
    assert "--web-port" in options and "--events-topic" in options
    assert [option for option in options if f"`{option}" not in DOC] == []


def test_every_metric_is_documented():
    families = list(text_string_to_metric_families(WorkerMetrics().render().decode()))
    names = [family.name + ("_total" if family.type == "counter" else "") for family in families]
    assert "loopwarden_consumer_lag" in names
    assert [name for name in names if f"`{name}`" not in DOC] == []
