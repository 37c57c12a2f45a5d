"""Numbers as JavaScript spells them. Event payloads are hashed as the
reference gateway stringifies them, and JavaScript prints `1.0` as `1`: so
the event decoder turns every untyped float into a `msgspec.Raw` holding the
JavaScript spelling (`FLOAT_HOOK`), which the stable JSON encoder then copies
verbatim."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec


def js_number(value: float) -> str:
    """Spell a double the way JavaScript's Number#toString does."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp = repr(abs(value)).partition("e")
    whole, _, frac = mantissa.partition(".")
    # repr gives the shortest round-tripping digits, as ECMAScript requires;
    # only the placement of the decimal point differs between the two.
    raw_digits = whole + frac
    digits = raw_digits.lstrip("0")
    point = len(whole) + (int(exp) if exp else 0) - (len(raw_digits) - len(digits))
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= point <= 21:
        return sign + digits + "0" * (point - k)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * (-point) + digits
    e = point - 1
    body = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{body}e{'+' if e > 0 else '-'}{abs(e)}"


_TINY = ("0.0000", "-0.0000")


def _float_hook(text: str) -> Any:
    if len(text) <= 16 and text[-1] != "0" and "e" not in text and "E" not in text and not text.startswith(_TINY):
        # The usual literal is already JavaScript's spelling: at most 15
        # significant digits (one decimal reading, so its digits are the
        # shortest round-trip ones), no trailing zero, fixed notation between
        # 1e-4 and 1e15 (inside JavaScript's fixed range). JSON allows no
        # leading zeros or "+".
        return msgspec.Raw(text)
    value = float(text)
    spelled = repr(value)
    if "e" not in spelled and "n" not in spelled:
        # Python's fixed notation (1e-4 <= |x| < 1e16) lies inside JavaScript's,
        # and both print the shortest round-tripping digits: only a trailing
        # ".0" (and the sign of zero) differ.
        if spelled.endswith(".0"):
            spelled = spelled[:-2]
            if spelled == "-0":
                spelled = "0"
        return msgspec.Raw(spelled.encode())
    if math.isfinite(value):
        return msgspec.Raw(js_number(value).encode())
    # An overflowing literal parses to Infinity; the reference's stable stringify
    # spells non-finite numbers as strings.
    return msgspec.Raw(json.dumps(js_number(value)).encode())


FLOAT_HOOK = _float_hook
