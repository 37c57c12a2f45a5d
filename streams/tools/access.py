"""The dashboard's access token (`loopwarden dashboard --token-file`).

A run's timeline shows what its agent called, so a page reachable beyond
this host should ask who is there. The token is a shared secret read from a
file (never a flag: flags show in `ps`). A browser opens the page once as
``/?token=TOKEN``; the answer stores it in an HttpOnly, same-site cookie and
sends the browser on to ``/``, so the token leaves the address bar and the
history. Other clients send ``Authorization: Bearer TOKEN``. Anything else
gets 401 and nothing of the board.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

COOKIE = "loopwarden_dashboard"
MIN_LENGTH = 16
ENV = "LOOPWARDEN_DASHBOARD_TOKEN_FILE"


class BadToken(ValueError):
    """The token file cannot be used; the message names the file and why."""


def read_token(path: str) -> str:
    """The token in ``path``, without the line end; at least MIN_LENGTH printable ASCII characters."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadToken(f"--token-file {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise BadToken(f"--token-file {path}: the token must be printable ASCII without spaces")
    if len(token) < MIN_LENGTH:
        raise BadToken(f"--token-file {path}: the token has {len(token)} characters; at least {MIN_LENGTH} are needed")
    return token


def _same(offered: str | None, token: bytes) -> bool:
    return offered is not None and hmac.compare_digest(offered.encode("utf-8", "replace"), token)


def _bearer(header: str | None) -> str | None:
    scheme, _, credentials = (header or "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def middleware(token: str) -> Callable[..., Awaitable[Any]]:
    """An aiohttp middleware that lets through only requests carrying ``token``."""
    from aiohttp import web

    expected = token.encode()

    @web.middleware
    async def require_token(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        offered = request.query.get("token")
        if offered is not None and request.path == "/":
            if not _same(offered, expected):
                return _refused("the token in the address is not this dashboard's")
            response = web.Response(status=303, headers={"Location": "/", "Cache-Control": "no-store"})
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
            return response
        if _same(request.cookies.get(COOKIE), expected) or _same(
            _bearer(request.headers.get("Authorization")), expected
        ):
            return await handler(request)
        return _refused("open /?token=TOKEN once (the token in --token-file), or send Authorization: Bearer TOKEN")

    return require_token


def _refused(why: str) -> Any:
    from aiohttp import web

    return web.Response(
        status=401,
        text=f"401 loopwarden dashboard: {why}\n",
        headers={"WWW-Authenticate": 'Bearer realm="loopwarden dashboard"', "Cache-Control": "no-store"},
    )
