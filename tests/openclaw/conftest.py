"""The real OpenClaw gateway's installation, shared by the tests of this folder."""

from __future__ import annotations

import os
import subprocess
import urllib.request

import pytest

from openclaw_gateway import OpenClaw, install


def _registry_reachable() -> bool:
    registry = os.environ.get("NPM_CONFIG_REGISTRY", "https://registry.npmjs.org/").rstrip("/")
    try:
        with urllib.request.urlopen(f"{registry}/-/ping", timeout=10):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def openclaw() -> OpenClaw:
    """Node 24, the pinned openclaw package and the built plugin, installed on first use."""
    try:
        return install()
    except subprocess.CalledProcessError as exc:
        if not _registry_reachable():
            pytest.skip(
                f"the npm registry is unreachable, so Node 24, openclaw and the plugin's dependencies cannot be installed: {exc.stderr[-300:]}"
            )
        raise AssertionError(f"{exc.cmd} failed:\n{exc.stderr[-3000:]}") from None
