"""Operator logging: one structured line per thing that matters.

Lines are logfmt (``key=value``) by default or JSON (``--log-format json``).
The stream processor logs a line for a delivered warning, a block, an abort,
an armed post-compaction guard and a dead-lettered event, plus a periodic
summary while it is busy; never one per healthy event.

The libraries under the worker (faust, mode, aiokafka, kafka-python) are held
at WARNING, whatever the worker's own level, so that their per-message debug
records are never built; ``--faust-loglevel`` raises them when debugging.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

LOGGER_NAME = "loopwarden"

#: Loggers of the stack under the worker, kept quiet unless asked.
LIBRARY_LOGGERS = ("faust", "mode", "aiokafka", "kafka", "rocksdict", "venusian", "asyncio")

_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _utc(created: float) -> str:
    seconds = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"


def _logfmt_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if text and all(c.isprintable() and c not in ' "=\\' for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a caller passed with ``extra={"fields": {...}}``
    (or as plain extra attributes)."""
    fields = getattr(record, "fields", None)
    if isinstance(fields, Mapping):
        return dict(fields)
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class LogfmtFormatter(logging.Formatter):
    """``ts=… level=… logger=… msg="…" key=value …``"""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"ts={_utc(record.created)}",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_logfmt_value(record.getMessage())}",
        ]
        parts.extend(f"{key}={_logfmt_value(value)}" for key, value in fields_of(record).items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in fields_of(record).items():
            document.setdefault(key, value)
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False, default=str)


FORMATS = {"logfmt": LogfmtFormatter, "json": JsonFormatter}


def level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r} (expected debug, info, warning, error or critical)")
    return number


def setup(
    level: str | int = "info",
    fmt: str = "logfmt",
    *,
    library_level: str | int = "warning",
    stream: TextIO | None = None,
) -> None:
    """Route every logger to one handler on stderr with the chosen format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(FORMATS[fmt]())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_number(level))
    libraries = level_number(library_level)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(libraries)
    logging.getLogger(LOGGER_NAME).setLevel(level_number(level))
    if libraries > logging.DEBUG:
        quiet_service_loggers()
    if libraries >= logging.WARNING:
        logging.getLogger("aiokafka.consumer.group_coordinator").addFilter(_transient_coordinator_noise)


#: What aiokafka logs (as errors) while a fresh broker creates its offsets
#: topic or moves a coordinator: it retries by itself, so these say nothing.
_TRANSIENT = ("GroupCoordinatorNotAvailableError", "Marking the coordinator dead", "NotCoordinatorForGroupError")


def _transient_coordinator_noise(record: logging.LogRecord) -> bool:
    text = record.getMessage()
    return not any(marker in text for marker in _TRANSIENT)


def quiet_service_loggers() -> None:
    """Make mode's per-service loggers check the level before formatting
    (``streams.seams.mode.check_level_first``): faust's services build
    each record's prefixed message before the standard logger looks at its
    level, so even suppressed debug records cost a string build on hot paths."""
    from streams.seams import mode as mode_seams  # mode only once a command logs through it

    mode_seams.check_level_first()


def get(name: str = LOGGER_NAME) -> logging.Logger:
    return logging.getLogger(name)


def event(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    """Log one structured line (only builds the record when enabled)."""
    if logger.isEnabledFor(level):
        logger.log(level, msg, extra={"fields": fields})
