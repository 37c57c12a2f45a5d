"""`loopwarden audit`: recompute the verdicts from the events topic and compare
them with what was published on the decision topic.

The auditor never joins a consumer group: it assigns partitions by hand
(`group_id=None`), reads a fixed range and commits nothing, so the live
workers' group, offsets and assignment are never touched.

Steps:

1. Snapshot the end offsets of the events topic; read every partition from the
   start point (`--from-beginning`, or the first record whose Kafka timestamp
   is at or after `--since`) to that snapshot.
2. Apply a fresh engine (`streams.engine.apply`, the worker's own code) with
   the given config to every run, in partition order, which is each run's
   order. The result is the verdict each `(run_id, seq)` should have.
3. Read the decision topic over the same period (from the start point minus a
   margin for clock skew, to its end, waiting up to `--wait` seconds for
   verdicts of the newest events) and compare, key by key:
   `missing` (recomputed, never published), `extra` (published, not
   recomputed), `different` (the fields that differ are named), and
   `conflict` (two different verdicts published for one key; identical
   re-deliveries are expected with at-least-once delivery and only counted).

Runs that started before the start point cannot be recomputed exactly: their
history, warning buckets and guard state are not in the window. A run is
taken as *whole* when its partition is read from offset 0, or when its first
event in the window has seq 0 (runs are numbered from 0, as the gateway
client does; `--first-seq 1` for gateways that number from 1). Other runs are *partial*: they are not compared, their
published verdicts are ignored, and the report says how many there were and
names the first few. `--from-beginning` on a topic whose oldest records were
deleted by retention gets the same treatment.

With a config other than the workers', the mismatches are exactly the
answer to "what would this config have decided?"; the report ends with a
summary of the differences (published -> recomputed decision, by detector).
"""

from __future__ import annotations

import collections
import json
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import msgspec

from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from schemas.events import ToolCall, ToolResult
from schemas.state import RunState
from schemas.topics import DECISIONS_TOPIC, EVENTS_TOPIC
from schemas.verdicts import Verdict
from schemas.codec import BadEvent, decode_event, decode_verdict
from streams.kafka.clients import PLAINTEXT, KafkaSecurity
from streams.kafka.reader import ReadError, Record, TopicReader, kafka_refusals
from streams.engine.entry import apply_safely
from streams.tools.progress import Tally, counted, plural


SKEW_MARGIN_MS = 60_000
"""Decisions are read from this long before the start point: a verdict's
timestamp is the worker's clock, an event's the gateway's."""

VERDICT_FIELDS: tuple[str, ...] = Verdict.__struct_fields__
Key = tuple[str, int]


class AuditError(ReadError):
    """The audit could not run: a bad --since, or a topic that could not be read."""


# --------------------------------------------------------------------------
# The start point
# --------------------------------------------------------------------------


def parse_since(text: str, now: float | None = None) -> int:
    """A start point in epoch milliseconds, from ISO 8601 (`2025-05-01T10:00:00Z`,
    naive means UTC), epoch seconds or milliseconds, or a duration ago
    (`90s`, `15m`, `2h`, `1d`)."""
    text = text.strip()
    now = time.time() if now is None else now
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])(?:\s*ago)?", text)
    if match:
        seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        return int((now - seconds) * 1000)
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        value = float(text)
        return int(value if value >= 1e11 else value * 1000)  # 1e11 s is the year 5138
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise AuditError(
            f"--since {text!r}: expected ISO 8601 (2025-05-01T10:00:00Z), epoch seconds/ms, or a duration like 15m"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def format_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# --------------------------------------------------------------------------
# Recomputing
# --------------------------------------------------------------------------


@dataclass
class Recomputed:
    expected: dict[Key, Verdict] = field(default_factory=dict)
    runs: set[str] = field(default_factory=set)
    partial: dict[str, int] = field(default_factory=dict)
    """Runs not recomputed -> the seq of their first event in the window."""
    events: int = 0
    refused: list[str] = field(default_factory=list)
    tools: dict[Key, str] = field(default_factory=dict)


def recompute(
    records: Iterable[Record],
    config: FleetConfig,
    whole_partitions: set[int],
    first_seq: int = 0,
    policy: FleetPolicy | None = None,
) -> Recomputed:
    """Apply a fresh engine to each whole run; set aside the partial ones (a
    run in a partition not read from offset 0 whose first event in the
    window has a seq above `first_seq`)."""
    out = Recomputed()
    states: dict[str, RunState] = {}
    for record in records:
        out.events += 1
        try:
            event = decode_event(record.value)
        except BadEvent as exc:
            out.refused.append(f"partition {record.partition} offset {record.offset}: {exc}")
            continue
        run_id = event.run_id
        if run_id in out.partial:
            continue
        if run_id not in out.runs:
            if record.partition not in whole_partitions and event.seq > first_seq:
                out.partial[run_id] = event.seq
                continue
            out.runs.add(run_id)
        try:
            outcome = apply_safely(states.get(run_id), event, config, policy)
        except BadEvent as exc:
            out.refused.append(f"partition {record.partition} offset {record.offset}: {exc}")
            continue
        states[run_id] = outcome.state
        if isinstance(event, (ToolCall, ToolResult)) and not outcome.duplicate:
            out.tools[(run_id, event.seq)] = event.tool_name
        for verdict in outcome.verdicts:
            out.expected[(verdict.run_id, verdict.seq)] = verdict
    return out


# --------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------


@dataclass
class Published:
    verdicts: dict[Key, list[Verdict]] = field(default_factory=dict)
    deliveries: int = 0
    duplicates: int = 0
    unreadable: list[str] = field(default_factory=list)

    def add(self, verdict: Verdict) -> None:
        self.deliveries += 1
        seen = self.verdicts.setdefault((verdict.run_id, verdict.seq), [])
        if verdict in seen:
            self.duplicates += 1
        else:
            seen.append(verdict)


@dataclass
class Mismatch:
    kind: str  # missing | extra | different | conflict
    run_id: str
    seq: int
    tool_name: str
    recomputed: Verdict | None
    published: list[Verdict]
    fields: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "run_id": self.run_id,
            "seq": self.seq,
            "tool_name": self.tool_name,
            "fields": self.fields,
            "recomputed": msgspec.to_builtins(self.recomputed),
            "published": msgspec.to_builtins(self.published),
        }


def differing_fields(a: Verdict, b: Verdict) -> list[str]:
    return [name for name in VERDICT_FIELDS if getattr(a, name) != getattr(b, name)]


def compare(expected: dict[Key, Verdict], published: dict[Key, list[Verdict]]) -> list[Mismatch]:
    """Every difference, ordered by run then seq."""
    out: list[Mismatch] = []
    for key in expected.keys() | published.keys():
        want = expected.get(key)
        got = published.get(key, [])
        tool = (want or got[0]).tool_name
        if want is None:
            out.append(Mismatch("extra", key[0], key[1], tool, None, got, []))
        elif not got:
            out.append(Mismatch("missing", key[0], key[1], tool, want, [], []))
        elif len(got) > 1:
            fields = sorted({f for v in got for f in differing_fields(want, v)}, key=VERDICT_FIELDS.index)
            out.append(Mismatch("conflict", key[0], key[1], tool, want, got, fields))
        elif got[0] != want:
            out.append(Mismatch("different", key[0], key[1], tool, want, got, differing_fields(want, got[0])))
    out.sort(key=lambda m: (m.run_id, m.seq))
    return out


# --------------------------------------------------------------------------
# The audit
# --------------------------------------------------------------------------


@dataclass
class AuditReport:
    window: str
    events_topic: str
    decisions_topic: str
    recomputed: Recomputed
    published: Published
    mismatches: list[Mismatch]
    waited: float = 0.0
    run_filter: str | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.published.unreadable

    def transitions(self) -> collections.Counter[tuple[str, str, str]]:
        """(published decision, recomputed decision, detector) -> count."""
        counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        for m in self.mismatches:
            before = m.published[0].decision if m.published else "(none)"
            after = m.recomputed.decision if m.recomputed else "(none)"
            detector = (m.recomputed or m.published[0]).detector or "-"
            if m.recomputed and m.published and m.published[0].detector != m.recomputed.detector:
                detector = f"{m.published[0].detector or '-'} -> {m.recomputed.detector or '-'}"
            counts[(before, after, detector)] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        kinds = collections.Counter(m.kind for m in self.mismatches)
        return {
            "ok": self.ok,
            "window": self.window,
            "events_topic": self.events_topic,
            "decisions_topic": self.decisions_topic,
            "run": self.run_filter,
            "events_read": self.recomputed.events,
            "refused": self.recomputed.refused,
            "runs_recomputed": len(self.recomputed.runs),
            "runs_partial": dict(sorted(self.recomputed.partial.items())),
            "verdicts_recomputed": len(self.recomputed.expected),
            "verdicts_published": sum(len(v) for v in self.published.verdicts.values()),
            "duplicate_deliveries": self.published.duplicates,
            "unreadable_verdicts": self.published.unreadable,
            "mismatches_by_kind": dict(sorted(kinds.items())),
            "mismatches": [m.to_json() for m in self.mismatches],
            "differences": [
                {"published": a, "recomputed": b, "detector": d, "count": n}
                for (a, b, d), n in sorted(self.transitions().items())
            ],
        }


def _key_filter(run_id: str | None) -> bytes | None:
    return run_id.encode() if run_id is not None else None


def run_audit(
    bootstrap: str,
    config: FleetConfig,
    *,
    since_ms: int | None = None,
    run_id: str | None = None,
    events_topic: str = EVENTS_TOPIC,
    decisions_topic: str = DECISIONS_TOPIC,
    wait: float = 5.0,
    first_seq: int = 0,
    policy: FleetPolicy | None = None,
    security: KafkaSecurity = PLAINTEXT,
    err: TextIO | None = None,
) -> AuditReport:
    """Recompute and compare; `since_ms=None` means from the beginning. With
    `err` a terminal, the events read are counted on a progress bar there."""
    with TopicReader(bootstrap, "loopwarden-audit", security) as reader:
        event_tps = reader.partitions(events_topic)
        decision_tps = reader.partitions(decisions_topic)
        ends = reader.ends(event_tps)
        starts = reader.starts(event_tps, since_ms)
        whole = {tp.partition for tp in event_tps if starts[tp] == 0}
        key = _key_filter(run_id)
        records = reader.read(starts, ends, key)
        if err is not None:
            records = counted(records, err, sum(ends[tp] - starts[tp] for tp in event_tps), "event")
        recomputed = recompute(records, config, whole, first_seq, policy)

        # Decisions: same period, from a margin before the start point to the
        # end, then up to `wait` seconds more for verdicts still missing.
        published = Published()
        d_starts = reader.starts(decision_tps, None if since_ms is None else since_ms - SKEW_MARGIN_MS)
        in_scope = _scope(recomputed, since_ms is None and len(whole) == len(event_tps))

        def take(records: Iterable[Record]) -> None:
            for record in records:
                try:
                    verdict = decode_verdict(record.value)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    if key is None or record.key == key:
                        published.unreadable.append(f"partition {record.partition} offset {record.offset}: {exc}")
                    continue
                if in_scope(verdict):
                    published.add(verdict)

        d_ends = reader.ends(decision_tps)
        take(reader.read(d_starts, d_ends, key))
        started = time.monotonic()
        waited = 0.0
        while wait > 0 and not recomputed.expected.keys() <= published.verdicts.keys():
            waited = time.monotonic() - started
            if waited >= wait:
                break
            time.sleep(min(0.5, wait - waited))
            new_ends = reader.ends(decision_tps)
            take(reader.read(d_ends, new_ends, key))
            d_ends = new_ends
        mismatches = compare(recomputed.expected, published.verdicts)
    window = "from the beginning" if since_ms is None else f"since {format_ms(since_ms)}"
    return AuditReport(
        window, events_topic, decisions_topic, recomputed, published, mismatches, round(waited, 1), run_id
    )


def _scope(recomputed: Recomputed, everything_read: bool):
    """Which published verdicts are compared: those of recomputed runs; and,
    when every partition was read from offset 0, those of runs never seen
    (extra). Verdicts of partial runs, or of runs whose events all precede
    the window, are not compared."""

    def in_scope(verdict: Verdict) -> bool:
        if verdict.run_id in recomputed.runs:
            return True
        if verdict.run_id in recomputed.partial:
            return False
        return everything_read

    return in_scope


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def _short(v: Verdict) -> str:
    text = v.decision
    if v.detector:
        text += f" {v.detector}"
    if v.count:
        text += f" count={v.count}"
    return text


def _field_change(name: str, a: Any, b: Any) -> str:
    if name == "message":
        return "message differs"
    return f"{name} {json.dumps(b)} -> {json.dumps(a)}"


def format_report(report: AuditReport, *, list_mismatches: bool = True, max_partial: int = 10) -> str:
    r = report.recomputed
    p = report.published
    lines = [
        f"audit {report.window}: events {report.events_topic}, decisions {report.decisions_topic}"
        + (f", run {report.run_filter}" if report.run_filter else ""),
        f"  events read: {r.events} in {len(r.runs) + len(r.partial)} runs"
        + (f" ({len(r.refused)} malformed, belong on the dead-letter topic)" if r.refused else ""),
        f"  recomputed: {len(r.expected)} verdicts for {len(r.runs)} runs",
        f"  published:  {sum(len(v) for v in p.verdicts.values())} verdicts in scope"
        + (f" (+{p.duplicates} identical re-deliveries)" if p.duplicates else "")
        + (f", waited {report.waited:g}s for late ones" if report.waited else ""),
    ]
    if r.partial:
        names = ", ".join(f"{run} (first seq {seq})" for run, seq in sorted(r.partial.items())[:max_partial])
        more = f", and {len(r.partial) - max_partial} more" if len(r.partial) > max_partial else ""
        lines.append(
            f"  warning: {len(r.partial)} runs started before the start point and were not compared: {names}{more}"
        )
    for problem in r.refused[:max_partial]:
        lines.append(f"  malformed event: {problem}")
    for problem in p.unreadable:
        lines.append(f"  UNREADABLE verdict: {problem}")
    if list_mismatches:
        for m in report.mismatches:
            head = f"{m.kind.upper():9} run={m.run_id} seq={m.seq} {m.tool_name}:"
            if m.kind == "missing":
                assert m.recomputed is not None
                lines.append(f"{head} recomputed {_short(m.recomputed)}, nothing published")
            elif m.kind == "extra":
                lines.append(f"{head} published {_short(m.published[0])}, nothing recomputed")
            elif m.kind == "different":
                assert m.recomputed is not None
                got = m.published[0]
                changes = "; ".join(_field_change(f, getattr(m.recomputed, f), getattr(got, f)) for f in m.fields)
                lines.append(f"{head} published {_short(got)} / recomputed {_short(m.recomputed)} [{changes}]")
            else:
                variants = " | ".join(_short(v) for v in m.published)
                assert m.recomputed is not None
                lines.append(
                    f"{head} {len(m.published)} different verdicts published ({variants}); recomputed {_short(m.recomputed)}"
                )
    if report.ok:
        lines.append(f"OK: all {len(r.expected)} recomputed verdicts match what was published")
        return "\n".join(lines) + "\n"
    kinds = collections.Counter(m.kind for m in report.mismatches)
    runs = len({m.run_id for m in report.mismatches})
    detail = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    lines.append(f"MISMATCH: {len(report.mismatches)} verdicts differ ({detail}) in {runs} runs")
    lines.extend(_difference_summary(report))
    return "\n".join(lines) + "\n"


DECISIONS = ("allow", "warn", "block", "abort")


def _difference_summary(report: AuditReport) -> list[str]:
    """What the recomputing config decides differently, in three small tables."""
    published = collections.Counter(v[0].decision for v in report.published.verdicts.values() if v)
    recomputed = collections.Counter(v.decision for v in report.recomputed.expected.values())
    lines = ["  decisions      published  recomputed"]
    for d in DECISIONS:
        if published[d] or recomputed[d]:
            lines.append(f"    {d:<12} {published[d]:>9}  {recomputed[d]:>10}")
    changes: collections.Counter[tuple[str, str]] = collections.Counter()
    detectors: collections.Counter[tuple[str, str]] = collections.Counter()
    conflicts = 0
    for m in report.mismatches:
        if m.kind == "conflict":
            conflicts += 1  # listed one by one above; the first published may well be right
            continue
        before = m.published[0] if m.published else None
        after = m.recomputed
        changes[(before.decision if before else "(none)", after.decision if after else "(none)")] += 1
        b = (before.detector or "-") if before else "(none)"
        a = (after.detector or "-") if after else "(none)"
        if b != a:
            detectors[(b, a)] += 1
    lines.append("  decision changes (published -> recomputed)")
    for (b, a), n in sorted(changes.items(), key=lambda kv: (-kv[1], kv[0])):
        note = "  (same decision; count, level, key or message differ)" if a == b else ""
        lines.append(f"    {b:>6} -> {a:<8} {n:>5}{note}")
    if conflicts:
        lines.append(f"    {conflicts} keys with conflicting published verdicts (see CONFLICT above)")
    if detectors:
        lines.append("  detector changes (published -> recomputed; - = none fired)")
        for (b, a), n in sorted(detectors.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"    {b:>24} -> {a:<24} {n:>5}")
    return lines


def main(args: Any, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The `loopwarden audit` command (argparse namespace from streams.cli)."""
    from schemas.configfile import load_for_cli

    out = out or sys.stdout
    err = err or sys.stderr
    tally = Tally()
    config, policy = load_for_cli(args.config, args.policy, err)
    try:
        since_ms = None if args.start == "earliest" else parse_since("0s" if args.start == "latest" else args.start)
        with kafka_refusals():
            report = run_audit(
                args.bootstrap,
                config,
                since_ms=since_ms,
                run_id=args.run_filter,
                events_topic=args.events_topic,
                decisions_topic=args.decisions_topic,
                wait=args.wait,
                first_seq=args.first_seq,
                policy=policy,
                security=args.security,
                err=err,
            )
    except ReadError as exc:
        print(f"loopwarden: {exc}", file=err)
        return 2
    if args.json:
        out.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        out.write(format_report(report, list_mismatches=not args.summary_only))
    out.flush()
    recomputed = report.recomputed
    tally.events, tally.dead_letters = recomputed.events, len(recomputed.refused)
    tally.decisions.update(verdict.decision for verdict in recomputed.expected.values())
    print(
        tally.summary("audit", *tally.decided("recomputed"), plural(len(report.mismatches), "mismatch", "mismatches")),
        file=err,
    )
    return 0 if report.ok else 1
