"""A real OpenClaw gateway for tests and benchmarks: Node 24, the pinned `openclaw`
package and the built plugin (infra/node, clients/openclaw/build.sh), and a
HOME whose openclaw.json loads the plugin and talks to a scripted model."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripted_model import provider_config

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "clients" / "openclaw"
PACK = PLUGIN / "pack"  # the plugin as a gateway loads it (build.sh stages it)
NODE_INFRA = REPO / "infra" / "node"
AGENT_TIMEOUT = 300


@dataclass(frozen=True)
class OpenClaw:
    node: str
    cli: Path

    @property
    def package(self) -> Path:
        return self.cli.parent

    def run_agent(self, home: Path, message: str) -> subprocess.CompletedProcess[str]:
        """`openclaw agent --local` for the `main` agent with this HOME; JSON on stdout."""
        env = {
            **os.environ,
            "HOME": str(home),
            "PATH": f"{Path(self.node).parent}:{os.environ['PATH']}",
            "NO_COLOR": "1",
        }
        env.pop("LOOPWARDEN_CONFIG", None)
        return subprocess.run(
            [self.node, str(self.cli), "agent", "--local", "--agent", "main", "--message", message, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=AGENT_TIMEOUT,
            cwd=home,
        )


def install() -> OpenClaw:
    """Node 24, openclaw and the built plugin; raises CalledProcessError with the failing step's stderr."""
    node = subprocess.run(
        [str(NODE_INFRA / "ensure-node.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    home = subprocess.run(
        [str(NODE_INFRA / "ensure-openclaw.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run([str(PLUGIN / "build.sh")], capture_output=True, text=True, check=True)
    return OpenClaw(node, Path(home) / "node_modules" / "openclaw" / "openclaw.mjs")


def gateway_home(directory: Path, model_url: str, plugin_config: dict[str, Any] | None, **extra: Any) -> Path:
    """A HOME holding .openclaw/openclaw.json: the scripted provider at `model_url`, OpenClaw's
    own loop detection off (loopwarden decides), the plugin loaded from clients/openclaw/pack.
    With `plugin_config` None, no plugin and OpenClaw's own loop detection on instead.
    `extra` adds top-level sections; `agent_defaults` is merged into agents.defaults."""
    home = directory / "home"
    (home / ".openclaw").mkdir(parents=True)
    defaults = {
        "model": {"primary": "scripted/scripted"},
        "workspace": str(directory / "workspace"),
        **extra.pop("agent_defaults", {}),
    }
    config = {
        "models": {"providers": {"scripted": provider_config(model_url)}},
        "agents": {"defaults": defaults},
        "tools": {"loopDetection": {"enabled": plugin_config is None}},
        **extra,
    }
    if plugin_config is not None:
        config["plugins"] = {
            "load": {"paths": [str(PACK)]},
            "allow": ["loopwarden"],
            "entries": {"loopwarden": {"enabled": True, "config": plugin_config}},
        }
    (home / ".openclaw" / "openclaw.json").write_text(json.dumps(config, indent=2))
    return home
