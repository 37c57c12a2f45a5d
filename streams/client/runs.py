"""The runs a client publishes for and their calls: each run's next seq and
its abort, and the next seq of runs that ended, so that a run id used again
numbers its events above the old ones, as loopwarden requires."""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET

from streams.client.verdict import ClientVerdict
from streams.client.waiters import Waiter


@dataclass(slots=True)
class Call:
    """A published tool call: pass it to `check` and then to `tool_result`.

    `args` is kept in memory only (for hashing the result locally, or for
    repeating the args on the result event); it is never logged."""

    run_id: str
    seq: int
    tool_call_id: str
    tool_name: str
    args: Any = UNSET
    args_hash: str | None = None
    kind: int = 0  # how the call was classified: how its result is hashed locally
    published_at: float = 0.0
    _waiter: Waiter | None = field(default=None, repr=False)


class Run:
    __slots__ = ("agent_id", "aborted", "compacted", "first_seq", "lock", "next_seq")

    def __init__(self, next_seq: int) -> None:
        self.lock = threading.Lock()  # held from numbering an event to sending it: seq order is send order
        self.first_seq = next_seq  # seqs in [first_seq, next_seq) are this client's
        self.next_seq = next_seq
        self.compacted = False  # only then can a result abort the run
        self.agent_id: str | None = None
        self.aborted: ClientVerdict | None = None

    def published(self, seq: int) -> bool:
        """Whether this client numbered `seq` (a verdict for another seq answers another process)."""
        return self.first_seq <= seq < self.next_seq


class Runs:
    def __init__(self, remember_ended: int) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}
        self._ended: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._remember_ended = remember_ended

    def get(self, run_id: str) -> Run | None:
        with self._lock:
            return self._runs.get(run_id)

    def open(self, run_id: str) -> Run:
        """The run, started on its first event (above its old seqs if it ended before)."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                run = self._runs[run_id] = Run(self._ended.pop(run_id, 0))
            return run

    def begin(self, run_id: str, first_seq: int) -> None:
        with self._lock:
            if run_id not in self._runs:
                self._runs[run_id] = Run(first_seq)

    def end(self, run_id: str, run: Run) -> None:
        """Forget the run, remembering its next seq (the oldest forgotten beyond the bound)."""
        with self._lock:
            self._runs.pop(run_id, None)
            self._ended[run_id] = run.next_seq
            while len(self._ended) > self._remember_ended:
                self._ended.popitem(last=False)

    def mark_aborted(self, run_id: str, verdict: ClientVerdict) -> bool:
        """Record the run's abort; True the first time."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None and run.aborted is None:
                run.aborted = verdict
                return True
            return False
