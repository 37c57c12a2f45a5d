"""The dashboard's access token: read from a file with a clear error, then
required of every request (the page, its feed, a run's timeline); a browser
trades `/?token=` for a cookie once. Served by aiohttp's own test server; the
board's topics are never read by these requests."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from builders import run_cli
from schemas.config import FleetConfig
from streams.tools import access
from streams.tools.dashboard import Board, Source, create_app

TOKEN = "s3cret-token-0123456789"
SOURCE = Source("127.0.0.1:9", "d", "i", "e", "latest")


def with_client(token: str | None, check: Any) -> None:
    async def main() -> None:
        async with TestClient(TestServer(create_app(SOURCE, FleetConfig(), None, Board(), token))) as client:
            await check(client)

    asyncio.run(main())


def test_the_token_file_is_read_and_a_bad_one_is_named(tmp_path: Path) -> None:
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    assert access.read_token(str(good)) == TOKEN
    cases = {
        "missing": (None, "cannot read it"),
        "short": ("0123456789abcde\n", "has 15 characters; at least 16"),
        "spaced": ("0123456789 abcdefgh\n", "printable ASCII without spaces"),
        "accented": ("0123456789abcdéfgh\n", "printable ASCII without spaces"),
    }
    for name, (text, why) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(access.BadToken, match=f"--token-file {path}: .*{why}"):
            access.read_token(str(path))


def test_without_the_token_nothing_of_the_board_is_served() -> None:
    async def check(client: TestClient) -> None:
        for path in ("/", "/events", "/explain?run=r1"):
            answer = await client.get(path)
            assert answer.status == 401, path
            assert answer.headers["WWW-Authenticate"] == 'Bearer realm="loopwarden dashboard"'
            assert "open /?token=TOKEN once" in await answer.text()
        wrong = await client.get("/", headers={"Authorization": "Bearer " + TOKEN[:-1]})
        assert wrong.status == 401
        guessed = await client.get("/?token=" + TOKEN[:-1], allow_redirects=False)
        assert guessed.status == 401 and "not this dashboard's" in await guessed.text()
        assert not client.session.cookie_jar.filter_cookies(client.make_url("/"))

    with_client(TOKEN, check)


def test_a_browser_trades_the_token_in_the_address_for_a_cookie() -> None:
    async def check(client: TestClient) -> None:
        opened = await client.get("/?token=" + TOKEN, allow_redirects=False)
        assert opened.status == 303 and opened.headers["Location"] == "/"
        cookie = opened.cookies[access.COOKIE]
        assert cookie.value == TOKEN and cookie["httponly"] and cookie["samesite"] == "Strict"
        page = await client.get("/")  # the cookie jar sends it
        assert page.status == 200 and "<html" in (await page.text()).lower()
        feed = await client.get("/events")
        assert feed.status == 200 and feed.headers["Content-Type"] == "text/event-stream"
        assert (await feed.content.readline()).startswith(b"data: {")
        feed.close()

    with_client(TOKEN, check)


def test_other_clients_send_a_bearer_token() -> None:
    async def check(client: TestClient) -> None:
        answer = await client.get("/", headers={"Authorization": "Bearer " + TOKEN})
        assert answer.status == 200

    with_client(TOKEN, check)


def test_without_a_token_file_the_page_is_open() -> None:
    async def check(client: TestClient) -> None:
        assert (await client.get("/")).status == 200

    with_client(None, check)


def test_a_bad_token_file_stops_the_command_with_exit_2(tmp_path: Path) -> None:
    done = run_cli("--token-file", str(tmp_path / "absent"), "--bootstrap", "127.0.0.1:9", command="dashboard")
    assert done.returncode == 2
    assert f"loopwarden dashboard: --token-file {tmp_path / 'absent'}: cannot read it".encode() in done.stderr
    short = tmp_path / "short"
    short.write_text("abc")
    done = run_cli("--bootstrap", "127.0.0.1:9", command="dashboard", LOOPWARDEN_DASHBOARD_TOKEN_FILE=str(short))
    assert done.returncode == 2 and b"has 3 characters" in done.stderr, done.stderr  # from the environment


def test_listening_beyond_this_host_without_a_token_is_warned_of() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "dashboard", "--host", "0.0.0.0", "--port", str(port)]
        + ["--bootstrap", "127.0.0.1:9"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in dashboard.stderr:
            lines.append(line)
            if "event=unauthenticated" in line:
                break
    finally:
        dashboard.kill()
        dashboard.wait()
    assert "token=none" in "".join(lines)
    assert f"dashboard on 0.0.0.0 without a token: whoever reaches port {port} reads every run's timeline" in lines[-1]
    assert "level=warning" in lines[-1]
