"""The OpenClaw plugin's TypeScript copy of the wire contract stays the one in
`schemas/`: its `Verdict` declares every field of the verdict JSON Schema and
no other, its decisions are the schema's, and its default topics are
`schemas/topics.py`'s. The plugin is written by hand; this is what keeps it
from drifting when a field is added on one side only."""

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
