"""The verdict a gateway gets: loopwarden's, or the client's fallback when
there is none (the policy a gateway chose for a missing verdict)."""

from __future__ import annotations

import logging
from typing import Literal

import msgspec

from schemas.verdicts import Verdict

Policy = Literal["fail_open", "fail_closed"]
POLICIES: tuple[str, ...] = ("fail_open", "fail_closed")

log = logging.getLogger("loopwarden.client")


class ClientVerdict(Verdict, kw_only=True):
    """A verdict as the gateway sees it: the wire `Verdict`, plus whether it
    came from loopwarden or from the client's fallback policy.

    `fallback` is None for a real verdict, else the policy applied
    (`"fail_open"` or `"fail_closed"`); `fallback_reason` then says why
    (`"timeout"`, `"publish_failed: …"`, `"closed"`)."""

    fallback: Literal["fail_open", "fail_closed"] | None = None
    fallback_reason: str | None = None

    @property
    def allowed(self) -> bool:
        """True when the tool may run (allow or warn)."""
        return self.decision in ("allow", "warn")

    @property
    def is_fallback(self) -> bool:
        return self.fallback is not None


decode_verdict = msgspec.json.Decoder(ClientVerdict).decode


def fallback(
    policy: Policy, reason: str, limit: float, run_id: str, seq: int, tool_call_id: str, tool_name: str
) -> ClientVerdict:
    """The policy's verdict for a call that got none within `limit` seconds
    (or could not be published: `reason`), with a message that says so."""
    what = "allowed without a loop check" if policy == "fail_open" else "blocked"
    why = f"no verdict within {limit:g}s" if reason.startswith("timeout") else reason
    message = f"loopwarden unavailable ({why}); policy {policy}: the call was {what}." + (
        "" if policy == "fail_open" else " Retry later or ask an operator to check the loop guard."
    )
    log.warning("loopwarden: run=%s seq=%s tool=%s: %s", run_id, seq, tool_name, message)
    return ClientVerdict(
        run_id=run_id,
        seq=seq,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        decision="allow" if policy == "fail_open" else "block",
        level="none" if policy == "fail_open" else "critical",
        message=message,
        fallback=policy,
        fallback_reason=reason,
    )
