"""What command-line options accept: durations and counts, each refused with
a message naming the value given."""

from __future__ import annotations

import argparse
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``1h``, ``250ms``."""
    match = _DURATION.match(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 15m or 1h, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """How `duration` would be given these seconds, as a person writes it: 1h, 30s, 2.8s, 250ms."""
    if seconds >= 1:
        for unit in ("d", "h", "m"):
            if (seconds / _UNITS[unit]).is_integer():
                return f"{int(seconds / _UNITS[unit])}{unit}"
    elif round(seconds * 1000, 9).is_integer():
        return f"{int(round(seconds * 1000))}ms"
    return f"{int(seconds) if float(seconds).is_integer() else seconds!r}s"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value
