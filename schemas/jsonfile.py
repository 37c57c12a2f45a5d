"""Reading a settings file written as JSON or JSON5."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_document(path: str | os.PathLike[str], what: str, error: type[ValueError]) -> Any:
    """The decoded file; `error` (naming the path) when it cannot be read or parsed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read {what}: {exc}") from None
    try:
        return json.loads(text)
    except ValueError:
        import json5  # only JSON5 files pay for the slower parser

        try:
            return json5.loads(text)
        except ValueError as exc:
            raise error(f"{path}: not valid JSON or JSON5: {exc}") from None
