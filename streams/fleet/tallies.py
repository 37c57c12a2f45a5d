"""The fleet stage's table: a fingerprint's tally (``FingerprintTally``,
msgpack) per key, and the sweep that forgets idle fingerprints."""

from __future__ import annotations

import logging

import msgspec

from schemas.codec import decode_tally, encode_tally
from schemas.incidents import FingerprintTally
from streams.faustapp.table import PartitionedTable
from streams.observability import logs

log = logging.getLogger("loopwarden.fleet")


class Tallies(PartitionedTable):
    """The tallies, read and written through Faust's table in the agent that
    counts (the partition is its event's). A tally starts with its touched
    time as a stored run does, so the table's idle sweep (active partitions
    only, re-checked before deleting, tombstones to the changelog) expires
    fingerprints."""

    def get(self, key: bytes, fingerprint: str) -> FingerprintTally | None:
        """The stored tally; None for a fingerprint not seen, or one this
        version cannot read (counted afresh, with one log line)."""
        stored = self.table.get(key)
        if stored is None:
            return None
        try:
            return decode_tally(stored)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            logs.event(
                log,
                logging.ERROR,
                "stored tally unreadable; counting the fingerprint afresh",
                event="tally_unreadable",
                fingerprint=fingerprint[:200],
                error=str(exc)[:200],
            )
            return None

    def put(self, key: bytes, tally: FingerprintTally) -> None:
        self.table[key] = encode_tally(tally)
