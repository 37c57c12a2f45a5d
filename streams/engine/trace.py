"""The decision path of one event, as `apply(..., trace=True)` takes it.

`loopwarden explain` renders it, so what it tells is what the engine did,
not a second telling of the engine's branches. Built only when asked for:
an untraced event pays one `None` check per branch it takes.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from schemas.config import LoopDetectionConfig
from schemas.verdicts import Decision, DetectorName, ShadowDecision, Verdict
from streams.engine.detectors import Detection, Measures
from streams.engine.hashing import ResultHashes

Rule = Literal["aborted", "budget", "detectors", "turn", "latch", "recovery", "escalation", "guard"]
"""Policy spec §2's steps for a call (the detectors' step split by the rule
that decided it: the detectors, §8.1's turn rule, a §8.2 latch), and the
post-compaction guard for a result."""

CallFound = Literal["open", "late", "vetoed", "none"]
"""How a result found the call it completes: its open record in the history,
the call that had left the history unfinished, its veto record, or none."""


class Step(Struct, frozen=True, kw_only=True):
    """One rule the engine applied, and the verdict as it stood after it."""

    rule: Rule
    decision: Decision
    shadow_decision: ShadowDecision | None = None
    detector: DetectorName | None = None
    count: int | None = None
    threshold: int | None = None
    """The setting the count was held against (None where no count was)."""
    warning_key: str | None = None
    tool: str | None = None
    """The blocked loop's tool: this call's, or for the turn rule and a latch the earlier call's."""


class Trace(Struct, kw_only=True):
    """What one event met and what each rule decided, in the order it decided."""

    agent_id: str | None = None
    aborted: bool = False
    """The run was aborted before this event."""
    args_hash: str | None = None
    """A call's args hash; a result's, or that of the call it completes."""
    kind: int = 0
    turn: str | None = None
    pending: int = 0
    """Open calls of this call's turn, counted as vetoes when it was decided (spec §8.1)."""
    measures: Measures | None = None
    """What the detectors measured for this call, before it was decided."""
    first_blocked_turn: str | None = None
    """The run's first blocked turn when recovery judged this call (spec §8.3)."""
    facts: ResultHashes | None = None
    """The outcome a result reports."""
    call: CallFound | None = None
    latches_released: int = 0
    armed: int = 0
    """The guard's window when this compaction armed it (0: it did not)."""
    steps: list[Step] = []

    def add(
        self,
        rule: Rule,
        verdict: Verdict,
        threshold: int | None = None,
        tool: str | None = None,
        count: int | None = None,
    ) -> None:
        """A step that left `verdict`; its count is the verdict's unless the rule counted something else."""
        self.steps.append(
            Step(
                rule=rule,
                decision=verdict.decision,
                shadow_decision=verdict.shadow_decision,
                detector=verdict.detector,
                count=verdict.count if count is None else count,
                threshold=threshold,
                warning_key=verdict.warning_key,
                tool=tool,
            )
        )

    @property
    def decision(self) -> Decision | None:
        """The decision of the last step: the verdict's (None: the event had no verdict)."""
        return self.steps[-1].decision if self.steps else None

    @property
    def decided_by(self) -> Step | None:
        """The step of §2.3 that decided a call: the detectors, its turn's block, or a latch."""
        return next((s for s in self.steps if s.rule in ("detectors", "turn", "latch")), None)


def threshold(found: Detection, cfg: LoopDetectionConfig) -> int:
    """The setting a detection's count reached."""
    if found.detector == "unknown_tool_repeat":
        return cfg.unknown_tool_threshold
    if found.detector == "global_circuit_breaker":
        return cfg.global_circuit_breaker_threshold
    return cfg.critical_threshold if found.level == "critical" else cfg.warning_threshold
