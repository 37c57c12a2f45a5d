"""The state layout benchmark compares like with like: its digest layout
holds the very hashes of the engine's state, each recoverable as the hex
the engine keeps. Its timings belong to the machine and are never asserted."""

from __future__ import annotations

import msgspec
import pytest

from bench import state_layout
from schemas.codec import encode_stored
from schemas.state import RunState


def test_the_digest_layout_holds_every_hash_of_a_real_state() -> None:
    hexed = state_layout.real_state(32)
    digests = state_layout.as_digests(hexed)
    records = hexed.state.history
    assert len(records) == 30  # historySize: a full history
    assert len(digests.state.history) == len(records)
    for record, digest in zip(records, digests.state.history, strict=True):
        assert record.result_hash is not None  # every call of the run has its result
        assert state_layout.to_hex(digest) == (record.args_hash.partition(":")[2], record.result_hash)
        assert (digest.tool, digest.call_id) == (record.tool, record.call_id)
    # 32 bytes a digest against 64 characters (and the args hash's "read:" prefix)
    assert len(msgspec.msgpack.encode(digests)) < 0.6 * len(encode_stored(hexed))


def test_the_digest_layout_mirrors_every_field_of_the_stored_state() -> None:
    # A field RunState gains must be added to the mirror, or the sizes compare unlike states.
    assert state_layout.DigestState.__struct_fields__ == RunState.__struct_fields__


def test_it_reports_both_layouts_and_the_conversions(capsys: pytest.CaptureFixture[str]) -> None:
    assert state_layout.main(["--calls", "4", "--repeat", "1", "--number", "3"]) == 0
    out = capsys.readouterr().out
    for row in ("hex (stored format)", "digests", "edge conversions"):
        assert row in out
