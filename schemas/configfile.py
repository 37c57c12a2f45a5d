"""Loading the config file (JSON or JSON5, a gateway's whole file is fine)."""

from __future__ import annotations

import os
from typing import TextIO

from schemas.config import FleetConfig
from schemas.configparse import ConfigError, Resolved, parse_config
from schemas.jsonfile import read_document
from schemas.policy import FleetPolicy
from schemas.policyfile import load_policy

CONFIG_ENV = "LOOPWARDEN_CONFIG"

ROLLING_OFF = (
    "the rolling detectors (repeats, polls without progress, ping-pong, argument churn) are off: "
    "the config does not set tools.loopDetection.enabled: true (off by default, as in the gateway)"
)
"""Why a trace can give far fewer warnings and blocks than a person expects."""


def load_for_cli(
    config_path: str | os.PathLike[str] | None, policy_path: str | os.PathLike[str] | None, err: TextIO
) -> tuple[FleetConfig, FleetPolicy | None]:
    """The config and the policy of a command a person runs. Once both are
    good (a bad one stops the command with its one error line), threshold
    corrections and, when no agent runs the rolling detectors, a note go to
    `err`."""
    resolved = load_config(config_path)
    policy = load_policy(policy_path)
    for note in resolved.notes:
        print(f"loopwarden: warning: {note}", file=err)
    if rolling_off(resolved.config):
        print(f"loopwarden: note: {ROLLING_OFF}", file=err)
    return resolved.config, policy


def rolling_off(config: FleetConfig) -> bool:
    """Whether no agent runs the rolling detectors (`ROLLING_OFF`)."""
    return not any(agent.rolling for agent in (config.default, *config.agents.values()))


def load_config(path: str | os.PathLike[str] | None) -> Resolved:
    """Parse and validate; no path (and no LOOPWARDEN_CONFIG) means the defaults."""
    if path is None:
        path = os.environ.get(CONFIG_ENV) or None
    if path is None:
        return parse_config({})
    return parse_config(read_document(path, "config", ConfigError))
