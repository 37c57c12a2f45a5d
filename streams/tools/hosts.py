"""The dashboard's Host check: against DNS rebinding.

A page on any site can point a name of its own at this host's address and
then read the dashboard as same-origin; its requests name that site in
``Host``. So a request is answered only when its Host is a name the
dashboard was bound for (``--host``, the loopback names on a loopback or
wildcard bind, each ``--allow-host``), or an address literal equal to the
address the connection reached (a browser that typed the address itself).
Anything else gets 421 and nothing of the board.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the dashboard on this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def allowed_names(host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names (not addresses) a request may carry in Host, lower case."""
    names = {name.lower().rstrip(".") for name in extra}
    if is_loopback(host) or host in WILDCARDS:
        names |= LOOPBACK_NAMES
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host not in WILDCARDS:
            names.add(host.lower().rstrip("."))
    return frozenset(names)


def _host_part(header: str) -> str:
    """`header` without its port, brackets of an IPv6 literal removed, lower case."""
    if header.startswith("["):
        return header[1 : header.find("]")].lower() if "]" in header else ""
    name, _, _ = header.partition(":") if header.count(":") == 1 else (header, "", "")
    return name.lower().rstrip(".")


def accepted(header: str | None, local_address: str | None, names: frozenset[str]) -> bool:
    """Whether a request with this Host, reaching `local_address`, is answered."""
    if not header:
        return False
    host = _host_part(header)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return host in names
    if local_address is None:
        return False
    reached = _address(local_address)
    return reached.is_loopback if literal.is_loopback else _address(host) == reached


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address, an IPv4 one reached through a dual-stack socket as itself."""
    address = ipaddress.ip_address(text.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def middleware(names: frozenset[str]) -> Callable[..., Awaitable[Any]]:
    """An aiohttp middleware answering only requests whose Host `accepted` takes."""
    from aiohttp import web

    @web.middleware
    async def check_host(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        if accepted(request.headers.get("Host"), sockname[0] if sockname else None, names):
            return await handler(request)
        return web.Response(
            status=421,
            text="421 loopwarden dashboard: this Host is not one the dashboard serves (see --allow-host)\n",
            headers={"Cache-Control": "no-store"},
        )

    return check_host
