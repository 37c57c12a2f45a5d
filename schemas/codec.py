"""Bytes <-> structs at the process boundary: events in, verdicts out, run
state to and from RocksDB. Every refusal says what was wrong and where."""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import accumulate

import msgspec

from schemas.events import EVENT_TYPES, MAX_TURN_CHARS, Event
from schemas.extensions import EXTENSIONS_OFF
from schemas.incidents import FingerprintTally, Incident
from schemas.jsnumbers import FLOAT_HOOK
from schemas.state import StoredRun
from schemas.verdicts import Verdict


class BadEvent(ValueError):
    """An input the processor refuses (it goes to the dead-letter topic).

    ``kind`` is a short, countable name for the reason (the dead letter's
    ``loopwarden.kind`` header, a metric label), chosen where it is raised."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


_event_decoder = msgspec.json.Decoder(Event, float_hook=FLOAT_HOOK)
_verdict_encoder = msgspec.json.Encoder()
_verdict_decoder = msgspec.json.Decoder(Verdict)
_stored_encoder = msgspec.msgpack.Encoder()
_stored_decoder = msgspec.msgpack.Decoder(StoredRun)
_BAD_TAG = re.compile(r"Invalid value '(.*)' - at `\$\.type`")
_BAD_TURN = re.compile(r"^Expected `str`(?:, got `(?P<got>\w+)`| of length (?P<bound>[<>])= \d+) - at `\$\.turn`$")


MAX_DEPTH = 256
"""Deepest nesting accepted in an event. Checked on the bytes, so the answer
does not depend on how deep the caller's own stack already is."""


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [1 if b in b"[{" else -1 for b in range(256)]
_SHORTEST_TOO_DEEP = 2 * (MAX_DEPTH + 1)
"""Valid JSON nested deeper than MAX_DEPTH has at least this many bytes (the
brackets alone), so shorter input needs the check only when it fails to decode."""
_TOO_DEEP = f"not a JSON event: nested deeper than {MAX_DEPTH} levels"


def _python_openings(data: bytes) -> int:
    return data.count(b"[") + data.count(b"{")


_openings: Callable[[bytes], int] = _python_openings
"""How many '[' and '{' bytes: in C (`schemas/_scan.c`) one pass costs a tenth
of the two counts, which were a third of decoding a kilobyte event."""
if not EXTENSIONS_OFF:
    try:
        from schemas._scan import openings as _openings
    except ImportError:  # installed without a C compiler
        pass


def _too_deep(data: bytes) -> bool:
    if _openings(data) <= MAX_DEPTH:
        return False  # cheap and the common case: cannot be that deep
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > MAX_DEPTH


def decode_event(data: bytes | str) -> Event:
    """One event from its JSON bytes; raises BadEvent with a readable reason."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) >= _SHORTEST_TOO_DEEP and _too_deep(data):
        raise BadEvent("not_json", _TOO_DEEP)
    try:
        return _event_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        if len(data) < _SHORTEST_TOO_DEEP and _too_deep(data):
            raise BadEvent("not_json", _TOO_DEEP) from None
        if isinstance(exc, RecursionError):
            raise
        if isinstance(exc, msgspec.DecodeError):
            cleaned = drop_lone_surrogates(data)
            if cleaned is not data:
                return decode_event(cleaned)
            if data[-1:].isspace():  # a file's line ending: refuse the line in the words used for a record
                return decode_event(data.rstrip())
        raise _refusal(exc, data) from None


_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def drop_lone_surrogates(data: bytes) -> bytes:
    """The JSON text without its escapes of unpaired UTF-16 surrogates (the
    same object when it has none).

    A JavaScript gateway that cuts a string through a surrogate pair (an emoji
    at a truncation boundary) sends `\\ud83d` alone: valid JSON, but no
    Unicode string. The reference gateway drops unpaired surrogates from every
    string it hashes, so dropping them here gives its hashes; ids lose them too.
    Escapes are read left to right, so an escaped backslash is never mistaken
    for the start of one.
    """
    drops: list[tuple[int, int]] = []
    high: tuple[int, int] | None = None  # a high surrogate waiting for its low half
    for match in _ESCAPE.finditer(data):
        digits = match.group(1)
        unit = int(digits, 16) if digits else -1
        if high is not None:
            if 0xDC00 <= unit <= 0xDFFF and match.start() == high[1]:
                high = None
                continue  # a pair: one character
            drops.append(high)
            high = None
        if 0xD800 <= unit <= 0xDBFF:
            high = match.span()
        elif 0xDC00 <= unit <= 0xDFFF:
            drops.append(match.span())
    if high is not None:
        drops.append(high)
    if not drops:
        return data
    kept = []
    start = 0
    for begin, end in drops:
        kept.append(data[start:begin])
        start = end
    kept.append(data[start:])
    return b"".join(kept)


def _refusal(exc: msgspec.ValidationError | msgspec.DecodeError, data: bytes) -> BadEvent:
    """Why msgspec refused an event, in words."""
    if isinstance(exc, msgspec.ValidationError):
        text = str(exc)
        bad_tag = _BAD_TAG.match(text)
        if bad_tag:
            expected = ", ".join(EVENT_TYPES)
            return BadEvent("unknown_type", f"unknown event type {bad_tag.group(1)!r} (expected one of {expected})")
        if "missing required field `type`" in text:
            return BadEvent("missing_type", f"missing field 'type' (expected one of {', '.join(EVENT_TYPES)})")
        bad_turn = _BAD_TURN.match(text)
        if bad_turn:
            got = bad_turn["got"] or ("an empty string" if bad_turn["bound"] == ">" else "a longer string")
            return BadEvent(
                "invalid_turn", f"invalid event: turn: expected a string of 1 to {MAX_TURN_CHARS} characters, got {got}"
            )
        return BadEvent("invalid", f"invalid event: {text}")
    return BadEvent("not_json", f"not a JSON event: {exc}")


def encode_verdict(verdict: Verdict) -> bytes:
    return _verdict_encoder.encode(verdict)


def append_verdict(buffer: bytearray, verdict: Verdict) -> None:
    """Append the verdict as one JSON line: a whole output in one buffer, no
    bytes object per verdict."""
    _verdict_encoder.encode_into(verdict, buffer, -1)
    buffer.append(0x0A)


def decode_verdict(data: bytes | str) -> Verdict:
    return _verdict_decoder.decode(data)


def encode_stored(stored: StoredRun) -> bytes:
    return _stored_encoder.encode(stored)


def decode_stored(data: bytes) -> StoredRun:
    return _stored_decoder.decode(data)


class _Touched(msgspec.Struct, array_like=True):
    """The first field of a stored run, read without decoding the state."""

    touched: float
    state: msgspec.Raw


_touched_decoder = msgspec.msgpack.Decoder(_Touched)


def touched_at(data: bytes) -> float:
    """When a stored run was last touched (for the idle TTL), at the cost of its first field only."""
    return _touched_decoder.decode(data).touched


_incident_encoder = msgspec.json.Encoder()
_incident_decoder = msgspec.json.Decoder(Incident)
_tally_decoder = msgspec.msgpack.Decoder(FingerprintTally)


def encode_incident(incident: Incident) -> bytes:
    return _incident_encoder.encode(incident)


def decode_incident(data: bytes | str) -> Incident:
    return _incident_decoder.decode(data)


def encode_tally(tally: FingerprintTally) -> bytes:
    return _stored_encoder.encode(tally)


def decode_tally(data: bytes) -> FingerprintTally:
    return _tally_decoder.decode(data)
