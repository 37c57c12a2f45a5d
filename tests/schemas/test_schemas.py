"""The checked-in JSON Schemas are the contract for gateways in other languages."""

from __future__ import annotations

import json

import pytest

from schemas.export import SCHEMA_DIR, SCHEMAS, render


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_checked_in_schema_matches_the_structs(name: str) -> None:
    checked_in = (SCHEMA_DIR / name).read_text(encoding="utf-8")
    assert checked_in == render(name), f"{name} drifted: run `python -m schemas.export`"


def test_event_schema_names_the_four_types() -> None:
    schema = json.loads((SCHEMA_DIR / "events.schema.json").read_text(encoding="utf-8"))
    tags = {d["properties"]["type"]["enum"][0] for d in schema["$defs"].values()}
    assert tags == {"tool_call", "tool_result", "compaction", "run_end"}
    assert set(schema["$defs"]["ToolCall"]["required"]) == {"type", "run_id", "seq", "tool_call_id", "tool_name"}
