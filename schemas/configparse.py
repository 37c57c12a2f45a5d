"""Reading `tools.loopDetection` (global and per agent): strict validation with
the exact path of a bad field, field-by-field merging, and the runtime's
threshold ordering.

Only `tools.loopDetection` and the per-agent blocks (the map
`agents.entries.<agentId>.tools.loopDetection`, and the older list
`agents.list[]` of `{id, tools: {loopDetection}}`) are read, so a gateway's
whole config file can be given.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

import msgspec
from msgspec import UNSET

from schemas.config import (
    DetectorsBlock,
    FleetConfig,
    LoopDetectionBlock,
    LoopDetectionConfig,
    PostCompactionGuardBlock,
)


class ConfigError(ValueError):
    """A config that cannot be run; the message starts with the bad field's path."""


class Resolved(NamedTuple):
    config: FleetConfig
    notes: list[str]
    """Corrections the runtime made (threshold reordering), for the start-up log."""


_POSITIVE = (
    "historySize",
    "warningThreshold",
    "criticalThreshold",
    "unknownToolThreshold",
    "globalCircuitBreakerThreshold",
)
_SUB_BLOCKS: dict[str, tuple[type[msgspec.Struct], dict[str, str]]] = {
    "detectors": (
        DetectorsBlock,
        {"genericRepeat": "bool", "knownPollNoProgress": "bool", "pingPong": "bool", "argumentChurn": "bool"},
    ),
    "postCompactionGuard": (PostCompactionGuardBlock, {"windowSize": "int"}),
}
_TOP_FIELDS = {"enabled": "bool", **{name: "int" for name in _POSITIVE}}


def _show(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)[:80]
    except (TypeError, ValueError):
        return repr(value)[:80]


def _check(path: str, kind: str, value: Any) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {_show(value)}")
        return value
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not is_number or value != int(value) or value <= 0:
        raise ConfigError(f"{path}: expected a positive integer, got {_show(value)}")
    return int(value)


def _object(path: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected an object, got {_show(value)}")
    return value


def _fields(path: str, raw: dict[str, Any], kinds: dict[str, str], extra: tuple[str, ...] = ()) -> dict[str, Any]:
    for key in raw:
        if key not in kinds and key not in extra:
            raise ConfigError(f"{path}.{key}: unknown key (expected one of {', '.join([*kinds, *extra])})")
    return {key: _check(f"{path}.{key}", kinds[key], value) for key, value in raw.items() if key in kinds}


def parse_block(path: str, value: Any) -> LoopDetectionBlock:
    """Validate one `loopDetection` block as written."""
    raw = _object(path, value)
    values: dict[str, Any] = _fields(path, raw, _TOP_FIELDS, tuple(_SUB_BLOCKS))
    for name, (struct, kinds) in _SUB_BLOCKS.items():
        if name in raw:
            sub_path = f"{path}.{name}"
            values[name] = struct(**_fields(sub_path, _object(sub_path, raw[name]), kinds))
    return LoopDetectionBlock(**values)


def merge(base: LoopDetectionBlock, override: LoopDetectionBlock) -> LoopDetectionBlock:
    """Field by field, nested blocks included: an agent sets only what it changes."""
    values = {}
    for name in LoopDetectionBlock.__struct_fields__:
        mine, theirs = getattr(base, name), getattr(override, name)
        if name in _SUB_BLOCKS and mine is not UNSET and theirs is not UNSET:
            values[name] = msgspec.structs.replace(
                mine, **{k: v for k in theirs.__struct_fields__ if (v := getattr(theirs, k)) is not UNSET}
            )
        else:
            values[name] = mine if theirs is UNSET else theirs
    return LoopDetectionBlock(**values)


def resolve(block: LoopDetectionBlock, where: str, notes: list[str]) -> LoopDetectionConfig:
    """Fill defaults and enforce warning < critical < global circuit breaker."""
    default = LoopDetectionConfig()

    def pick(value: Any, fallback: Any) -> Any:
        return fallback if value is UNSET else value

    detectors = block.detectors if block.detectors is not UNSET else DetectorsBlock()
    guard = block.postCompactionGuard if block.postCompactionGuard is not UNSET else PostCompactionGuardBlock()
    warning = pick(block.warningThreshold, default.warning_threshold)
    critical = pick(block.criticalThreshold, default.critical_threshold)
    breaker = pick(block.globalCircuitBreakerThreshold, default.global_circuit_breaker_threshold)
    if critical <= warning:
        notes.append(
            f"{where}.criticalThreshold: {critical} is not above warningThreshold {warning}; using {warning + 1}"
        )
        critical = warning + 1
    if breaker <= critical:
        notes.append(
            f"{where}.globalCircuitBreakerThreshold: {breaker} is not above criticalThreshold {critical}; using {critical + 1}"
        )
        breaker = critical + 1
    return LoopDetectionConfig(
        enabled=pick(block.enabled, None),
        history_size=pick(block.historySize, default.history_size),
        warning_threshold=warning,
        critical_threshold=critical,
        unknown_tool_threshold=pick(block.unknownToolThreshold, default.unknown_tool_threshold),
        global_circuit_breaker_threshold=breaker,
        generic_repeat=pick(detectors.genericRepeat, True),
        known_poll_no_progress=pick(detectors.knownPollNoProgress, True),
        ping_pong=pick(detectors.pingPong, True),
        argument_churn=pick(detectors.argumentChurn, True),
        window_size=pick(guard.windowSize, default.window_size),
    )


def _loop_detection_at(path: str, holder: Any) -> LoopDetectionBlock | None:
    """`holder.tools.loopDetection`, validated, or None when absent."""
    tools = _object(path, holder).get("tools")
    if tools is None:
        return None
    block = _object(f"{path}.tools" if path else "tools", tools).get("loopDetection")
    prefix = f"{path}.tools.loopDetection" if path else "tools.loopDetection"
    return None if block is None else parse_block(prefix, block)


def _listed_agents(value: Any) -> dict[str, tuple[str, LoopDetectionBlock]]:
    """The older shape, `agents.list[]` of `{id, tools: {loopDetection}}`: id -> (path, block)."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise ConfigError(f"agents.list: expected an array, got {_show(value)}")
    found: dict[str, tuple[str, LoopDetectionBlock]] = {}
    for i, entry in enumerate(value):
        path = f"agents.list[{i}]"
        block = _loop_detection_at(path, entry)
        if block is None:
            continue
        agent_id = entry.get("id")
        if not isinstance(agent_id, str) or not agent_id:
            raise ConfigError(f"{path}.id: expected a non-empty string, got {_show(agent_id)}")
        found[agent_id] = (path, block)
    return found


def _mapped_agents(value: Any) -> dict[str, tuple[str, LoopDetectionBlock]]:
    """The current shape, a map `agents.entries.<agentId>.tools.loopDetection`: id -> (path, block)."""
    if value is None:
        return {}
    found: dict[str, tuple[str, LoopDetectionBlock]] = {}
    for agent_id, entry in _object("agents.entries", value).items():
        path = f"agents.entries.{agent_id}"
        block = _loop_detection_at(path, entry)
        if block is not None:
            found[agent_id] = (path, block)
    return found


def parse_config(document: Any) -> Resolved:
    """A whole gateway config (already parsed from JSON/JSON5) -> fleet settings."""
    if document is None:
        document = {}
    root = _object("(config)", document)
    notes: list[str] = []
    global_block = _loop_detection_at("", root) or LoopDetectionBlock()
    agents: dict[str, LoopDetectionConfig] = {}
    agent_section = root.get("agents")
    if agent_section is not None:
        section = _object("agents", agent_section)
        listed = _listed_agents(section.get("list"))
        mapped = _mapped_agents(section.get("entries"))
        for agent_id in listed.keys() & mapped.keys():
            notes.append(
                f"agent {agent_id!r} is configured in both {mapped[agent_id][0]} and {listed[agent_id][0]}; "
                f"using {mapped[agent_id][0]}"
            )
        for agent_id, (path, block) in {**listed, **mapped}.items():
            agents[agent_id] = resolve(merge(global_block, block), f"{path}.tools.loopDetection", notes)
    default = resolve(global_block, "tools.loopDetection", notes)
    return Resolved(FleetConfig(default=default, agents=agents), notes)
