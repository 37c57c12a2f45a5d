"""`loopwarden topics create`, `list` and `describe` against a real broker."""

from __future__ import annotations

import uuid

from builders import run_cli
from streams.kafka.topics import missing_topic


def topics(*args: str) -> tuple[int, list[str], list[str]]:
    """The exit code, stdout lines and stderr lines of `loopwarden topics ARGS`."""
    done = run_cli(*args, command="topics")
    return done.returncode, done.stdout.decode().splitlines(), done.stderr.decode().splitlines()


def test_create_then_list_and_describe(broker) -> None:
    tag = uuid.uuid4().hex[:8]
    names = {flag: f"{flag.removeprefix('--').removesuffix('-topic')}-{tag}" for flag in
             ("--events-topic", "--decisions-topic", "--deadletter-topic", "--incidents-topic")}  # fmt: skip
    connect = ("--bootstrap", broker.bootstrap)
    named = [part for flag, name in names.items() for part in (flag, name)]
    code, out, err = topics("create", *connect, *named, "--partitions", "2", "--replication-factor", "1")
    assert (code, err) == (0, []), err
    assert out == [f"created {name} (2 partitions)" for name in names.values()]

    code, out, err = topics("list", *connect)
    assert (code, err) == (0, [])
    assert {f"{name} (2 partitions)" for name in names.values()} <= set(out)
    assert not any(line.startswith("__") for line in out)  # Kafka's own topics are left out

    code, out, err = topics("describe", *connect, *named)
    assert (code, err) == (0, [])
    leader = out[0].rsplit(" ", 1)[1]
    assert out == [
        f"{name}: 2 partitions, replication factor 1, leaders by partition: {leader} {leader}"
        for name in names.values()
    ]

    absent = f"absent-{tag}"
    code, out, err = topics("describe", *connect, names["--events-topic"], absent)
    assert code == 1 and len(out) == 1
    assert err == [f"loopwarden: {missing_topic(absent, broker.bootstrap)}"]
