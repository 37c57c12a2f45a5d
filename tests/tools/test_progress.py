"""The progress bar of a batch command: shown on a terminal (a pseudo-terminal
here), wiped when the run ends, and followed by the summary line."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

from builders import cli_environ

#: A tqdm bar without a total: bytes read so far, then [elapsed, rate].
BAR = re.compile(rb"\d+(\.\d+)?[kMG]?B \[\d\d:\d\d, ")
#: Lines written, at most, while waiting for the bar (which shows after a second of the run).
MAX_LINES = 2000


def event(seq: int) -> bytes:
    call = {"type": "tool_call", "run_id": "bar", "seq": seq, "tool_call_id": f"c{seq}", "tool_name": "read"}
    return json.dumps({**call, "args": {"path": f"/f{seq}"}}).encode() + b"\n"


def read_available(fd: int, wait: float) -> bytes:
    """What the terminal got within `wait` seconds; b"" at its end."""
    if not select.select([fd], [], [], wait)[0]:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError as exc:  # EIO: every writer of the terminal has closed it
        assert exc.errno == errno.EIO
        return b""


def test_replay_shows_a_bar_on_a_terminal_and_ends_with_its_summary() -> None:
    terminal, stderr = pty.openpty()
    # 24 rows of 80 columns, as a terminal window has (tqdm draws nothing on a terminal 0 columns wide)
    fcntl.ioctl(stderr, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    replay = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "replay", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=cli_environ(),
    )
    os.close(stderr)
    assert replay.stdin is not None
    shown = b""
    sent = 0
    while not BAR.search(shown) and sent < MAX_LINES:  # lines keep coming until the bar is drawn
        replay.stdin.write(event(sent))
        replay.stdin.flush()
        sent += 1
        shown += read_available(terminal, 0.05)
    assert BAR.search(shown), shown
    replay.stdin.close()
    while chunk := read_available(terminal, 60):
        shown += chunk
    assert replay.wait(60) == 0
    os.close(terminal)
    last = shown.replace(b"\r\n", b"\n").rstrip(b"\n").rsplit(b"\n", 1)[-1]
    summary = last.rsplit(b"\r", 1)[-1].decode()  # after the bar, wiped with a carriage return
    assert summary.startswith(f"replay: {sent:,} events, {sent:,} verdicts ("), shown[-500:]
