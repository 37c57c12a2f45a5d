"""Head to head on the real gateway: OpenClaw's own loop detection against
loopwarden's plugin, with the same scripted model that ignores what it is told.

Each behaviour runs twice through `openclaw agent --local`:
- built-in: `tools.loopDetection.enabled: true`, no plugin;
- loopwarden: the gateway's detection off, the plugin loaded, and a real
  `loopwarden worker` with the default thresholds and no policy file.

Counted: how often the looping tool really ran and whether a guard ended the
run (the model never got to give up at its turn cap):
- a failing `read` really ran when the gateway logged it (`[tools] read
  failed: ...`, once per run of the tool; a vetoed call never runs);
- a tool that does not exist "ran" when the model got the gateway's `Tool
  NAME not found`. The gateway's own unknown-tool guard (on whatever the loop
  detection settings, threshold 10) ends such a run by answering for the model.
The module prints the table that docs/OPENCLAW.md shows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import Worker, consume, names
from openclaw_gateway import OpenClaw, gateway_home
from scripted_model import Calls, Message, Reply, Script, ScriptedModel, ToolCall, message_text, tool_messages

pytestmark = pytest.mark.integration

GIVE_UP = "I give up: the tests still fail."
#: What the gateway says when its tool-loop recovery ends a run.
BUILTIN_STOP = "OpenClaw stopped this run because tool-loop recovery encountered another critical loop"
#: What the CLI says when a plugin ended the run through the SDK (abortAgentHarnessRun).
ABORTED = "agent run aborted"
#: The gateway's unknown-tool guard answering for the model after 10 calls of a missing tool.
UNKNOWN_TOOL_STOP = "here because it isn't available. I need to stop retrying it"


def latest_results(messages: list[Message]) -> list[str]:
    """The texts of the tool results the model got for its previous response."""
    results: list[str] = []
    for message in reversed(messages):
        if message.get("role") == "assistant":
            break
        if message.get("role") == "tool":
            results.append(message_text(message))
    return results[::-1]


def ran(text: str) -> bool:
    """A failing read that really ran (anything else the model got back was a veto)."""
    return "File not found" in text


class Model:
    """A scripted model that plays one behaviour for at most `turns` responses, then gives up."""

    def __init__(self, turns: int, play: Callable[[int, list[str]], Calls | ToolCall]) -> None:
        self.turns = turns
        self.play = play
        self.responses = 0
        self.gave_up = False

    def __call__(self, messages: list[Message]) -> Any:
        if self.responses >= self.turns:
            self.gave_up = True
            return Reply(GIVE_UP)
        self.responses += 1
        return self.play(self.responses, latest_results(messages))


def read(name: str) -> ToolCall:
    return ToolCall("read", {"path": name})


def repeat_one_read() -> Script:
    return Model(30, lambda turn, results: read("missing-repeat.txt"))


def ping_pong(*, after_block: str) -> Script:
    """Two failing reads in turn, A, B, A, B ... After a block the model calls the blocked
    side again (`retry`), or the other side as if nothing happened (`alternate`), or does
    something else that works once (`move_on`: a read of a file that exists) and then goes
    back to the ping-pong with the other side."""
    sides = [read(f"missing-{after_block}-a.txt"), read(f"missing-{after_block}-b.txt")]
    state = {"side": 1, "moved": False}

    def play(turn: int, results: list[str]) -> ToolCall:
        blocked = turn > 1 and not state["moved"] and not any(ran(text) for text in results)
        if blocked and after_block == "move_on":
            state["moved"] = True
            return read("notes.txt")
        state["moved"] = False
        if not (blocked and after_block == "retry"):  # "alternate" ignores the block
            state["side"] = 1 - state["side"]
        return sides[state["side"]]

    return Model(60, play)


THREE = "missing-three.txt"


def three_identical_reads() -> Script:
    return Model(15, lambda turn, results: Calls([read(THREE)] * 3))


def missing_tool() -> Script:
    return Model(30, lambda turn, results: ToolCall("run_tests", {"suite": "all"}))


BEHAVIOURS: dict[str, tuple[str, Callable[[], Script]]] = {
    "repeats one failing read": ("read", repeat_one_read),
    "retries the blocked side of a ping-pong": ("read", lambda: ping_pong(after_block="retry")),
    "makes three identical failing calls per turn": ("read", three_identical_reads),
    "ping-pongs, moving on to the other side after a block": ("read", lambda: ping_pong(after_block="alternate")),
    "ping-pongs, doing something else that works after a block, then ping-pongs again": (
        "read",
        lambda: ping_pong(after_block="move_on"),
    ),
    "calls a tool that does not exist": ("run_tests", missing_tool),
}


@dataclass(frozen=True)
class Outcome:
    """How one behaviour went through one guard."""

    ran: int
    ended: bool
    stderr: str

    def cell(self) -> str:
        return f"{self.ran} / {'yes' if self.ended else 'no'}"


def tool_runs(tool: str, stderr: str, model: ScriptedModel) -> int:
    """Real runs of the looping tool: the gateway logs every failed run of a tool; a tool
    that does not exist never runs, the gateway answers `Tool NAME not found` for it."""
    if tool == "read":
        return len(re.findall(r"\[tools\] read failed: ", stderr))
    shown = [message_text(m) for m in tool_messages(model.requests[-1])] if model.requests else []
    return sum(f"Tool {tool} not found" in text for text in shown)


def play(openclaw: OpenClaw, work: Path, behaviour: str, plugin: dict[str, Any] | None) -> Outcome:
    tool, make = BEHAVIOURS[behaviour]
    script = make()
    with ScriptedModel(script) as model:
        home = gateway_home(work, model.base_url, plugin)
        (work / "workspace").mkdir(exist_ok=True)
        (work / "workspace" / "notes.txt").write_text("notes: the tests need a database\n")
        done = openclaw.run_agent(home, "Run the tests until they pass.")
    (work / "stdout.json").write_text(done.stdout)  # kept for a failure's post-mortem
    (work / "stderr.txt").write_text(done.stderr)
    assert isinstance(script, Model)
    output = done.stdout + done.stderr
    stopped = any(marker in output for marker in (BUILTIN_STOP, ABORTED, UNKNOWN_TOOL_STOP))
    return Outcome(tool_runs(tool, done.stderr, model), stopped and not script.gave_up, done.stderr)


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One real worker for every loopwarden run of the module (each run is its own key):
    the default thresholds, no policy file."""
    work = tmp_path_factory.mktemp("head-to-head-worker")
    config = work / "loopwarden.json"
    config.write_text(json.dumps({"tools": {"loopDetection": {"enabled": True}}}))
    topics = names("head-to-head")
    with Worker(broker.bootstrap, topics, work, "worker", config=config, partitions=3) as running:
        running.wait_assigned()
        yield {"bootstrap": broker.bootstrap, "eventsTopic": topics["events"], "decisionsTopic": topics["decisions"]}


@pytest.fixture(scope="module")
def table(
    openclaw: OpenClaw, worker: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Outcome]]:
    """Every behaviour against both guards, four runs at a time; prints the table.
    Twelve side by side kept two cores so busy that a verdict could outwait
    the plugin's 10 s timeout, and the plugin then fails open."""
    plugin = {**worker, "timeoutMs": 10_000}
    with ThreadPoolExecutor(4) as pool:
        futures: dict[str, dict[str, Future[Outcome]]] = {
            behaviour: {
                guard: pool.submit(play, openclaw, tmp_path_factory.mktemp(f"h2h-{guard}"), behaviour, config)
                for guard, config in (("built-in", None), ("loopwarden", plugin))
            }
            for behaviour in BEHAVIOURS
        }
        outcomes = {behaviour: {guard: f.result() for guard, f in each.items()} for behaviour, each in futures.items()}
    lines = [
        "| the model ... | built-in: tool ran / run ended | loopwarden: tool ran / run ended |",
        "|---|---|---|",
        *(f"| {b} | {o['built-in'].cell()} | {o['loopwarden'].cell()} |" for b, o in outcomes.items()),
    ]
    print("\n" + "\n".join(lines))
    return outcomes


def test_loopwarden_is_never_laxer_than_the_built_in(table: dict[str, dict[str, Outcome]]) -> None:
    for behaviour, outcome in table.items():
        builtin, ours = outcome["built-in"], outcome["loopwarden"]
        assert ours.ran <= builtin.ran, (behaviour, builtin.cell(), ours.cell())
        assert ours.ended or not builtin.ended, (behaviour, builtin.cell(), ours.cell(), ours.stderr[-3000:])


def test_loopwarden_is_tighter_on_ping_pongs(table: dict[str, dict[str, Outcome]]) -> None:
    for behaviour in (
        "retries the blocked side of a ping-pong",
        "ping-pongs, moving on to the other side after a block",
    ):
        builtin, ours = table[behaviour]["built-in"], table[behaviour]["loopwarden"]
        assert ours.ran < builtin.ran, (behaviour, builtin.cell(), ours.cell())


def test_the_plugin_publishes_each_response_as_one_turn(
    table: dict[str, dict[str, Outcome]], worker: dict[str, str]
) -> None:
    """Every call went out with the name of the response that made it, and the three calls
    of each response of the three-identical-calls model were published together, before
    any of them ran."""
    records = consume(worker["bootstrap"], worker["eventsTopic"], count=1, timeout=20, settle=2.0)
    events = [json.loads(record.value) for record in records]
    calls = [event for event in events if event["type"] == "tool_call"]
    assert calls and all(
        isinstance(event.get("turn"), str) and not event["turn"].startswith("call:") for event in calls
    )
    ids = {event["tool_call_id"] for event in calls if event.get("args") == {"path": THREE}}
    run_ids = {event["run_id"] for event in calls if event["tool_call_id"] in ids}
    assert len(run_ids) == 1
    run = sorted((event for event in events if event["run_id"] in run_ids), key=lambda event: event["seq"])
    turns: dict[str, list[int]] = {}
    for position, event in enumerate(run):
        if event["type"] == "tool_call":
            turns.setdefault(event["turn"], []).append(position)
    assert turns and all(len(positions) == 3 for positions in turns.values()), turns
    # Published one after the other: no result of the turn's calls comes between them.
    assert all(positions == list(range(positions[0], positions[0] + 3)) for positions in turns.values()), turns
