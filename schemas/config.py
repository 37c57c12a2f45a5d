"""Configuration: the `tools.loopDetection` block as written (every field optional,
so a per-agent block can be merged over the global one field by field) and the
resolved values the engine runs with."""

from __future__ import annotations

from msgspec import UNSET, Struct, UnsetType, field


class DetectorsBlock(Struct, forbid_unknown_fields=True, omit_defaults=True):
    genericRepeat: bool | UnsetType = UNSET
    knownPollNoProgress: bool | UnsetType = UNSET
    pingPong: bool | UnsetType = UNSET
    argumentChurn: bool | UnsetType = UNSET


class PostCompactionGuardBlock(Struct, forbid_unknown_fields=True, omit_defaults=True):
    windowSize: int | UnsetType = UNSET


class LoopDetectionBlock(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """`tools.loopDetection` exactly as a gateway config writes it."""

    enabled: bool | UnsetType = UNSET
    historySize: int | UnsetType = UNSET
    warningThreshold: int | UnsetType = UNSET
    criticalThreshold: int | UnsetType = UNSET
    unknownToolThreshold: int | UnsetType = UNSET
    globalCircuitBreakerThreshold: int | UnsetType = UNSET
    detectors: DetectorsBlock | UnsetType = UNSET
    postCompactionGuard: PostCompactionGuardBlock | UnsetType = UNSET


class LoopDetectionConfig(Struct, frozen=True, kw_only=True):
    """Resolved settings for one agent (defaults filled, thresholds ordered).

    `enabled` keeps the difference between "not set" (None) and an explicit
    false: the post-compaction guard runs unless it is explicitly false.
    """

    enabled: bool | None = None
    history_size: int = 30
    warning_threshold: int = 10
    critical_threshold: int = 20
    unknown_tool_threshold: int = 10
    global_circuit_breaker_threshold: int = 30
    generic_repeat: bool = True
    known_poll_no_progress: bool = True
    ping_pong: bool = True
    argument_churn: bool = True
    window_size: int = 3

    @property
    def rolling(self) -> bool:
        """Rolling-history detectors run only when explicitly enabled."""
        return self.enabled is True

    @property
    def guard(self) -> bool:
        """The post-compaction guard runs unless explicitly disabled."""
        return self.enabled is not False


class FleetConfig(Struct, frozen=True, kw_only=True):
    """The global settings plus each listed agent's merged settings."""

    default: LoopDetectionConfig = field(default_factory=LoopDetectionConfig)
    agents: dict[str, LoopDetectionConfig] = field(default_factory=dict)

    def for_agent(self, agent_id: str | None) -> LoopDetectionConfig:
        if agent_id is None:
            return self.default
        return self.agents.get(agent_id, self.default)
