"""Deterministic JSON, byte-compatible with the reference gateway's stable stringify.

Hashes must match what gateways compute themselves, so the serialisation
follows JavaScript: object keys sorted by UTF-16 code units, numbers printed as
`Number.prototype.toString` prints them, strings escaped as `JSON.stringify`
escapes them. msgspec does all of that in C (`order="sorted"`) for the common
case; the few inputs it would print differently (integers beyond 2**53, keys
mixing astral characters with U+E000..U+FFFF) take an exact pure-Python path.

Floats are the other difference (JavaScript prints `1.0` as `1`). They are
fixed when the payload is decoded: `decode_payload` and the event decoder turn
every untyped float into a `msgspec.Raw` holding the JavaScript spelling, so the
encoder copies it verbatim.

`streams.engine._speedups`, a C extension built where a compiler is available,
serialises and digests the common case in one call; it declines (None) every
input it could print differently, and those take the path defined here.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable
from typing import Any

import msgspec

from schemas.jsnumbers import FLOAT_HOOK, js_number
from streams.engine.compiled import EXTENSIONS_OFF

speedups: Any = None
"""streams.engine._speedups, or None for the pure-Python path alone."""
if not EXTENSIONS_OFF:
    try:
        speedups = importlib.import_module("streams.engine._speedups")
    except ImportError:  # installed without a C compiler
        pass

UNDEFINED = msgspec.Raw(b"undefined")
"""JavaScript's `undefined` inside a stable-stringified object (a missing field)."""

_encode_sorted = msgspec.json.Encoder(order="sorted").encode
# Digits map to "0", everything else to " ": a run of sixteen zeros then marks an
# integer that may be beyond 2**53. A translate and a substring search cost far
# less than a regular expression over a kilobyte of payload.
_DIGIT_MAP = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_SIXTEEN_DIGITS = b"0" * 16
# Byte searches below use `find` with a bytes needle and `in` with an int:
# `bytes in bytes` first tries the needle as an int and pays for a TypeError.


_payload_decoder = msgspec.json.Decoder(float_hook=FLOAT_HOOK)


def decode_payload(data: bytes | str) -> Any:
    """Decode JSON the way the engine expects payloads: floats in JavaScript spelling."""
    return _payload_decoder.decode(data)


def normalize_payload(value: Any) -> Any:
    """Bring a Python value (floats and all) into the engine's payload form."""
    return _payload_decoder.decode(msgspec.json.encode(value))


def python_stable_json(value: Any) -> bytes:
    """UTF-8 bytes of the reference gateway's stable stringify of `value`: the
    definition, and the whole of `stable_json` without the C extension."""
    out = _encode_sorted(value)
    if out.translate(_DIGIT_MAP).find(_SIXTEEN_DIGITS) >= 0 or (not out.isascii() and _keys_may_sort_differently(out)):
        return _exact(value).encode("utf-8", "surrogatepass")
    return out


def _with_speedups(value: Any) -> bytes:
    return speedups.stable_json(value) or python_stable_json(value)


stable_json = python_stable_json if speedups is None else _with_speedups


MARKER = b"<<<EXTERNAL_UNTRUSTED_CONTENT"
"""Every untrusted-content wrap starts with it; JSON never escapes its characters,
so an outcome whose stable JSON lacks it has no wrap to canonicalise."""
CANONICAL_MARKER_ID = "0000000000000000"
# A whole wrap, opening id to closing id, with no other wrap inside. The quotes
# around the ids may carry the backslashes of JSON escaping (a wrap inside
# serialised text): group 2, which the closing id must repeat.
_WRAP = re.compile(
    r'(<<<EXTERNAL_UNTRUSTED_CONTENT id=(\\*)")([a-f0-9]{16})'
    r'(\2">>>(?:(?!<<<(?:END_)?EXTERNAL_UNTRUSTED_CONTENT)[\s\S])*<<<END_EXTERNAL_UNTRUSTED_CONTENT id=\2")\3(\2">>>)'
)
_QUOTE = re.compile(r'(?<!\\)\\*"')


def _canonical_wrap(match: re.Match[str]) -> str:
    """Both ids of one wrap made `0000000000000000`, but only when the escaping
    is consistent: the quotes around the ids carry 2**k - 1 backslashes (k
    levels of JSON escaping) and every quote inside the wrap is escaped to a
    whole number of those levels. Anything else is left exactly as it is."""
    start, escapes, _, middle, end = match.groups()
    level = len(escapes) + 1
    if len(escapes) & level or any(len(quote.group()) % level for quote in _QUOTE.finditer(middle)):
        return match.group()
    return start + CANONICAL_MARKER_ID + middle + CANONICAL_MARKER_ID + end


def stable_markers(text: str) -> str:
    """The gateway wraps external content with a fresh random id each time:
    the same content must hash the same (spec §7.1)."""
    return _WRAP.sub(_canonical_wrap, text) if "<<<EXTERNAL_UNTRUSTED_CONTENT" in text else text


def python_outcome_json(value: Any) -> bytes:
    """Stable JSON of a tool's outcome: every string, object keys included,
    with its untrusted-content markers made stable first (keys are then sorted
    by their stable form, ties by the original)."""
    out = python_stable_json(value)
    if out.find(MARKER) < 0:
        return out
    return _exact(value, stable_markers).encode("utf-8", "surrogatepass")


def _keys_may_sort_differently(out: bytes) -> bool:
    """UTF-16 and code-point order differ only between astral characters and U+E000..U+FFFF."""
    return (0xEE in out or 0xEF in out) and (0xF0 in out or 0xF1 in out or 0xF2 in out or 0xF3 in out or 0xF4 in out)


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _exact(value: Any, normalize: Callable[[str], str] | None = None) -> str:
    """Slow and exact; only for the inputs the fast path would print differently
    (and for outcomes whose strings `normalize` rewrites)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json.dumps(value if normalize is None else normalize(value), ensure_ascii=False)
    if isinstance(value, int):
        if abs(value) < 2**53:
            return str(value)
        return js_number(float(value))  # JSON.parse keeps only a double
    if isinstance(value, float):
        return js_number(value) if math.isfinite(value) else json.dumps(js_number(value))
    if isinstance(value, msgspec.Raw):
        return bytes(value).decode()
    if isinstance(value, dict):
        # Keys sorted by their normalised form, ties (two keys one once normalised) by the original.
        items = sorted(
            ((k if normalize is None else normalize(k), k, v) for k, v in value.items()),
            key=lambda kv: (_utf16_key(kv[0]), _utf16_key(kv[1])),
        )
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _exact(v, normalize) for k, _, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_exact(v, normalize) for v in value) + "]"
    return _exact(msgspec.to_builtins(value), normalize)
