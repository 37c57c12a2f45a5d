"""Spec §2: configuration shape, field-by-field merging, ordering, validation."""

from __future__ import annotations

import json
import math

import pytest

from builders import run_cli
from schemas.config import LoopDetectionConfig
from schemas.configfile import load_config
from schemas.configparse import ConfigError, parse_config


def loop(**block):
    return {"tools": {"loopDetection": block}}


def with_agents(global_block, *entries):
    doc = loop(**global_block) if global_block is not None else {}
    doc["agents"] = {"list": list(entries)}
    return doc


def agent(agent_id, **block):
    return {"id": agent_id, "tools": {"loopDetection": block}}


# --- defaults and reading ------------------------------------------------------------------


@pytest.mark.parametrize("document", [None, {}, {"tools": {}}, loop()])
def test_defaults(document):
    resolved = parse_config(document)
    cfg = resolved.config.default
    assert (cfg.enabled, cfg.history_size, cfg.warning_threshold, cfg.critical_threshold) == (None, 30, 10, 20)
    assert (cfg.unknown_tool_threshold, cfg.global_circuit_breaker_threshold, cfg.window_size) == (10, 30, 3)
    assert (cfg.generic_repeat, cfg.known_poll_no_progress, cfg.ping_pong) == (True, True, True)
    assert cfg.rolling is False and cfg.guard is True
    assert resolved.notes == []


def test_every_global_field_is_read():
    cfg = parse_config(
        loop(
            enabled=True,
            historySize=12,
            warningThreshold=4,
            criticalThreshold=6,
            unknownToolThreshold=2,
            globalCircuitBreakerThreshold=9,
            detectors={"genericRepeat": False, "knownPollNoProgress": False, "pingPong": False},
            postCompactionGuard={"windowSize": 5},
        )
    ).config.default
    assert cfg == LoopDetectionConfig(
        enabled=True,
        history_size=12,
        warning_threshold=4,
        critical_threshold=6,
        unknown_tool_threshold=2,
        global_circuit_breaker_threshold=9,
        generic_repeat=False,
        known_poll_no_progress=False,
        ping_pong=False,
        window_size=5,
    )


def test_enabled_false_is_kept_explicit():
    cfg = parse_config(loop(enabled=False)).config.default
    assert cfg.enabled is False and cfg.rolling is False and cfg.guard is False
    cfg = parse_config(loop(enabled=True)).config.default
    assert cfg.rolling is True and cfg.guard is True


# --- merging ------------------------------------------------------------------------------------


def test_agent_merged_field_by_field_over_global():
    doc = with_agents(
        {
            "enabled": True,
            "historySize": 40,
            "warningThreshold": 5,
            "criticalThreshold": 9,
            "detectors": {"genericRepeat": False, "pingPong": False},
            "postCompactionGuard": {"windowSize": 4},
        },
        agent("safe", warningThreshold=3, detectors={"pingPong": True}),
        agent("guarded", postCompactionGuard={"windowSize": 2}, enabled=False),
    )
    fleet = parse_config(doc).config
    safe = fleet.for_agent("safe")
    assert (safe.enabled, safe.history_size, safe.warning_threshold, safe.critical_threshold) == (True, 40, 3, 9)
    assert (safe.generic_repeat, safe.known_poll_no_progress, safe.ping_pong) == (False, True, True)
    assert safe.window_size == 4
    guarded = fleet.for_agent("guarded")
    assert guarded.enabled is False and guarded.window_size == 2 and guarded.warning_threshold == 5
    assert guarded.generic_repeat is False and guarded.ping_pong is False
    assert fleet.for_agent("someone-else") == fleet.default
    assert fleet.for_agent(None) == fleet.default
    assert fleet.default.ping_pong is False and fleet.default.warning_threshold == 5


def test_agent_nested_blocks_merge_without_global_blocks():
    fleet = parse_config(with_agents(None, agent("a", detectors={"pingPong": False}))).config
    a = fleet.for_agent("a")
    assert (a.generic_repeat, a.known_poll_no_progress, a.ping_pong, a.window_size) == (True, True, False, 3)


def test_agent_without_loop_detection_uses_global():
    doc = with_agents({"warningThreshold": 4}, {"id": "plain", "model": "x"})
    fleet = parse_config(doc).config
    assert fleet.for_agent("plain").warning_threshold == 4


# --- ordering ------------------------------------------------------------------------------------


def test_critical_not_above_warning_becomes_warning_plus_one():
    resolved = parse_config(loop(warningThreshold=10, criticalThreshold=10))
    assert resolved.config.default.critical_threshold == 11
    assert resolved.config.default.global_circuit_breaker_threshold == 30
    assert len(resolved.notes) == 1 and "tools.loopDetection.criticalThreshold" in resolved.notes[0]


def test_breaker_not_above_critical_becomes_critical_plus_one():
    resolved = parse_config(loop(criticalThreshold=25, globalCircuitBreakerThreshold=25))
    assert resolved.config.default.global_circuit_breaker_threshold == 26
    assert len(resolved.notes) == 1
    assert "tools.loopDetection.globalCircuitBreakerThreshold" in resolved.notes[0]


def test_ordering_chain_uses_corrected_critical():
    resolved = parse_config(loop(warningThreshold=10, criticalThreshold=5, globalCircuitBreakerThreshold=8))
    cfg = resolved.config.default
    assert (cfg.warning_threshold, cfg.critical_threshold, cfg.global_circuit_breaker_threshold) == (10, 11, 12)
    assert any("criticalThreshold" in n for n in resolved.notes)
    assert any("globalCircuitBreakerThreshold" in n for n in resolved.notes)


def test_warning_above_default_critical_pushes_both():
    cfg = parse_config(loop(warningThreshold=40)).config.default
    assert (cfg.critical_threshold, cfg.global_circuit_breaker_threshold) == (41, 42)


def test_ordering_applies_to_merged_agent_block():
    doc = with_agents({"warningThreshold": 8, "criticalThreshold": 16}, {"id": "x"}, agent("a", warningThreshold=20))
    resolved = parse_config(doc)
    a = resolved.config.for_agent("a")
    assert (a.warning_threshold, a.critical_threshold, a.global_circuit_breaker_threshold) == (20, 21, 30)
    assert any(n.startswith("agents.list[1].tools.loopDetection.criticalThreshold") for n in resolved.notes)
    assert resolved.config.default.critical_threshold == 16


def test_valid_order_gives_no_notes():
    assert parse_config(loop(warningThreshold=1, criticalThreshold=2, globalCircuitBreakerThreshold=3)).notes == []


# --- validation ------------------------------------------------------------------------------------


def refused(document) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(document)
    return str(info.value)


def test_spec_example_message_exactly():
    assert refused(loop(warningThreshold="ten")) == (
        'tools.loopDetection.warningThreshold: expected a positive integer, got "ten"'
    )


@pytest.mark.parametrize(
    "field",
    ["historySize", "warningThreshold", "criticalThreshold", "unknownToolThreshold", "globalCircuitBreakerThreshold"],
)
@pytest.mark.parametrize("value", [0, -1, 2.5, "10", True, [3], {"n": 1}])
def test_thresholds_must_be_positive_integers(field, value):
    assert refused(loop(**{field: value})).startswith(f"tools.loopDetection.{field}: expected a positive integer")


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_refused_with_path(value):
    # JSON5 (and Python's json) read Infinity and NaN: they must be refused like any bad number
    assert refused(loop(warningThreshold=value)).startswith("tools.loopDetection.warningThreshold: ")


def test_window_size_must_be_positive_integer():
    assert refused(loop(postCompactionGuard={"windowSize": 0})).startswith(
        "tools.loopDetection.postCompactionGuard.windowSize: expected a positive integer, got 0"
    )


@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_flags_must_be_booleans(value):
    assert refused(loop(enabled=value)).startswith("tools.loopDetection.enabled: ")
    assert refused(loop(detectors={"pingPong": value})).startswith("tools.loopDetection.detectors.pingPong: ")


@pytest.mark.parametrize(
    ("block", "path"),
    [
        ({"warningTreshold": 3}, "tools.loopDetection.warningTreshold"),
        ({"detectors": {"genericRepeats": True}}, "tools.loopDetection.detectors.genericRepeats"),
        ({"postCompactionGuard": {"window": 2}}, "tools.loopDetection.postCompactionGuard.window"),
    ],
)
def test_unknown_keys_refused_with_path(block, path):
    message = refused(loop(**block))
    assert message.startswith(path + ": ")
    assert "unknown" in message


@pytest.mark.parametrize(
    ("block", "path"),
    [
        ({"detectors": True}, "tools.loopDetection.detectors"),
        ({"postCompactionGuard": 3}, "tools.loopDetection.postCompactionGuard"),
    ],
)
def test_sub_blocks_must_be_objects(block, path):
    assert refused(loop(**block)).startswith(path + ": ")


def test_agent_paths_name_the_list_index():
    doc = with_agents({}, {"id": "a"}, agent("b", warningThreshold="ten"))
    assert refused(doc) == 'agents.list[1].tools.loopDetection.warningThreshold: expected a positive integer, got "ten"'
    doc = with_agents({}, agent("a"), agent("b"), agent("c", detectors={"pingPong": "no"}))
    assert refused(doc).startswith("agents.list[2].tools.loopDetection.detectors.pingPong: ")
    doc = with_agents({}, agent("a", bogus=1))
    assert refused(doc).startswith("agents.list[0].tools.loopDetection.bogus: ")


def test_global_error_reported_even_with_agents():
    doc = with_agents({"historySize": 0}, agent("a"))
    assert refused(doc).startswith("tools.loopDetection.historySize: ")


def test_unrelated_keys_are_ignored():
    document = {
        "gateway": {"port": 18789, "auth": {"token": "x"}},
        "models": {"default": "m"},
        "tools": {"exec": {"host": "sandbox"}, "allow": ["read"], "loopDetection": {"enabled": True}},
        "agents": {
            "defaults": {"model": "m", "workspace": "~/w"},
            "list": [
                {"id": "main", "default": True, "workspace": "~/a", "tools": {"profile": "coding"}},
                {"id": "safe", "name": "Safe", "tools": {"deny": ["exec"], "loopDetection": {"warningThreshold": 4}}},
            ],
        },
        "channels": {"x": {}},
    }
    resolved = parse_config(document)
    assert resolved.config.default.enabled is True
    assert resolved.config.for_agent("safe").warning_threshold == 4
    assert resolved.config.for_agent("safe").enabled is True
    assert resolved.config.for_agent("main") == resolved.config.default


def test_load_config_reads_json5(tmp_path):
    path = tmp_path / "gateway.json5"
    path.write_text(
        "// gateway config\n{\n  tools: { loopDetection: { enabled: true, warningThreshold: 4, },},\n"
        "  agents: { list: [ { id: 'a', tools: { loopDetection: { criticalThreshold: 4 } } } ] },\n}\n"
    )
    resolved = load_config(path)
    assert resolved.config.default.warning_threshold == 4
    assert resolved.config.for_agent("a").critical_threshold == 5
    assert any("agents.list[0].tools.loopDetection.criticalThreshold" in n for n in resolved.notes)


def test_load_config_refuses_bad_file_with_path(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"tools": {"loopDetection": {"warningThreshold": "ten"}}}')
    with pytest.raises(
        ConfigError, match=r'^tools\.loopDetection\.warningThreshold: expected a positive integer, got "ten"$'
    ):
        load_config(path)


# --- the current gateway shape: agents.entries.<agentId> ------------------------------------

CURRENT_GATEWAY = {
    "gateway": {"port": 18789, "mode": "local"},
    "models": {"providers": {"p": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "models": []}}},
    "agents": {
        "defaults": {"model": {"primary": "p/m"}, "workspace": "~/w", "compaction": {"keepRecentTokens": 100}},
        "entries": {
            "builder": {
                "model": {"primary": "p/m"},
                "tools": {"profile": "coding", "loopDetection": {"enabled": True}},
            },
            "main": {"workspace": "~/main"},
        },
    },
    "tools": {"loopDetection": {"enabled": False}},
    "plugins": {"entries": {"loopwarden": {"enabled": True, "config": {"bootstrap": "kafka:9092"}}}},
}


def test_current_gateway_file_with_agents_entries():
    resolved = parse_config(CURRENT_GATEWAY)
    assert resolved.notes == []
    assert resolved.config.default.enabled is False
    builder = resolved.config.for_agent("builder")
    assert builder.enabled is True
    assert builder == LoopDetectionConfig(enabled=True)  # current gateways fix the thresholds at the defaults
    assert resolved.config.for_agent("main") == resolved.config.default


def test_entries_merge_field_by_field_like_list_entries():
    doc = loop(warningThreshold=4, detectors={"pingPong": False})
    doc["agents"] = {
        "entries": {"a": {"tools": {"loopDetection": {"criticalThreshold": 9, "detectors": {"genericRepeat": False}}}}}
    }
    a = parse_config(doc).config.for_agent("a")
    assert (a.warning_threshold, a.critical_threshold, a.ping_pong, a.generic_repeat) == (4, 9, False, False)


def test_an_agent_in_both_shapes_takes_the_entries_block_and_is_named():
    doc = loop()
    doc["agents"] = {
        "list": [agent("x", warningThreshold=5), agent("only-listed", warningThreshold=6)],
        "entries": {"x": {"tools": {"loopDetection": {"warningThreshold": 7}}}},
    }
    resolved = parse_config(doc)
    assert resolved.config.for_agent("x").warning_threshold == 7
    assert resolved.config.for_agent("only-listed").warning_threshold == 6
    assert resolved.notes == [
        "agent 'x' is configured in both agents.entries.x and agents.list[0]; using agents.entries.x"
    ]


def test_entries_errors_name_the_agent_path():
    doc = {"agents": {"entries": {"b": {"tools": {"loopDetection": {"warningThreshold": "ten"}}}}}}
    assert (
        refused(doc) == 'agents.entries.b.tools.loopDetection.warningThreshold: expected a positive integer, got "ten"'
    )
    assert refused({"agents": {"entries": ["b"]}}) == 'agents.entries: expected an object, got ["b"]'
    assert refused({"agents": {"entries": {"b": 3}}}) == "agents.entries.b: expected an object, got 3"
    doc = {"agents": {"entries": {"b": {"tools": {"loopDetection": {"criticalThreshold": 3, "warningThreshold": 3}}}}}}
    assert (
        parse_config(doc).notes[0].startswith("agents.entries.b.tools.loopDetection.criticalThreshold: 3 is not above")
    )


def test_replay_reads_a_current_gateway_file_and_warns_about_an_agent_in_both_shapes(tmp_path):
    document = json.loads(json.dumps(CURRENT_GATEWAY))
    document["agents"]["list"] = [{"id": "builder", "tools": {"loopDetection": {"enabled": False}}}]
    config_file = tmp_path / "openclaw.json"
    config_file.write_text(json.dumps(document))
    events = [
        {
            "type": "tool_call",
            "run_id": "r",
            "seq": i,
            "tool_call_id": f"c{i}",
            "tool_name": "read",
            "args": {"p": 1},
            "agent_id": "builder",
        }
        for i in range(11)
    ]
    proc = run_cli("--config", str(config_file), "-", stdin="".join(json.dumps(e) + "\n" for e in events).encode())
    assert proc.returncode == 0, proc.stderr
    warning, summary = proc.stderr.decode().splitlines()
    assert warning == (
        "loopwarden: warning: agent 'builder' is configured in both agents.entries.builder and agents.list[0]; "
        "using agents.entries.builder"
    )
    assert summary.startswith("replay: 11 events, 11 verdicts (10 allow, 1 warn), 0 dead letters, ")
    decisions = [json.loads(line)["decision"] for line in proc.stdout.splitlines()]
    assert decisions[10] == "warn"  # the entries block (enabled) applies, not the list's
