"""The model behaviours of spec §8's table, played against the engine by a
gateway that admits each model response (turn) as a whole.

The gateway publishes every call of a turn first, then runs all of them only
when none was blocked or aborted; otherwise it answers each with the veto
result the reference gateway shows the model. It stops at an abort, as the
OpenClaw plugin ends the run. What it publishes is kept as JSON lines, so the
same story can go through `loopwarden replay` and a real worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from schemas.codec import decode_event
from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from schemas.state import RunState
from schemas.verdicts import Verdict
from streams.engine import apply

Call = tuple[str, dict[str, Any]]
"""A tool name and its args."""
Model = Callable[[list[Verdict]], Iterator[list[Call]]]
"""Given the verdicts so far (a list that grows as the story goes), the model's turns."""

ENOENT = "ENOENT: no such file or directory"
VETO = {"status": "blocked", "deniedReason": "tool-loop"}


def outcome(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """What a call returns when it runs: reads of missing files and unknown tools fail, the rest succeed."""
    if tool == "read":
        return {"error": f"{ENOENT}, open '{args['path']}'"}
    if tool == "web_serch":
        return {"error": "Unknown tool: web_serch"}
    return {"result": {"content": [{"type": "text", "text": f"{tool} done"}]}}


@dataclass
class Story:
    """What a run of one model left: the calls that really ran, the verdicts,
    whether loopwarden ended the run, and the events the gateway published."""

    executions: dict[str, int] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    ended: bool = False
    turns: int = 0
    lines: list[bytes] = field(default_factory=list)

    def ran(self, tool: str) -> int:
        return self.executions.get(tool, 0)

    @property
    def decisions(self) -> list[str]:
        return [v.decision for v in self.verdicts]


def play(
    model: Model,
    config: FleetConfig,
    policy: FleetPolicy | None = None,
    *,
    run_id: str = "r",
    agent: str | None = None,
    max_turns: int = 40,
) -> Story:
    """One run of `model` through the engine, turn by turn (spec §8.1, last bullet)."""
    story = Story()
    state: RunState | None = None
    seq = 0

    def publish(event: dict[str, Any]) -> list[Verdict]:
        nonlocal state, seq
        seq += 1
        line = json.dumps({**event, "run_id": run_id, "seq": seq}, separators=(",", ":")).encode()
        story.lines.append(line)
        out = apply(state, decode_event(line), config, policy)
        state = out.state
        return out.verdicts

    for turn in model(story.verdicts):
        story.turns += 1
        if story.turns > max_turns:
            break
        ids = [f"t{story.turns}c{n}" for n in range(len(turn))]
        for call_id, (tool, args) in zip(ids, turn, strict=True):
            event = {"type": "tool_call", "tool_call_id": call_id, "tool_name": tool, "args": args}
            if agent is not None:
                event["agent_id"] = agent
            story.verdicts += publish({**event, "turn": f"turn-{story.turns}"})
        verdicts = story.verdicts[-len(turn) :]
        admitted = all(v.decision in ("allow", "warn") for v in verdicts)
        for call_id, (tool, args) in zip(ids, turn, strict=True):
            if admitted:
                story.executions[tool] = story.executions.get(tool, 0) + 1
                answer = outcome(tool, args)
            else:
                answer = {"result": {"content": [{"type": "text", "text": "blocked"}], "details": VETO}}
            publish({"type": "tool_result", "tool_call_id": call_id, "tool_name": tool, "args": args, **answer})
        if any(v.decision == "abort" for v in verdicts):
            story.ended = True
            break
    publish({"type": "run_end"})
    return story


def blocked(verdicts: list[Verdict]) -> bool:
    """The model's last turn was refused."""
    return bool(verdicts) and verdicts[-1].decision in ("block", "abort")


def repeats_a_failing_read(verdicts: list[Verdict]) -> Iterator[list[Call]]:
    while True:
        yield [("read", {"path": "missing.txt"})]


def retries_the_blocked_side(verdicts: list[Verdict]) -> Iterator[list[Call]]:
    """Ping-pongs between two failing reads; a blocked call is tried again as it was."""
    side = 0
    while True:
        yield [("read", {"path": "ab"[side % 2]})]
        if not blocked(verdicts):
            side += 1


def alternates_through_a_block(verdicts: list[Verdict]) -> Iterator[list[Call]]:
    """Ping-pongs between two failing reads and goes on to the other side after a block."""
    side = 0
    while True:
        yield [("read", {"path": "ab"[side % 2]})]
        side += 1


def three_identical_calls_per_turn(verdicts: list[Verdict]) -> Iterator[list[Call]]:
    while True:
        yield [("read", {"path": "missing.txt"})] * 3


def ping_pong_doing_something_else(verdicts: list[Verdict]) -> Iterator[list[Call]]:
    """Ping-pongs between two failing reads; after a block it runs something
    else that works, then goes back to the ping-pong."""
    side = 0
    while True:
        yield [("read", {"path": "ab"[side % 2]})]
        side += 1
        if blocked(verdicts):
            yield [("exec", {"command": "ls"})]


def calls_a_missing_tool(verdicts: list[Verdict]) -> Iterator[list[Call]]:
    n = 0
    while True:
        n += 1
        yield [("web_serch", {"q": f"query {n}"})]


TABLE: dict[str, tuple[Model, str]] = {
    "repeats one failing read": (repeats_a_failing_read, "read"),
    "retries the blocked side of a ping-pong": (retries_the_blocked_side, "read"),
    "three identical calls per turn": (three_identical_calls_per_turn, "read"),
    "ping-pong, moving on to the other side after a block": (alternates_through_a_block, "read"),
    "ping-pong, doing something else that works after a block, then again": (ping_pong_doing_something_else, "read"),
    "calls a tool that does not exist": (calls_a_missing_tool, "web_serch"),
}
"""Each behaviour of the table, and the tool whose real executions it counts."""


STEADY = "steady"
"""The agent whose runs keep §8.3's recovery off in POLICY: blocked, never ended."""
POLICY = {"agents": {STEADY: {"recovery": {"enabled": False}}}}


def section_8_trace(config: FleetConfig, policy: FleetPolicy) -> tuple[list[bytes], dict[str, Story]]:
    """Every story of §8 as one trace of interleaved runs, each played by the
    engine: the table's rows (default policy), a ping-pong 60 calls long that
    stays blocked from its first block, and a latch released by another call
    that runs (both under STEADY)."""
    plays = {
        f"row-{n}": play(model, config, policy, run_id=f"row-{n}", max_turns=60)
        for n, (model, _) in enumerate(TABLE.values(), 1)
    }
    plays["long-ping-pong"] = play(
        retries_the_blocked_side, config, policy, run_id="long-ping-pong", agent=STEADY, max_turns=60
    )
    plays["released"] = play(
        ping_pong_doing_something_else, config, policy, run_id="released", agent=STEADY, max_turns=42
    )
    queues = [story.lines for story in plays.values()]
    lines = [queue[i] for i in range(max(map(len, queues))) for queue in queues if i < len(queue)]
    return lines, plays
