"""The OpenClaw plugin's TypeScript copy of the wire contract stays the one in
`schemas/`: its `Verdict` declares every field of the verdict JSON Schema and
no other, its decisions are the schema's, its default topics are
`schemas/topics.py`'s, and each event it publishes (`src/events.ts`) declares
every field of its JSON Schema, with the schema's types, and no other. The
plugin is written by hand; this is what keeps it from drifting when a field is
added on one side only."""

from __future__ import annotations

import json
import re
from pathlib import Path

from schemas.topics import DECISIONS_TOPIC, EVENTS_TOPIC

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "clients" / "openclaw" / "src"
SCHEMAS = ROOT / "schemas" / "json"


def interface(source: str, name: str) -> dict[str, bool]:
    """The fields of `export interface NAME { ... }`, each with whether it is optional."""
    body = re.search(rf"export interface {name} \{{(.*?)\n\}}", source, re.DOTALL)
    assert body, f"no interface {name}"
    return {
        m["field"]: bool(m["optional"]) for m in re.finditer(r"^\s+(?P<field>\w+)(?P<optional>\?)?:", body[1], re.M)
    }


def union(source: str, name: str) -> set[str]:
    """The string members of `export type NAME = "a" | "b" ...;`."""
    declared = re.search(rf"export type {name} = ([^;]+);", source)
    assert declared, f"no type {name}"
    return set(re.findall(r'"([^"]+)"', declared[1]))


def fields(source: str, name: str) -> dict[str, tuple[bool, str]]:
    """The fields of `export interface NAME [extends BASE] { ... }` and of its
    bases, each with whether it is optional and its TypeScript type."""
    found = re.search(rf"export interface {name}(?: extends (\w+))? \{{(.*?)\n\}}", source, re.DOTALL)
    assert found, f"no interface {name}"
    base = fields(source, found[1]) if found[1] else {}
    own = re.finditer(r"^\s+(?P<field>\w+)(?P<optional>\?)?: (?P<type>[^;]+);", found[2], re.M)
    return base | {m["field"]: (bool(m["optional"]), m["type"]) for m in own}


ANY = "any JSON"


def ts_types(declared: str) -> set[str]:
    """A TypeScript field type as the JSON values it admits."""
    out: set[str] = set()
    for member in (part.strip() for part in declared.split("|")):
        if member == "Json":
            out.add(ANY)
        elif member.startswith('"'):
            out.add(f"={member.strip(chr(34))}")
        else:
            out.add({"true": "boolean"}.get(member, member))
    return out


def schema_types(prop: dict) -> set[str]:
    """A JSON Schema property as the JSON values it admits, in `ts_types`'s terms."""
    if "anyOf" in prop:
        return set().union(*map(schema_types, prop["anyOf"]))
    if "enum" in prop:
        return {f"={value}" for value in prop["enum"]}
    if "type" in prop:
        return {"number" if prop["type"] == "integer" else prop["type"]}
    return {ANY}


EVENTS = {
    "ToolCallEvent": "ToolCall",
    "ToolResultEvent": "ToolResult",
    "CompactionEvent": "Compaction",
    "RunEndEvent": "RunEnd",
}
"""Each event interface of the plugin, and its definition in events.schema.json."""


def verdict_schema() -> dict:
    document = json.loads((SCHEMAS / "verdict.schema.json").read_text())
    return document["$defs"]["Verdict"]


def test_the_plugins_verdict_declares_every_field_of_the_schema() -> None:
    declared = interface((PLUGIN / "guard.ts").read_text(), "Verdict")
    schema = verdict_schema()
    assert set(declared) == set(schema["properties"])
    # A field the worker always sends may be required in TypeScript; one it may omit may not.
    assert [field for field in schema["required"] if declared[field]] == []


def test_the_plugins_decisions_are_the_schemas() -> None:
    schema = verdict_schema()
    assert union((PLUGIN / "guard.ts").read_text(), "Decision") == set(schema["properties"]["decision"]["enum"])


def test_the_plugins_default_topics_are_the_projects() -> None:
    config = (PLUGIN / "config.ts").read_text()
    defaults = dict(re.findall(r'topic\(config, "(\w+)", "LOOPWARDEN_\w+", "([^"]+)", env\)', config))
    assert defaults == {"eventsTopic": EVENTS_TOPIC, "decisionsTopic": DECISIONS_TOPIC}


def test_the_plugins_events_are_the_schemas_field_by_field() -> None:
    source = (PLUGIN / "events.ts").read_text()
    document = json.loads((SCHEMAS / "events.schema.json").read_text())
    members = re.search(r"export type Event = ([^;]+);", source)
    assert members and set(re.findall(r"\w+", members[1])) == set(EVENTS)
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in document["anyOf"]} == set(EVENTS.values())
    for name, definition in EVENTS.items():
        declared = fields(source, name)
        schema = document["$defs"][definition]
        assert set(declared) == set(schema["properties"]), name
        # The plugin sends whatever the schema requires.
        assert [field for field in schema["required"] if declared[field][0]] == [], name
        for field, (_, declared_type) in declared.items():
            assert ts_types(declared_type) == schema_types(schema["properties"][field]), f"{name}.{field}"


def test_calls_and_results_name_their_turn_and_reply_partition() -> None:
    """The two fields the worker routes and groups by: a call's turn is never
    null (spec §8.1), and both carry the decisions partition the plugin reads."""
    source = (PLUGIN / "events.ts").read_text()
    call, result = fields(source, "ToolCallEvent"), fields(source, "ToolResultEvent")
    assert call["turn"] == (False, "string")
    assert call["reply_partition"] == result["reply_partition"] == (True, "number")
