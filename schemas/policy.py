"""The policy file: loopwarden's own enforcement settings (shadow mode,
recovery, escalation when blocks are ignored, a tool-call budget), kept apart from the
gateway's config, which the gateway validates strictly itself.

The blocks are the file as written (every field optional, so an agent's block
merges over the top level key by key); `Policy` is what one run is judged by.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field


POLICY_ENV = "LOOPWARDEN_POLICY"

Mode = Literal["enforce", "shadow"]
Positive = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[int, Meta(ge=0)]


class PolicyError(ValueError):
    """A policy that cannot be run; the message starts with the bad field's path."""


class EscalationBlock(Struct, forbid_unknown_fields=True, omit_defaults=True):
    enabled: bool | UnsetType = UNSET
    blockedCalls: Positive | UnsetType = UNSET
    window: Positive | UnsetType = UNSET


class BudgetBlock(Struct, forbid_unknown_fields=True, omit_defaults=True):
    maxToolCalls: NonNegative | UnsetType = UNSET


class RecoveryBlock(Struct, forbid_unknown_fields=True, omit_defaults=True):
    enabled: bool | UnsetType = UNSET


class AgentPolicyBlock(Struct, forbid_unknown_fields=True, omit_defaults=True):
    mode: Mode | UnsetType = UNSET
    recovery: RecoveryBlock | UnsetType = UNSET
    escalation: EscalationBlock | UnsetType = UNSET
    budget: BudgetBlock | UnsetType = UNSET


class PolicyFile(AgentPolicyBlock, forbid_unknown_fields=True, omit_defaults=True):
    """The policy file exactly as written."""

    agents: dict[str, AgentPolicyBlock] = field(default_factory=dict)


class Policy(Struct, frozen=True, kw_only=True):
    """Resolved settings for one agent's runs (defaults filled)."""

    mode: Mode = "enforce"
    recovery: bool = True
    """A loop that comes back after its block ends the run (loop-detection spec §8.3)."""
    escalation: bool = False
    blocked_calls: int = 3
    window: int = 10
    max_tool_calls: int = 0

    @property
    def shadow(self) -> bool:
        return self.mode == "shadow"


class FleetPolicy(Struct, frozen=True):
    """The top-level policy and each named agent's."""

    default: Policy = Policy()
    agents: dict[str, Policy] = field(default_factory=dict)

    def for_agent(self, agent_id: str | None) -> Policy:
        if agent_id is None:
            return self.default
        return self.agents.get(agent_id, self.default)


def _merge(base: Policy, block: AgentPolicyBlock, path: str) -> Policy:
    changes: dict[str, Any] = {}
    if block.mode is not UNSET:
        changes["mode"] = block.mode
    if block.recovery is not UNSET and block.recovery.enabled is not UNSET:
        changes["recovery"] = block.recovery.enabled
    escalation = block.escalation
    if escalation is not UNSET:
        for key, name in (("enabled", "escalation"), ("blockedCalls", "blocked_calls"), ("window", "window")):
            value = getattr(escalation, key)
            if value is not UNSET:
                changes[name] = value
    if block.budget is not UNSET and block.budget.maxToolCalls is not UNSET:
        changes["max_tool_calls"] = block.budget.maxToolCalls
    policy = msgspec.structs.replace(base, **changes)
    if policy.window < policy.blocked_calls:
        raise PolicyError(
            f"{path}escalation.window: must be at least blockedCalls ({policy.blocked_calls}), got {policy.window}"
        )
    return policy


_PATH = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>.*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([A-Za-z_]\w*)|\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]")


def _steps(path: str) -> list[str]:
    """`.agents['a b'].mode` -> ['agents', 'a b', 'mode']."""
    return [next(part for part in step if part) for step in _STEP.findall(path)]


def _choices(kind: type, steps: list[str]) -> list[Any]:
    """The values the Literal at `steps` inside `kind` allows: msgspec's enum
    error names only the value it refused."""
    from msgspec import inspect

    def members(info: inspect.Type) -> tuple[inspect.Type, ...]:
        return info.types if isinstance(info, inspect.UnionType) else (info,)

    def child(info: inspect.Type, step: str) -> list[inspect.Type]:
        if isinstance(info, inspect.StructType):
            return [found.type for found in info.fields if found.encode_name == step]
        return [info.value_type] if isinstance(info, inspect.DictType) else []

    found = [inspect.type_info(kind)]
    for step in steps:
        found = [inner for info in found for member in members(info) for inner in child(member, step)]
    return [value for info in found for member in members(info) if isinstance(member, inspect.LiteralType)
            for value in member.values]  # fmt: skip


def _convert(value: Any, kind: type[AgentPolicyBlock], prefix: str) -> Any:
    try:
        return msgspec.convert(value, kind, strict=True)
    except msgspec.ValidationError as exc:
        match = _PATH.match(str(exc))
        assert match is not None  # the pattern matches any text
        steps = _steps(match["path"] or "")
        message = match["message"]
        if message.startswith("Invalid enum value"):
            message += f" (expected one of: {', '.join(map(str, _choices(kind, steps)))})"
        where = prefix + ".".join(steps)
        raise PolicyError(f"{where.rstrip('.') or '(top level)'}: {message}") from None


def parse_policy(document: Any) -> FleetPolicy:
    """Validate a decoded policy document strictly and resolve every agent.

    Each agent's block is checked on its own, since a validation error inside a
    map does not say under which key it is."""
    agents = document.get("agents") if isinstance(document, dict) else None
    if isinstance(agents, dict):
        for name, block in agents.items():
            _convert(block, AgentPolicyBlock, f"agents.{name}.")
    written = _convert(document, PolicyFile, "")
    default = _merge(Policy(), written, "")
    resolved = {name: _merge(default, block, f"agents.{name}.") for name, block in written.agents.items()}
    return FleetPolicy(default, resolved)
