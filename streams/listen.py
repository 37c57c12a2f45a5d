"""Ports this project listens on: checked when the arguments are parsed, and
a bind that fails said in one line (`cannot listen on HOST:PORT: reason`)
rather than as the web server's traceback."""

from __future__ import annotations

import argparse
import errno
import os
import socket

#: Where the worker's and the fleet stage's web servers listen unless --web-host says otherwise.
WEB_HOST = "127.0.0.1"


class CannotListen(RuntimeError):
    """A port this process was asked to listen on is taken or not this host's."""


def port(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text!r}")
    return value


def reason(exc: OSError) -> str:
    """The system's words for a socket error, without the address it repeats."""
    if exc.errno and exc.errno > 0 and exc.errno in errno.errorcode:
        return os.strerror(exc.errno).lower()
    return (exc.strerror or str(exc)).lower()


def cannot_listen(host: str, number: int, exc: OSError) -> CannotListen:
    return CannotListen(f"cannot listen on {host}:{number}: {reason(exc)}")


def check_free(host: str, number: int) -> None:
    """Bind `host:number` as the web servers do (SO_REUSEADDR) and let it go;
    CannotListen when the port is taken or the address is not this host's."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, number, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise cannot_listen(host, number, exc) from None
