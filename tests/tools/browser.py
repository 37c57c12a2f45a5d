"""Headless Debian Chromium, driven over the DevTools protocol (a websocket,
through aiohttp): no driver download, the system browser only."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest


def chromium_path() -> str:
    """The system chromium, installed with apt when missing; skips (saying
    why) only when it cannot be installed here."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and apt-get needs root")
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "-y", "-qq"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    update = subprocess.run([*apt, "update"], capture_output=True, text=True, env=env, timeout=600)
    install = subprocess.run([*apt, "install", "chromium"], capture_output=True, text=True, env=env, timeout=900)
    found = shutil.which("chromium")
    if not found:
        pytest.skip(
            f"chromium could not be installed (apt mirror unreachable?): {(update.stderr + install.stderr)[-500:]}"
        )
    return found


class Browser:
    """One headless chromium with one page; `evaluate` runs JavaScript in it."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.profile = profile
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # root in a container
                "--disable-gpu",
                "--no-first-run",
                "--window-size=1400,1100",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._ids = 0
        self.ws: Any = None
        self.session: aiohttp.ClientSession | None = None

    async def open(self, timeout: float = 30.0) -> Browser:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not active.exists() or not active.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"chromium did not start (exit {self.proc.poll()})")
            await asyncio.sleep(0.1)
        port = int(active.read_text().split()[0])
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as response:
            pages = [t for t in await response.json() if t["type"] == "page"]
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=64 * 1024 * 1024)
        return self

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._ids += 1
        await self.ws.send_str(json.dumps({"id": self._ids, "method": method, "params": params}))
        while True:
            message = json.loads((await self.ws.receive()).data)
            if message.get("id") == self._ids:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """The value of `expression` once truthy; fails after `timeout` with the page's text."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.25)
        body = await self.evaluate("document.body.innerText")
        raise AssertionError(f"no {what} after {timeout}s; the page shows:\n{body}")

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
