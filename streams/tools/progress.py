"""What a batch command (replay, incidents, produce, audit) shows on stderr:
a progress bar while a long run goes on, only on a terminal, and one summary
line when it ends, so that no run finishes silently."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")

#: A run that ends sooner shows no bar at all.
BAR_DELAY = 1.0

#: The decisions in the order a summary lists them.
DECISIONS = ("allow", "warn", "block", "abort")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 event`, `2 events`, `1,000 dead letters`; `nouns` where an s is not the plural."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def _bar(err: TextIO, total: float | None, unit: str) -> tqdm | None:
    """A bar that appears after BAR_DELAY and is wiped at the end; None when err is not a terminal."""
    if not err.isatty():
        return None
    return tqdm(total=total, unit=unit, unit_scale=True, delay=BAR_DELAY, file=err, leave=False, dynamic_ncols=True)


def counted(items: Iterable[T], err: TextIO, total: int | None, unit: str) -> Iterator[T]:
    """`items`, unchanged, counted on a bar out of `total`."""
    bar = _bar(err, total, unit)
    if bar is None:
        yield from items
        return
    with bar:
        for item in items:
            bar.update()
            yield item


def read_lines(stream: BinaryIO, err: TextIO) -> Iterator[bytes]:
    """The lines of `stream`, its bytes counted on a bar (out of its size when it is a file)."""
    try:
        size: int | None = os.fstat(stream.fileno()).st_size or None
    except (OSError, ValueError):
        size = None
    bar = _bar(err, size, "B")
    if bar is None:
        yield from stream
        return
    with bar:
        for line in stream:
            bar.update(len(line))
            yield line


class Tally:
    """What a run read and decided, for its summary line."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.events = 0
        self.dead_letters = 0
        self.decisions: collections.Counter[str] = collections.Counter()

    def verdicts(self, how: str = "") -> str:
        """`3 verdicts (2 allow, 1 warn)`; `how` follows the noun (`recomputed`)."""
        total = sum(self.decisions.values())
        split = ", ".join(f"{self.decisions[d]:,} {d}" for d in DECISIONS if self.decisions[d])
        return " ".join(filter(None, (plural(total, "verdict"), how, f"({split})" if split else "")))

    def decided(self, how: str = "") -> list[str]:
        """The verdicts by decision and the dead letters, as a summary names them."""
        return [self.verdicts(how), plural(self.dead_letters, "dead letter")]

    def summary(self, command: str, *parts: str) -> str:
        """`replay: 150 events, <parts>, 0.2s`."""
        return f"{command}: {', '.join([plural(self.events, 'event'), *parts])}, {time.monotonic() - self.started:.1f}s"
