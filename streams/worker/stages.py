"""Where a verdict's time goes inside the worker: per-verdict stage clocks,
written to a file for the latency benchmark (``--trace-stages FILE``).

Off by default; when off, the processor pays one ``is None`` test per event.
When on, each verdict costs a few clock reads, a list and a done callback on
its send, which the benchmark runs on every worker it compares alike.

One JSON array per verdict, in the order acknowledgements arrive::

    [run_id, seq, ts, polled, fetched, taken, sent, acknowledged]

all wall-clock seconds (``time.time()``, the clock a gateway on the same
machine stamps ``ts`` with): ``ts`` is the event's own (null when the
gateway sets none); ``polled`` when the consumer's poll of aiokafka
returned the event's batch; ``fetched`` when the consumer's fetch loop,
done with Faust's per-record bookkeeping, handed it to the processor;
``taken`` when the processor began the event; ``sent`` when the producer
accepted the verdict; ``acknowledged`` when the broker's acknowledgement of
it reached the worker's event loop.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec

Row = list[Any]


class StageTrace:
    """Stage clocks of the verdicts sent, appended to ``path`` in whole checkpoints."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("ab")
        self._done: list[Row] = []
        self._encode_lines = msgspec.json.Encoder().encode_lines

    def sent(
        self,
        run_id: str,
        seq: int,
        ts: object,
        polled: float,
        fetched: float,
        taken: float,
        future: asyncio.Future[Any],
    ) -> None:
        """A verdict of the event polled, fetched and taken at those times was just sent."""
        row: Row = [run_id, seq, ts if isinstance(ts, float) else None, polled, fetched, taken, time.time(), None]
        done = self._done

        def acknowledged(_: asyncio.Future[Any]) -> None:
            row[7] = time.time()
            done.append(row)

        future.add_done_callback(acknowledged)

    def flush(self) -> None:
        """Write the rows acknowledged so far (called as each checkpoint finishes)."""
        if self._done:
            rows, self._done = self._done, []
            self._file.write(self._encode_lines(rows))
            self._file.flush()
