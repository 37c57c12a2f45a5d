"""Spec §8: turns, latches and recovery, and policy spec's `recovery` key
(step 4) with shadow mode, as pure functions of (state, event, config, policy)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import NO_RECOVERY, Driver, call, fleet, low, restored, stored
from schemas.codec import BadEvent, decode_event
from schemas.policy import parse_policy
from schemas.state import BLOCKED_RAN, OWN_TURN, VETO, Latch, Record, RunState
from stories import ENOENT, TABLE, play, ping_pong_doing_something_else, retries_the_blocked_side
from streams.engine import apply

DEFAULTS = fleet(enabled=True)
FAIL = {"error": ENOENT}
OK = {"result": {"content": [{"type": "text", "text": "done"}]}}


class Turns(Driver):
    """A Driver whose calls name their turn."""

    def ask(self, tool: str, args: Any, turn: str | None, **kw: Any) -> Any:
        return self.call(tool, args, **({"turn": turn} if turn is not None else {}), **kw)

    def done(self, tool: str, call_id: str | None = None, outcome: dict[str, Any] = FAIL) -> list[Any]:
        return self.result(
            tool, call_id, **{("result" if "result" in outcome else "error"): next(iter(outcome.values()))}
        )


def turns(config=None, policy=None) -> Turns:  # type: ignore[no-untyped-def]
    return Turns(config or low(), policy)


def fail_five_times(d: Turns, tool: str = "read", args: Any = None) -> None:
    """Five identical failing calls, one per turn, each run: the next is blocked (low())."""
    for n in range(5):
        d.ask(tool, args or {"path": "x"}, f"{tool}{n}")
        d.done(tool)


def repeat_until_blocked(d: Turns, tool: str = "read", args: Any = None) -> Any:
    """The same failing call, one per turn, until the detectors block it (low(): the sixth call, turn t6)."""
    args = args or {"path": "x"}
    for n in range(1, 30):
        v = d.ask(tool, args, f"t{n}")
        if v.decision != "allow" and v.decision != "warn":
            return v
        d.done(tool)
    raise AssertionError("never blocked")


# --- the wire -----------------------------------------------------------------------------------------


def test_a_turn_is_a_string_of_1_to_256_code_points() -> None:
    line = b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","turn":%s}'
    assert decode_event(line % b'"msg-1"').turn == "msg-1"
    assert decode_event(line % ('"' + "\u00e9" * 256 + '"').encode()).turn == "\u00e9" * 256  # 512 bytes
    assert (
        decode_event(b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t"}').turn
        is msgspec.UNSET
    )


@pytest.mark.parametrize("bad", [b"null", b'""', ('"' + "x" * 257 + '"').encode(), b"7", b'["a"]', b"{}"])
def test_a_malformed_turn_is_refused_naming_the_field(bad: bytes) -> None:
    line = b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","turn":%s}' % bad
    with pytest.raises(BadEvent) as refused:
        decode_event(line)
    assert refused.value.kind == "invalid_turn"
    assert "turn: expected a string of 1 to 256 characters" in str(refused.value)


def test_states_stored_before_section_8_decode_with_no_latches() -> None:
    """A state written before §8 (no latches, blocked turns or first blocked
    turn, records without a turn) decodes, and the run goes on."""
    d = Driver(low())
    for _ in range(3):
        d.step("read", {"p": 1}, err="x")
    now = d.state()
    old = msgspec.msgpack.encode(
        [
            0.0,
            {
                name: msgspec.to_builtins(getattr(now, name))
                for name in ("last_seq", "agent_id", "warning_buckets", "guard_remaining", "guard_window")
            }
            | {"history": [list(msgspec.to_builtins(r))[:8] for r in now.history]},
        ]
    )
    state = restored(old)
    assert (state.latches, state.blocked_turns, state.first_blocked_turn) == ([], {}, None)
    assert [r.turn for r in state.history] == [None] * 3
    assert stored(state) == stored(now)


# --- §8.2 latches -------------------------------------------------------------------------------------


def test_a_generic_latch_covers_exactly_the_blocked_call() -> None:
    d = turns(policy=NO_RECOVERY)
    first = repeat_until_blocked(d)
    latch = d.state().latches[-1]
    assert latch.args_hash == d.state().history[-1].args_hash and latch.paired_tool is None
    assert latch.covers("read", latch.args_hash) and not latch.covers("read", "read:other")
    assert not latch.covers("write", latch.args_hash)
    # Another args of the same tool is not covered; the call itself is.
    other = d.ask("read", {"path": "y"}, "u1")
    assert other.decision == "allow"
    again = d.ask("read", {"path": "x"}, "u2")
    assert (again.decision, again.detector, again.count, again.warning_key) == (
        "block",
        first.detector,
        first.count,
        first.warning_key,
    )
    assert "still blocked" in again.message


def test_an_unknown_tool_latch_covers_every_call_of_the_tool() -> None:
    d = turns(low(unknownToolThreshold=3), NO_RECOVERY)
    for n in range(3):
        d.ask("ghost", {"n": n}, f"t{n}")
        d.done("ghost", outcome={"error": "Unknown tool: ghost"})
    blocked = d.ask("ghost", {"n": 9}, "t9")
    assert (blocked.decision, blocked.detector) == ("block", "unknown_tool_repeat")
    assert d.state().latches[-1].args_hash is None
    # A veto record of the tool is skipped by the streak (§7.4), but the latch alone would hold anyway.
    assert d.ask("ghost", {"other": "args"}, "t10").detector == "unknown_tool_repeat"
    assert d.ask("real_tool", {}, "t11").decision == "allow"


def test_a_ping_pong_latch_covers_both_sides() -> None:
    d = turns(policy=NO_RECOVERY)
    verdicts = []
    for n in range(20):
        v = d.ask("read", {"path": "ab"[n % 2]}, f"t{n}")
        verdicts.append(v)
        if v.decision == "block":
            break
        d.done("read")
    assert (verdicts[-1].detector, verdicts[-1].paired_tool_name) == ("ping_pong", "read")
    latch = d.state().latches[-1]
    sides = {latch.args_hash, latch.paired_args_hash}
    assert len(sides) == 2
    # The blocked side retried, and the paired side: both blocked by the latch.
    side_a, side_b = (d.ask("read", {"path": p}, f"u{p}") for p in "ab")
    assert side_a.decision == side_b.decision == "block"
    assert side_a.warning_key == side_b.warning_key == verdicts[-1].warning_key


def test_a_latch_is_released_by_the_first_call_that_runs_not_by_a_decision() -> None:
    d = turns(policy=NO_RECOVERY)
    repeat_until_blocked(d)
    assert d.state().latches
    other = d.ask("exec", {"command": "ls"}, "u1")
    assert other.decision == "allow" and d.state().latches  # decided, not yet run: still latched
    assert d.ask("read", {"path": "x"}, "u1").decision == "block"  # so the loop cannot slip out in that turn
    d.done("exec", other.tool_call_id, OK)
    assert d.state().latches == []


@pytest.mark.parametrize("how", ["veto result", "blocked call's result", "unknown call's result"])
def test_results_that_release_no_latch(how: str) -> None:
    d = turns(policy=NO_RECOVERY)
    blocked = repeat_until_blocked(d)
    if how == "veto result":
        d.ask("exec", {"command": "ls"}, "u1")
        d.result("exec", result={"details": {"status": "blocked", "deniedReason": "tool-loop"}})
    elif how == "blocked call's result":  # the gateway ran a blocked call after all
        d.done("read", blocked.tool_call_id, OK)
    else:
        d.done("exec", "never-asked", OK)
    assert d.state().latches, how


def test_a_new_block_replaces_the_latch_of_its_key_and_becomes_the_newest() -> None:
    d = two_loops_blocked_in_one_turn()
    keys = [latch.block.warning_key for latch in d.state().latches]
    assert [key.split(":")[1] for key in keys] == ["read", "grep"]
    again = d.ask("read", {"path": "x"}, "again")  # the detectors block it again, one veto further
    assert (again.detector, again.count) == ("generic_repeat", 6)
    assert [latch.block.warning_key for latch in d.state().latches] == [keys[1], keys[0]]
    assert d.state().latches[-1].block.count == 6


def test_latch_and_turn_blocks_deliver_no_warning_and_set_no_latch() -> None:
    d = turns(policy=NO_RECOVERY)
    for n in range(3):
        d.ask("write", {"path": "y"}, f"w{n}")
        d.done("write", outcome=OK)
    blocked = repeat_until_blocked(d)
    latches = list(d.state().latches)
    # In the blocked turn a call the detectors would warn about, for the first time, is blocked instead.
    v = d.ask("write", {"path": "y"}, blocked_turn(d))
    assert (v.decision, v.detector) == ("block", "generic_repeat") and "another call of this turn" in v.message
    assert not any(key.startswith("generic:write:") for key in d.state().warning_buckets)
    assert d.state().latches == latches
    # The gateway ran the blocked call after all, with a new outcome: the detectors would allow it, the latch does not.
    d.done("read", blocked.tool_call_id, OK)
    again = d.ask("read", {"path": "x"}, "later")
    assert again.decision == "block" and "still blocked" in again.message and d.state().latches == latches
    # Where no block stands, the warning the turn rule withheld is delivered.
    assert d.ask("write", {"path": "y"}, "other").decision == "warn"


def test_only_run_end_forgets_latches_blocked_turns_and_the_first_blocked_turn() -> None:
    d = turns(policy=NO_RECOVERY)
    repeat_until_blocked(d)
    d.compact()
    state = d.state()
    assert state.latches and state.blocked_turns and state.first_blocked_turn is None  # recovery is off
    d.end()
    state = d.state()
    assert (state.latches, state.blocked_turns, state.first_blocked_turn) == ([], {}, None)
    on = turns()
    repeat_until_blocked(on)
    on.compact()
    assert on.state().first_blocked_turn == "t6"
    on.end()
    assert on.state().first_blocked_turn is None


# --- §8.1 turns ---------------------------------------------------------------------------------------


def test_calls_of_a_blocked_turn_are_blocked_with_its_first_block() -> None:
    d = turns(policy=NO_RECOVERY)
    fail_five_times(d)
    first = d.ask("read", {"path": "x"}, "T")
    assert first.decision == "block"
    other = d.ask("write", {"path": "y"}, "T")
    assert (other.decision, other.level, other.detector, other.count, other.warning_key, other.paired_tool_name) == (
        "block",
        "critical",
        first.detector,
        first.count,
        first.warning_key,
        first.paired_tool_name,
    )
    assert "another call of this turn" in other.message
    assert len(d.state().latches) == 1  # the turn rule sets no latch
    assert d.state().history[-1].flags == VETO
    assert d.ask("write", {"path": "y"}, "T2").decision == "allow"  # another turn is judged on its own


def two_loops_blocked_in_one_turn() -> Turns:
    """Turn T: a repeated read blocked first, then a repeated grep the detectors
    block too (no ping-pong: the read's veto and the greps would warn of one first)."""
    d = turns(low(detectors={"pingPong": False}), NO_RECOVERY)
    for tool, args in (("read", {"path": "x"}), ("grep", {"q": "y"})):
        fail_five_times(d, tool, args)
    first = d.ask("read", {"path": "x"}, "T")
    own = d.ask("grep", {"q": "y"}, "T")
    assert (first.decision, own.decision) == ("block", "block")
    assert own.warning_key.startswith("generic:grep:") and first.warning_key.startswith("generic:read:")
    return d


def blocked_turn(d: Driver) -> str:
    return next(iter(d.state().blocked_turns))


def test_a_call_the_detectors_block_in_a_blocked_turn_keeps_its_own_block_and_latch() -> None:
    d = two_loops_blocked_in_one_turn()
    assert [latch.block.tool for latch in d.state().latches] == ["read", "grep"]
    assert d.state().blocked_turns == {"T": d.state().latches[0].block}


def test_pending_calls_of_the_turn_count_as_vetoes_and_stay_open() -> None:
    """Four failures, then two more identical calls in one turn: the second
    sees the first, still open, as a veto, so the streak reaches
    criticalThreshold (5) as the gateway projects the batch. Without turns
    the open call is skipped and the second call is only warned."""
    verdicts = {}
    for turn in ("T", None):
        d = turns(policy=NO_RECOVERY)
        for n in range(4):
            d.ask("read", {"path": "x"}, f"t{n}")
            d.done("read")
        verdicts[turn] = [d.ask("read", {"path": "x"}, turn) for _ in range(2)]
        history = d.state().history
        assert history[4].flags == 0 and history[4].result_hash is None  # the open call stays open
        assert history[4].turn == turn
    assert [(v.decision, v.count) for v in verdicts["T"]] == [("allow", 4), ("block", 5)]
    assert [(v.decision, v.level) for v in verdicts[None]] == [("allow", "warning"), ("allow", "warning")]


def test_pending_calls_of_another_turn_are_not_vetoes() -> None:
    d = turns(policy=NO_RECOVERY)
    assert [d.ask("read", {"path": "x"}, "A").level for _ in range(5)] == ["none"] * 3 + ["warning"] * 2
    v = d.ask("read", {"path": "x"}, "B")
    # Five open calls of turn A: as vetoes they would make a streak of 5 and block; as open calls only the recent count sees them.
    assert (v.decision, v.level, v.detector, v.count) == ("allow", "warning", "generic_repeat", 5)


def test_results_clear_the_turn_of_their_record() -> None:
    d = turns()
    d.ask("read", {"path": "x"}, "T")
    assert d.state().history[-1].turn == "T"
    d.done("read")
    assert d.state().history[-1].turn is None


@pytest.mark.parametrize(
    ("name", "ran", "turns_played"),
    [
        ("repeats one failing read", 20, 22),
        ("retries the blocked side of a ping-pong", 19, 21),
        ("three identical calls per turn", 18, 8),
        ("ping-pong, moving on to the other side after a block", 19, 21),
        ("ping-pong, doing something else that works after a block, then again", 38, 41),
        ("calls a tool that does not exist", 10, 12),
    ],
)
def test_the_table_of_section_8(name: str, ran: int, turns_played: int) -> None:
    """Each behaviour, with the default thresholds and no policy file: the tool
    runs no more often than on the reference gateway (docs/OPENCLAW.md: 20, 38, 18, 49, 38, 10) and
    every run ends, at the turn after the first blocked one."""
    model, tool = TABLE[name]
    story = play(model, DEFAULTS, max_turns=60)
    assert (story.ran(tool), story.ended, story.turns) == (ran, True, turns_played)
    aborts = [v for v in story.verdicts if v.decision == "abort"]
    assert {v.error for v in aborts} == {"loop_recovery_exhausted"}
    first_block = story.decisions.index("block")
    if not name.startswith("ping-pong, doing something else"):  # the others never run the tool again
        assert set(story.decisions[first_block:]) <= {"block", "abort"}


def test_a_long_ping_pong_stays_blocked_from_its_first_block() -> None:
    """60 calls: with recovery off every call from the first block on is
    blocked (§1–7 alone warned call 49, once vetoes filled the history); with
    recovery on, the call after the block ends the run."""
    story = play(retries_the_blocked_side, DEFAULTS, NO_RECOVERY, max_turns=60)
    assert len(story.verdicts) == 60 and story.decisions.index("block") == 19
    assert story.decisions[19:] == ["block"] * 41
    assert {v.detector for v in story.verdicts[19:]} <= {"ping_pong", "global_circuit_breaker", "generic_repeat"}
    ended = play(retries_the_blocked_side, DEFAULTS, max_turns=60)
    assert ended.decisions[19:] == ["block", "abort"]


def test_a_latch_released_by_another_call_that_runs() -> None:
    """After the block, a call that works runs: the loop is unlatched, and it is
    judged afresh by the detectors, which need a whole new alternation of 19
    calls before they block it again."""
    story = play(ping_pong_doing_something_else, DEFAULTS, NO_RECOVERY, max_turns=42)
    assert story.decisions[19] == "block" and story.verdicts[20].tool_name == "exec"
    assert story.decisions[20] == "allow"
    again = story.decisions.index("block", 21)
    assert again == 21 + 19 and set(story.decisions[21:again]) <= {"allow", "warn"}
    assert story.verdicts[again].detector == "ping_pong"


# --- §8.3 recovery ------------------------------------------------------------------------------------


def test_recovery_ends_a_run_whose_loop_comes_back_in_another_turn() -> None:
    d = turns()
    first = repeat_until_blocked(d)
    assert d.state().first_blocked_turn == "t6"
    same_turn = d.ask("write", {"path": "y"}, "t6")
    assert same_turn.decision == "block"  # the turn rule, in the first blocked turn: not a recovery
    back = d.ask("read", {"path": "x"}, "t7")
    assert (back.decision, back.level, back.detector, back.count, back.warning_key, back.error) == (
        "abort",
        "critical",
        first.detector,
        first.count,
        first.warning_key,
        "loop_recovery_exhausted",
    )
    assert "came back after it was blocked" in back.message
    later = d.ask("ls", {}, "t8")
    assert (later.decision, later.detector, later.error) == ("abort", "generic_repeat", "loop_recovery_exhausted")
    assert d.state().aborted is not None and d.state().aborted.error == "loop_recovery_exhausted"


def test_without_turns_the_second_blocked_call_ends_the_run() -> None:
    plain = Driver(low())
    verdicts = [plain.step("read", {"p": 1}, err="x") for _ in range(7)]
    assert [v.decision for v in verdicts] == ["allow"] * 3 + ["warn", "allow", "block", "abort"]
    assert plain.state().first_blocked_turn == OWN_TURN


def test_recovery_counts_blocks_of_any_kind_and_a_later_turn_of_another_loop() -> None:
    d = turns()
    repeat_until_blocked(d, "read", {"path": "x"})
    d.ask("exec", {"c": 1}, "u")
    d.done("exec", outcome=OK)  # the latch is released: something else ran
    v = None
    for n in range(10):
        v = d.ask("grep", {"q": 1}, f"g{n}")
        if v.decision != "allow" and v.decision != "warn":
            break
        d.done("grep")
    assert v is not None and (v.decision, v.detector, v.error) == ("abort", "generic_repeat", "loop_recovery_exhausted")


def test_recovery_off_keeps_blocking() -> None:
    for policy in (NO_RECOVERY, parse_policy({"agents": {"a": {"recovery": {"enabled": False}}}})):
        d = Driver(low(), policy)
        verdicts = [d.step("read", {"p": 1}, err="x", agent="a") for _ in range(12)]
        assert [v.decision for v in verdicts[5:]] == ["block"] * 7 and d.state().aborted is None


def test_escalation_counts_a_recovery_abort_as_blocked_and_does_not_abort_again() -> None:
    d = Driver(low(), parse_policy({"escalation": {"enabled": True, "blockedCalls": 2, "window": 5}}))
    verdicts = [d.step("read", {"p": 1}, err="x") for _ in range(7)]
    assert (verdicts[-1].decision, verdicts[-1].error) == ("abort", "loop_recovery_exhausted")
    assert d.state().escalation[-2:] == [True, True]


# --- shadow mode --------------------------------------------------------------------------------------


def test_shadow_reports_a_would_be_end_once_and_the_turn_becomes_the_first() -> None:
    d = turns(policy=parse_policy({"mode": "shadow"}))
    fail_five_times(d)
    shadowed = []
    for turn in ("A", "A", "B", "B", "C"):
        v = d.ask("read", {"path": "x"}, turn)
        shadowed.append((v.decision, v.shadow_decision, v.error))
        d.done("read")  # it ran: the gateway obeys nothing in shadow mode
    assert shadowed == [
        ("allow", "block", None),
        ("allow", "block", None),  # the first blocked turn: the turn rule, not a recovery
        ("allow", "abort", None),  # would have ended the run; B is now the first blocked turn
        ("allow", "block", None),
        ("allow", "abort", None),
    ]
    assert d.state().aborted is None and d.state().first_blocked_turn == "C"
    assert all(r.flags & VETO == 0 for r in d.state().history)


def test_shadow_latches_are_released_only_by_a_call_whose_shadow_decision_let_it_run() -> None:
    d = turns(policy=parse_policy({"mode": "shadow", "recovery": {"enabled": False}}))
    fail_five_times(d)
    blocked = d.ask("read", {"path": "x"}, "u")
    assert blocked.shadow_decision == "block" and d.state().history[-1].flags == BLOCKED_RAN
    assert d.state().latches
    d.done("read", blocked.tool_call_id, OK)
    assert d.state().latches and d.state().history[-1].flags == 0  # a would-be block ran: that releases nothing
    assert d.ask("read", {"path": "x"}, "w").shadow_decision == "block"  # the latch, though the result changed
    d.ask("ls", {}, "v")
    d.done("ls", outcome=OK)
    assert d.state().latches == []


# --- properties ---------------------------------------------------------------------------------------

TURN_STEPS = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 2), st.booleans()),  # calls in the turn, args, results fail
    min_size=1,
    max_size=25,
)


def admit(steps: list[tuple[int, int, bool]], policy: Any) -> tuple[list[Any], RunState]:
    """A gateway admitting each turn whole, over calls of three args."""
    state, verdicts, seq = None, [], 0
    for number, (size, args, fails) in enumerate(steps):
        ids = []
        for k in range(size):
            seq += 1
            ids.append(f"c{seq}")
            event = call("r", seq, "read", {"a": (args + k) % 3}, call_id=f"c{seq}")
            event = msgspec.structs.replace(event, turn=f"turn{number}")
            out = apply(state, event, low(), policy)
            state, verdicts = out.state, verdicts + out.verdicts
        refused = any(v.decision in ("block", "abort") for v in verdicts[-size:])
        for k, call_id in enumerate(ids):
            seq += 1
            payload = {"details": {"status": "blocked", "deniedReason": "tool-loop"}} if refused else {"r": fails}
            event = decode_event(
                msgspec.json.encode(
                    {
                        "type": "tool_result",
                        "run_id": "r",
                        "seq": seq,
                        "tool_call_id": call_id,
                        "tool_name": "read",
                        "args": {"a": (args + k) % 3},
                        "result": payload,
                    }
                )
            )
            out = apply(state, event, low(), policy)
            state, verdicts = out.state, verdicts + out.verdicts
    assert state is not None
    return verdicts, state


@settings(max_examples=150, deadline=None)
@given(TURN_STEPS)
def test_recovery_ends_a_run_at_its_second_blocked_turn_and_never_in_the_first(steps) -> None:
    verdicts, state = admit(steps, None)
    off, _ = admit(steps, NO_RECOVERY)
    decisions = [v.decision for v in verdicts]
    if "abort" not in decisions:
        assert decisions == [v.decision for v in off]
        return
    ended = decisions.index("abort")
    assert verdicts[ended].error == "loop_recovery_exhausted"
    # Up to the abort both decide alike; the abort stands where recovery off blocks, in a later turn than the first block.
    assert decisions[:ended] == [v.decision for v in off[:ended]] and off[ended].decision == "block"
    first_block = decisions.index("block")
    assert state.first_blocked_turn is not None and verdicts[first_block].seq < verdicts[ended].seq
    assert len(state.latches) <= 32 and len(state.blocked_turns) <= 32


@settings(max_examples=150, deadline=None)
@given(TURN_STEPS)
def test_no_open_record_is_ever_left_a_veto_by_the_projection(steps) -> None:
    _, state = admit(steps, NO_RECOVERY)
    assert all(r.turn is None or (r.result_hash is None and not r.flags & VETO) for r in state.history)
    assert all(isinstance(latch, Latch) for latch in state.latches)
    assert all(isinstance(r, Record) for r in state.history)
