"""mode-streaming's non-public members that loopwarden relies on (see ``streams.seams``)."""

from __future__ import annotations

from typing import Any

from mode.services import Service
from mode.threads import ServiceThread
from mode.utils.logging import CompositeLogger

from streams.seams import Seam, attribute, method


class LoopServiceThread(ServiceThread):
    """A thread service run as a plain service on the loop that starts it:
    mode has no switch for that, so its start and its thread's shutdown
    sequence are taken over (the worker's consumer, streams/worker/transport.py)."""

    async def start(self) -> None:
        # What ServiceThread.start does once its thread runs, minus the thread.
        self._thread_started.set()
        await self._default_start()

    async def _stop_children(self) -> None:
        # ServiceThread leaves this to its thread's shutdown sequence (stop
        # the children, futures and exit stacks), which ``stop`` runs here.
        await self._shutdown_thread()


def check_level_first() -> None:
    """Make mode's per-service loggers check the level before formatting.

    Faust's services log through ``CompositeLogger``, whose ``log()`` builds
    the prefixed message (service label, beacon depth) before the standard
    logger looks at its level, so even a suppressed debug record costs a
    string build on hot paths. This puts the level check first, on the
    class, as no setting does; records that are emitted are unchanged."""
    if CompositeLogger.log is not _original_log:
        return
    original = _original_log

    def log(self: Any, severity: int, message: str, *args: Any, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(severity):
            original(self, severity, message, *args, **kwargs)

    CompositeLogger.log = log  # type: ignore[method-assign]


_original_log = CompositeLogger.log

RELIED_ON: tuple[Seam, ...] = (
    attribute(ServiceThread, "_thread_started", "the event ServiceThread.start sets once its thread runs"),
    method(Service, "_default_start", ("self",), "a service's start without ServiceThread's override"),
    method(ServiceThread, "_stop_children", ("self",), "what ServiceThread's stop leaves to its thread"),
    method(ServiceThread, "_shutdown_thread", ("self",), "the thread's shutdown sequence, run on the loop instead"),
    method(CompositeLogger, "log", ("self", "severity", "message", "args", "kwargs"), "replaced on the class"),
    attribute(CompositeLogger, "logger", "the standard logger the replacement asks for its level"),
)
