"""Event builders and small helpers shared by the unit tests.

Events are built as JSON objects and decoded with the real wire decoder, so
every test exercises the same path a gateway's bytes take.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from msgspec import UNSET

from schemas.config import FleetConfig
from schemas.policy import FleetPolicy, parse_policy
from schemas.state import RunState, StoredRun
from schemas.codec import decode_event, decode_stored, encode_stored, encode_verdict
from schemas.verdicts import Verdict
from streams.engine import apply
from schemas.configparse import parse_config

_MISSING = object()


def cli_environ(**env: str) -> dict[str, str]:
    """This process's environment without LOOPWARDEN_CONFIG and LOOPWARDEN_POLICY
    (a command under test reads only the files it is given), with `env` added."""
    return {k: v for k, v in os.environ.items() if k not in ("LOOPWARDEN_CONFIG", "LOOPWARDEN_POLICY")} | env


def run_cli(
    *args: str, stdin: bytes | None = None, cwd: Path | None = None, command: str = "replay", **env: str
) -> subprocess.CompletedProcess:
    """`loopwarden COMMAND ARGS` in a fresh process, in `cli_environ(**env)`."""
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", command, *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env=cli_environ(**env),
        cwd=cwd,
        timeout=60,
    )


# --- independent hashing (only for values made of strings, ints, bools, null) ---


def sjson(value: Any) -> str:
    """Stable JSON for plain values, computed without the code under test."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha(value: Any) -> str:
    return hashlib.sha256(sjson(value).encode("utf-8")).hexdigest()


def sha_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_args_hash(tool: str, args: Any) -> str:
    return f"{tool}:{sha(args)}"


def expected_error_hash(message: str) -> str:
    return "error:" + sha(message)


# --- events ---


def _event(kind: str, run: str, seq: int, **fields: Any) -> Any:
    obj: dict[str, Any] = {"type": kind, "run_id": run, "seq": seq}
    for key, value in fields.items():
        if value is not _MISSING and value is not UNSET:
            obj[key] = value
    return decode_event(json.dumps(obj).encode())


def call(
    run: str,
    seq: int,
    tool: str,
    args: Any = _MISSING,
    *,
    call_id: str | None = None,
    agent: Any = _MISSING,
    args_hash: Any = _MISSING,
    turn: Any = _MISSING,
) -> Any:
    return _event(
        "tool_call",
        run,
        seq,
        tool_call_id=call_id or f"c{seq}",
        tool_name=tool,
        args=args,
        agent_id=agent,
        args_hash=args_hash,
        turn=turn,
    )


def result(
    run: str,
    seq: int,
    tool: str,
    call_id: str,
    *,
    result: Any = _MISSING,
    error: Any = _MISSING,
    args: Any = _MISSING,
    args_hash: Any = _MISSING,
    result_hash: Any = _MISSING,
    unknown_tool_name: Any = _MISSING,
    outcome_kind: Any = _MISSING,
    failure_identity: Any = _MISSING,
    no_progress: Any = _MISSING,
) -> Any:
    return _event(
        "tool_result",
        run,
        seq,
        tool_call_id=call_id,
        tool_name=tool,
        result=result,
        error=error,
        args=args,
        args_hash=args_hash,
        result_hash=result_hash,
        unknown_tool_name=unknown_tool_name,
        outcome_kind=outcome_kind,
        failure_identity=failure_identity,
        no_progress=no_progress,
    )


def compaction(run: str, seq: int, *, agent: Any = _MISSING) -> Any:
    return _event("compaction", run, seq, agent_id=agent)


def run_end(run: str, seq: int) -> Any:
    return _event("run_end", run, seq)


def text_result(text: str, details: Any = _MISSING) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if details is not _MISSING:
        out["details"] = details
    return out


# --- config ---


def fleet(agents: dict[str, dict[str, Any]] | None = None, **loop: Any) -> FleetConfig:
    document: dict[str, Any] = {"tools": {"loopDetection": loop}}
    if agents:
        document["agents"] = {
            "list": [{"id": name, "tools": {"loopDetection": block}} for name, block in agents.items()]
        }
    return parse_config(document).config


LOW = {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5, "globalCircuitBreakerThreshold": 7}


def low(**overrides: Any) -> FleetConfig:
    return fleet(**{**LOW, **overrides})


NO_RECOVERY = parse_policy({"recovery": {"enabled": False}})
"""The detector-level behaviour (spec §1–7 with §8.1 and §8.2): a loop that comes back after its block is blocked again, the run goes on."""


# --- a driver that keeps per-run state and seq ---


class Driver:
    """Feeds events to the engine the way replay does: one state per run."""

    def __init__(self, config: FleetConfig, policy: FleetPolicy | None = None) -> None:
        self.config = config
        self.policy = policy
        self.states: dict[str, RunState] = {}
        self.seqs: dict[str, int] = {}
        self.calls = 0

    def next_seq(self, run: str) -> int:
        self.seqs[run] = self.seqs.get(run, 0) + 1
        return self.seqs[run]

    def feed(self, event: Any) -> list[Any]:
        outcome = apply(self.states.get(event.run_id), event, self.config, self.policy)
        self.states[event.run_id] = outcome.state
        self.last_outcome = outcome
        return outcome.verdicts

    def call(self, tool: str, args: Any = _MISSING, *, run: str = "r1", **kw: Any) -> Any:
        self.calls += 1
        verdicts = self.feed(
            call(run, self.next_seq(run), tool, args, call_id=kw.pop("call_id", None) or f"k{self.calls}", **kw)
        )
        assert len(verdicts) == 1
        return verdicts[0]

    def result(self, tool: str, call_id: str | None = None, *, run: str = "r1", **kw: Any) -> list[Any]:
        return self.feed(result(run, self.next_seq(run), tool, call_id or f"k{self.calls}", **kw))

    def step(
        self,
        tool: str,
        args: Any = _MISSING,
        *,
        run: str = "r1",
        res: Any = _MISSING,
        err: Any = _MISSING,
        agent: Any = _MISSING,
    ) -> Any:
        """A call and, unless it was blocked or aborted, its result; returns the call's verdict."""
        verdict = self.call(tool, args, run=run, agent=agent)
        if verdict.decision not in ("block", "abort"):
            self.result(tool, run=run, result=res, error=err)
        return verdict

    def compact(self, *, run: str = "r1", agent: Any = _MISSING) -> Any:
        self.feed(compaction(run, self.next_seq(run), agent=agent))
        return self.last_outcome

    def end(self, *, run: str = "r1") -> None:
        self.feed(run_end(run, self.next_seq(run)))

    def state(self, run: str = "r1") -> RunState:
        return self.states[run]


def stored(state: RunState) -> bytes:
    """A run state's bytes as the worker stores them."""
    return encode_stored(StoredRun(0.0, state))


def restored(data: bytes) -> RunState:
    """The run state in bytes the worker stored."""
    return decode_stored(data).state


def unknown_tool_blocks(runs: int) -> list[bytes]:
    """One block per run (`r0`, `r1`…) on the same unknown tool, in one fleet
    window: the fleet stage counts them under one fingerprint."""
    return [
        encode_verdict(
            Verdict(
                run_id=f"r{n}",
                seq=1,
                tool_call_id="c",
                tool_name="nope",
                decision="block",
                detector="unknown_tool_repeat",
                ts=1796187600.0,
            )
        )
        for n in range(runs)
    ]
