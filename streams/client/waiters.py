"""Checks waiting for their verdicts, matched by `(run_id, seq)`; a verdict
delivered again (Kafka delivers at least once) is matched only the first time."""

from __future__ import annotations

import collections
import threading

from streams.client.verdict import ClientVerdict

Ident = tuple[str, int]
"""A verdict's (run_id, seq): the event it answers."""


class Waiter:
    """One check's wait: resolved by its verdict, or failed with the reason there is none."""

    __slots__ = ("done", "error", "verdict")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.verdict: ClientVerdict | None = None
        self.error: str | None = None

    def resolve(self, verdict: ClientVerdict) -> None:
        if not self.done.is_set():
            self.verdict = verdict
            self.done.set()

    def fail(self, error: str) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


class Waiters:
    """The waiting checks, and the last `dedupe_window` verdicts matched."""

    def __init__(self, dedupe_window: int) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[Ident, Waiter] = {}
        self._seen: collections.OrderedDict[Ident, None] = collections.OrderedDict()
        self._dedupe_window = dedupe_window

    def add(self, ident: Ident, waiter: Waiter) -> None:
        """Registered before its event is sent, so that no verdict comes first."""
        with self._lock:
            self._waiting[ident] = waiter

    def discard(self, ident: Ident) -> None:
        with self._lock:
            self._waiting.pop(ident, None)

    def match(self, ident: Ident) -> tuple[bool, Waiter | None]:
        """Whether the verdict for `ident` is new (not a repeat), and the check waiting for it."""
        with self._lock:
            if ident in self._seen:
                return False, None
            self._seen[ident] = None
            if len(self._seen) > self._dedupe_window:
                self._seen.popitem(last=False)
            return True, self._waiting.get(ident)

    def fail_all(self, error: str) -> None:
        """Every waiting check gets no verdict, for `error`."""
        with self._lock:
            waiting = list(self._waiting.values())
            self._waiting.clear()
        for waiter in waiting:
            waiter.fail(error)
