"""Loading the config file (JSON or JSON5, a gateway's whole file is fine)."""

from __future__ import annotations

import os
from typing import TextIO

from schemas.config import FleetConfig
from schemas.jsonfile import read_document

from streams.engine.config import ConfigError, Resolved, parse_config

CONFIG_ENV = "LOOPWARDEN_CONFIG"


def load_config_for_cli(path: str | os.PathLike[str] | None, err: TextIO) -> FleetConfig:
    """`load_config` for the offline commands: threshold corrections go to stderr."""
    resolved = load_config(path)
    for note in resolved.notes:
        print(f"loopwarden: warning: {note}", file=err)
    return resolved.config


def load_config(path: str | os.PathLike[str] | None) -> Resolved:
    """Parse and validate; no path (and no LOOPWARDEN_CONFIG) means the defaults."""
    if path is None:
        path = os.environ.get(CONFIG_ENV) or None
    if path is None:
        return parse_config({})
    return parse_config(read_document(path, "config", ConfigError))
