"""The event decoder's C depth bound (schemas/_scan.c) against the two counts it replaces."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import _scan, codec


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=300)
    | st.lists(st.sampled_from([b"[", b"{", b"]", b"}", b'"', b"a"]), max_size=5000).map(b"".join)
)
def test_openings_counts_what_the_two_counts_count(data: bytes) -> None:
    assert _scan.openings(data) == data.count(b"[") + data.count(b"{")


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 4079, 4080, 4081, 3 * 4096 + 5])
def test_openings_at_every_block_boundary(size: int) -> None:
    """Counted per byte lane in blocks of 255 x 16 bytes: a block of nothing but
    openings fills every lane exactly."""
    assert _scan.openings(b"{" * size) == size
    assert _scan.openings(bytearray(b"[x" * size)) == size
    assert codec._openings is _scan.openings
