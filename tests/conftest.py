"""Shared fixtures for tests that need a real Kafka broker.

One broker serves the whole session: a JVM start costs seconds, while
topics and consumer groups with unique names keep the tests independent.
The same goes for the three-node cluster, started by the first test that
asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.tools.broker import LocalBroker, install
from streams.tools.cluster import LocalCluster


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


@pytest.fixture(scope="session")
def secure_broker(kafka_lib: Path) -> Iterator[LocalBroker]:
    """The secure broker of docs/SECURITY.md (SASL_SSL with SCRAM, the
    StandardAuthorizer, the gateway and worker ACLs, the project's topics),
    started once for the tests that need it; `secure_broker.security(role)`
    and `DATA_DIR/secrets/*.env` give a client's settings."""
    with LocalBroker(lib_dir=kafka_lib, secure=True) as running:
        yield running


@pytest.fixture(scope="session")
def _running_cluster(kafka_lib: Path) -> Iterator[LocalCluster]:
    with LocalCluster(lib_dir=kafka_lib) as running:
        yield running


@pytest.fixture
def cluster(_running_cluster: LocalCluster) -> LocalCluster:
    """A three-node KRaft cluster (streams/tools/cluster.py) shared by the
    session, every node serving when a test gets it: a test may SIGKILL a
    node (`cluster.kill(n)`) and leave it down; the next one gets it back."""
    return _running_cluster.start()
