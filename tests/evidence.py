"""What an integration test keeps when it fails: its processes' logs, the
topics' offsets, the groups' committed offsets and chosen topics' records,
in a directory its assertion message names. A flake seen once in CI can
then be read afterwards instead of guessed at."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from kafka import TopicPartition

from streams.kafka import clients as kafka_clients
from streams.kafka.clients import PLAINTEXT
from streams.kafka.reader import ReadError, TopicReader

REPO = Path(__file__).resolve().parents[1]
#: Where failures are kept (ignored by git, left in place by CI's checkout).
KEPT = REPO / "test-logs"

Describe = Callable[[bytes | None, bytes | None], str]
"""One record's key and value as a line of text."""


def kept_dir(node_id: str) -> Path:
    """A fresh directory under test-logs/ named after the test."""
    path = KEPT / re.sub(r"[^\w.-]+", "_", node_id).strip("_")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def offsets(bootstrap: str, topics: Sequence[str], groups: Sequence[str]) -> str:
    """Each partition's first and end offsets and every group's committed offset on it."""
    consumer = kafka_clients.consumer(bootstrap, group_id=None, enable_auto_commit=False)
    try:
        with kafka_clients.admin(bootstrap) as admin:
            committed = {group: admin.list_group_offsets({group: None})[group] for group in groups}
        lines = [f"{'topic':<60} {'part':>4} {'first':>8} {'end':>8}  committed by " + ", ".join(groups)]
        for topic in topics:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            if not tps:
                lines.append(f"{topic:<60} (no such topic)")
                continue
            first, ends = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
            for tp in tps:
                marks = [str(committed[g][tp].offset) if tp in committed[g] else "-" for g in groups]
                lines.append(f"{topic:<60} {tp.partition:>4} {first[tp]:>8} {ends[tp]:>8}  {', '.join(marks)}")
        return "\n".join(lines) + "\n"
    finally:
        consumer.close()


def records(bootstrap: str, topic: str, describe: Describe) -> str:
    """Every record of the topic now, one line each: partition, offset, then
    `describe`'s text; why not, for a topic that cannot be read."""
    try:
        with TopicReader(bootstrap, "loopwarden-tests", PLAINTEXT) as reader:
            found = sorted(reader.whole(topic), key=lambda r: (r.partition, r.offset))
    except ReadError as exc:
        return f"{exc}\n"
    return "".join(f"{r.partition} {r.offset} {describe(r.key, r.value)}\n" for r in found)


@contextmanager
def kept_on_failure(
    dest: Callable[[], Path],
    bootstrap: str,
    *,
    logs: Sequence[Path],
    topics: Sequence[str],
    groups: Sequence[str],
    contents: Mapping[str, Describe],
) -> Iterator[None]:
    """On a failure inside: the logs copied, `offsets.txt`, and one file per
    topic of `contents`, in `dest()`, named in a note on the error raised again."""
    try:
        yield
    except Exception as exc:
        kept = dest()
        for log in logs:
            if log.exists():
                shutil.copy(log, kept / log.name)
        try:
            (kept / "offsets.txt").write_text(offsets(bootstrap, topics, groups))
            for topic, describe in contents.items():
                (kept / f"{topic}.txt").write_text(records(bootstrap, topic, describe))
        except Exception as failed:  # what could not be read is itself a finding
            (kept / "unreadable.txt").write_text(f"{type(failed).__name__}: {failed}\n")
        exc.add_note(f"logs, offsets and records kept in {kept}")
        raise
