"""Regenerate the checked-in JSON Schemas: `python -m schemas.export`.

Gateway authors in other languages validate what they send against these;
a test fails when they drift from the Structs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from schemas.config import LoopDetectionBlock
from schemas.events import Event
from schemas.incidents import Incident
from schemas.policy import PolicyFile
from schemas.verdicts import Verdict

SCHEMA_DIR = Path(__file__).with_name("json")
SCHEMAS: dict[str, Any] = {
    "events.schema.json": Event,
    "verdict.schema.json": Verdict,
    "loop-detection-config.schema.json": LoopDetectionBlock,
    "policy.schema.json": PolicyFile,
    "incident.schema.json": Incident,
}


def render(name: str) -> str:
    schema = msgspec.json.schema(SCHEMAS[name])
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": name.split(".")[0], **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> None:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name in SCHEMAS:
        (SCHEMA_DIR / name).write_text(render(name), encoding="utf-8")
        print(SCHEMA_DIR / name)


if __name__ == "__main__":
    main()
