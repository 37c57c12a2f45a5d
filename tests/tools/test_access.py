"""The dashboard's access token: read from a file with a clear error, then
required of every request (the page, its feed, a run's timeline); a browser
trades `/?token=` for a cookie once. Served by aiohttp's own test server; the
board's topics are never read by these requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from builders import run_cli
from schemas.config import FleetConfig
from streams.tools import access, hosts
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


def test_listening_beyond_this_host_without_a_token_does_not_start() -> None:
    done = run_cli("--host", "0.0.0.0", "--port", "9", "--bootstrap", "127.0.0.1:9", command="dashboard")
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "loopwarden dashboard: --host 0.0.0.0 is reachable beyond this machine and every run's timeline would be"
        " open to it: pass --token-file, or listen on 127.0.0.1"
    ]


def test_a_host_header_naming_another_site_is_refused() -> None:
    """DNS rebinding: a page of evil.example that points its name at this host
    sends Host: evil.example; the names the dashboard serves and the address reached pass."""

    async def check(client: TestClient) -> None:
        port = client.port
        for host in ("evil.example", f"evil.example:{port}", "10.1.2.3", f"localhost.evil.example:{port}", ""):
            answer = await client.get("/events", headers={"Host": host})
            assert answer.status == 421, host
            assert "not one the dashboard serves" in await answer.text()
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "dash.internal"):
            assert (await client.get("/", headers={"Host": host})).status == 200, host

    async def main() -> None:
        names = hosts.allowed_names("127.0.0.1", ["dash.internal"])
        app = create_app(SOURCE, FleetConfig(), None, Board(), None, names)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            await check(client)

    asyncio.run(main())


def test_the_names_a_bind_accepts() -> None:
    assert hosts.allowed_names("0.0.0.0", ["Dash.Example."]) == {"localhost", "dash.example"}
    assert hosts.allowed_names("dash.example") == {"dash.example"}
    assert hosts.allowed_names("10.0.0.5") == set()
    assert hosts.accepted("10.0.0.5:8080", "10.0.0.5", frozenset())
    assert hosts.accepted("10.0.0.5", "::ffff:10.0.0.5", frozenset())  # a dual-stack socket
    assert not hosts.accepted("10.0.0.6", "10.0.0.5", frozenset())
    assert not hosts.accepted("127.0.0.1", "10.0.0.5", frozenset())  # loopback names only reach loopback
    assert not hosts.accepted(None, "127.0.0.1", frozenset({"localhost"}))
