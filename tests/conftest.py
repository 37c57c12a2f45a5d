"""Shared fixtures for tests that need a real Kafka broker.

One broker serves the whole session: a JVM start costs seconds, while
topics and consumer groups with unique names keep the tests independent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.tools.broker import LocalBroker, install


@pytest.fixture(scope="session")
def kafka_lib() -> Path:
    """The broker's jar dir (fetched from Maven Central on first use only)."""
    return install()


@pytest.fixture(scope="session")
def broker(kafka_lib: Path) -> Iterator[LocalBroker]:
    """A started single-node broker on a free 127.0.0.1 port, in a temp dir
    that is deleted when the session ends."""
    with LocalBroker(lib_dir=kafka_lib) as running:
        yield running
