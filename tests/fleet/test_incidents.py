"""The fleet stage's pure aggregation: fingerprints, windows, doubling,
distinct counting, the run cap, lateness, scope."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import decode_incident, decode_tally, encode_tally, touched_at
from schemas.incidents import MAX_AGENT_IDS, MAX_SAMPLE_RUNS
from schemas.verdicts import Verdict
from streams.fleet.incidents import IncidentSettings, count, event_time, fingerprint, incidents

BASE = 1796187600  # a multiple of 900: a window starts here
KEY = "unknown-tool:send_digest:send_digest"


def blocked(run: str, agent: str | None = "a", ts: float | str | None = BASE + 1, **fields) -> Verdict:
    base = dict(run_id=run, seq=1, tool_call_id="c", tool_name="send_digest", decision="block", level="critical")
    base |= dict(detector="unknown_tool_repeat", count=10, message=f"blocked in {run}", warning_key=KEY)
    return Verdict(**(base | fields), agent_id=agent, ts=ts)


def published(verdicts, **options):
    return list(incidents(verdicts, IncidentSettings(**options), clock=lambda: 0.0))


def test_fingerprint_is_the_warning_key_else_detector_and_tool():
    assert fingerprint(blocked("r")) == KEY
    abort = blocked("r", decision="abort", detector="compaction_loop_persisted", warning_key=None, tool_name="exec")
    assert fingerprint(abort) == "compaction_loop_persisted:exec"
    for decision in ("allow", "warn"):
        assert fingerprint(blocked("r", decision=decision)) is None


def test_event_time_reads_numbers_and_rfc3339_and_refuses_the_rest():
    assert event_time(BASE) == event_time("2026-12-02T05:00:00Z") == event_time("2026-12-02T06:00:00+01:00") == BASE
    assert event_time("2026-12-02T05:00:00") == BASE  # no offset: UTC
    assert event_time("2026-12-02T05:00:00.250Z") == BASE + 0.25
    for bad in (None, "yesterday", float("nan"), float("inf")):
        assert event_time(bad) is None


def test_an_incident_opens_at_min_runs_with_counts_samples_and_scope():
    agents = ["support", "billing", "triage"]
    verdicts = [blocked(f"r{n}", agents[n % 3], BASE + 10 * n) for n in range(5)]
    (incident,) = published(verdicts)
    assert (incident.status, incident.runs, incident.agents, incident.scope) == ("open", 5, 3, "fleet")
    assert incident.agent_ids == agents and incident.sample_run_ids == [f"r{n}" for n in range(5)]
    assert (incident.window_start, incident.window_end) == (BASE, BASE + 900)
    assert (incident.first_ts, incident.last_ts) == (BASE, BASE + 40)
    assert (incident.fingerprint, incident.detector, incident.tool_name) == (KEY, "unknown_tool_repeat", "send_digest")
    assert incident.message == "blocked in r0"


def test_an_incident_names_its_tenant_and_one_written_before_tenants_decodes_as_the_default_pair():
    verdicts = [blocked(f"r{n}") for n in range(5)]
    (default,) = published(verdicts)
    (acme,) = incidents(verdicts, IncidentSettings(), clock=lambda: 0.0, tenant="acme")
    assert (default.tenant, acme.tenant) == (None, "acme")
    assert msgspec.structs.replace(acme, tenant=None) == default
    older = msgspec.json.encode(default).replace(b',"tenant":null', b"")
    assert b"tenant" not in older and decode_incident(older) == default


def test_one_agents_runs_are_scope_agent_and_runs_without_agent_name_none():
    assert published([blocked(f"r{n}", "cron") for n in range(5)])[0].scope == "agent"
    nameless = published([blocked(f"r{n}", None) for n in range(5)])[0]
    assert (nameless.agents, nameless.agent_ids, nameless.scope) == (0, [], "fleet")


def test_samples_and_agent_ids_are_bounded_and_agents_counted_exactly():
    verdicts = [blocked(f"r{n}", f"agent-{n}") for n in range(40)]
    last = published(verdicts)[-1]
    assert (last.runs, last.agents) == (40, 40)
    assert last.agent_ids == [f"agent-{n}" for n in range(MAX_AGENT_IDS)]
    assert last.sample_run_ids == [f"r{n}" for n in range(MAX_SAMPLE_RUNS)]


def test_windows_are_tumbling_by_event_time_and_verdicts_without_ts_take_the_processing_time():
    early = [blocked(f"e{n}", ts=BASE + 899) for n in range(5)]  # the last second of the window
    late = [blocked(f"l{n}", ts="2026-12-02T05:15:00Z") for n in range(5)]  # the first of the next
    windows = [i.window_start for i in published(early + late)]
    assert windows == [BASE, BASE + 900]
    clockless = list(incidents([blocked(f"n{n}", ts=None) for n in range(5)], IncidentSettings(), lambda: BASE + 1000))
    assert clockless[0].window_start == BASE + 900 and clockless[0].first_ts == BASE + 1000


def test_a_closed_window_takes_no_more_verdicts():
    opening = [blocked(f"r{n}", ts=BASE) for n in range(4)]
    much_later = blocked("x", ts=BASE + 900 * 3)  # its window start is past BASE's end + lateness
    straggler = blocked("r4", ts=BASE + 5)
    assert published([*opening, much_later, straggler]) == []
    assert [i.runs for i in published([*opening, straggler, much_later])] == [5]


def test_lateness_keeps_the_previous_window_open():
    opening = [blocked(f"r{n}", ts=BASE) for n in range(4)]
    next_window = blocked("x", ts=BASE + 900 + 1)
    assert [i.window_start for i in published([*opening, next_window, blocked("r4", ts=BASE + 5)])] == [BASE]
    assert published([*opening, next_window, blocked("r4", ts=BASE + 5)], lateness=0) == []


def test_the_run_cap_stops_the_count_with_a_last_update():
    verdicts = [blocked(f"r{n}") for n in range(30)]
    assert [(i.status, i.runs) for i in published(verdicts, max_runs=12)] == [
        ("open", 5),
        ("update", 10),
        ("update", 12),
    ]


def test_settings_that_cannot_hold_are_refused():
    with pytest.raises(ValueError, match="run cap"):
        IncidentSettings(min_runs=5, max_runs=4)
    with pytest.raises(ValueError, match="positive"):
        IncidentSettings(window=0)


def test_the_tally_is_stored_as_bytes_the_runs_sweep_can_date():
    result = count(None, blocked("r0"), KEY, 1234.5, IncidentSettings())
    data = encode_tally(result.tally)
    assert decode_tally(data) == result.tally and touched_at(data) == 1234.5
    again = count(decode_tally(data), blocked("r0", seq=2), KEY, 2000.0, IncidentSettings())
    assert again.tally is None and again.incidents == []  # nothing to store


def expected_counts(distinct: int, min_runs: int, cap: int) -> list[int]:
    """5, 10, 20, ... up to what was counted, plus the cap when reached."""
    counted = min(distinct, cap)
    marks = []
    mark = min_runs
    while mark <= counted:
        marks.append(mark)
        mark *= 2
    if counted == cap and (not marks or marks[-1] != cap):
        marks.append(cap)
    return marks


@settings(max_examples=150, deadline=None)
@given(
    runs=st.lists(st.integers(0, 60), max_size=200),
    min_runs=st.integers(1, 8),
    extra_cap=st.integers(0, 40),
)
def test_publications_follow_distinct_runs_whatever_the_order_and_repeats(runs, min_runs, extra_cap):
    """Repeats of a run change nothing; incidents come at min_runs, each
    doubling, and the cap; open first, updates after."""
    cap = min_runs + extra_cap
    out = published([blocked(f"r{n}", f"agent-{n % 3}") for n in runs], min_runs=min_runs, max_runs=cap)
    assert [i.runs for i in out] == expected_counts(len(set(runs)), min_runs, cap)
    assert [i.status for i in out] == ["open"] + ["update"] * (len(out) - 1) if out else out == []
    firsts = list(dict.fromkeys(runs))  # distinct runs in the order they were counted
    for incident in out:
        counted = firsts[: incident.runs]
        assert incident.agents == len({n % 3 for n in counted})
        assert incident.sample_run_ids == [f"r{n}" for n in counted[:MAX_SAMPLE_RUNS]]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 4 * 900 - 1)), max_size=120))
def test_each_window_counts_its_own_runs(seen):
    """Verdicts spread over four windows, in order of time: each window's last
    publication counts the distinct runs that fell in it."""
    seen = sorted(seen, key=lambda pair: pair[1])
    out = published([blocked(f"r{run}", ts=BASE + at) for run, at in seen], min_runs=1)
    last = {i.window_start: i.runs for i in out}
    expected = {}
    for run, at in seen:
        expected.setdefault(BASE + at // 900 * 900, set()).add(run)
    assert last.keys() == expected.keys()
    for start, runs in expected.items():
        assert last[start] == expected_counts(len(runs), 1, 1000)[-1]
