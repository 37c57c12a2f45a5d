"""The fleet stage (`loopwarden fleet`) through the real broker, behind a real
worker: it publishes exactly what `loopwarden incidents` prints, across a restart."""

from __future__ import annotations

import signal
from pathlib import Path

import msgspec
import pytest

from builders import run_cli, unknown_tool_blocks
from evidence import kept_dir, kept_on_failure
from helpers import FleetStage, Worker, consume, dedupe_key, incidents_until, names, produce
from schemas.codec import decode_incident, decode_tally, decode_verdict
from streams.fleet.incidents import fingerprint
from streams.kafka.topics import Topics
from schemas.topics import tenant_topics
from streams.kafka import clients as kafka_clients
from streams.kafka.topics import ensure, ensure_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet-trace.jsonl"
CONFIG = ROOT / "examples" / "loopwarden.json5"


@pytest.mark.parametrize(
    ("stop", "commit_interval"),
    [(signal.SIGTERM, "2.8s"), (signal.SIGKILL, "2.8s"), (signal.SIGKILL, "1h")],
    ids=["stopped", "killed", "killed-uncommitted"],
)
def test_the_stage_publishes_what_the_offline_command_prints_across_a_restart(
    broker, tmp_path, stop, commit_interval, request
):
    """Events and decisions on one partition each, so the stage sees the
    verdicts in the order they were decided (see docs/FLEET.md): then every
    record, samples included, is the offline one. The stage is stopped (or
    killed) half-way through the trace and started again on the same data dir.

    Killed-uncommitted: killed before its first offset commit, so it restarts
    with its tallies to recover from the changelog (RocksDB keeps no
    write-ahead log) and no committed offset on any partition: the state the
    killed stage was in whenever this test's restart counted nothing more."""
    offline = run_cli("--config", str(CONFIG), str(FLEET), command="incidents")
    assert offline.returncode == 0, offline.stderr
    expected = offline.stdout.splitlines()
    scopes = {decode_incident(line).scope for line in expected}
    assert len(expected) == 4 and scopes == {"fleet", "agent"}  # the trace has both kinds
    topics = names("fleet")
    regroup = f"{topics['app_id']}-fleet-fingerprint-repartition"
    changelog = f"{topics['app_id']}-fleet-incidents-changelog"
    with kept_on_failure(
        lambda: kept_dir(request.node.nodeid),
        broker.bootstrap,
        logs=[tmp_path / "worker.log", tmp_path / "fleet.log"],
        topics=[topics["events"], topics["decisions"], regroup, changelog, topics["incidents"]],
        groups=[topics["app_id"], f"{topics['app_id']}-fleet"],
        contents={regroup: describe_verdict, changelog: describe_tally, topics["incidents"]: describe_incident},
    ):
        across_a_restart(broker, tmp_path, stop, commit_interval, topics, expected, FLEET.read_bytes().splitlines())


def across_a_restart(
    broker, tmp_path, stop: int, commit_interval: str, topics: dict[str, str], expected: list[bytes], lines: list[bytes]
):
    """The scenario and its checks, inside the test's `kept_on_failure`."""
    regroup = f"{topics['app_id']}-fleet-fingerprint-repartition"
    group = f"{topics['app_id']}-fleet"
    with Worker(broker.bootstrap, topics, tmp_path, "worker", config=CONFIG, partitions=1) as worker:
        worker.wait_assigned()
        # Faust's own steps (recovery, seek, flow) in the log a failure keeps.
        faust_log = ["--faust-loglevel", "info"]
        stage = FleetStage(
            broker.bootstrap, topics, tmp_path, "fleet", extra=["--commit-interval", commit_interval, *faust_log]
        )
        stage.start()
        try:
            produce(broker.bootstrap, topics["decisions"], [b"not a verdict"], keys=[b"r"])  # skipped, logged
            produce(broker.bootstrap, topics["events"], lines[:600])
            before = incidents_until(broker.bootstrap, topics["incidents"], {dedupe_key(x) for x in expected[:2]}, 90)
            assert stage.stop(stop) == (0 if stop == signal.SIGTERM else -stop), stage.log()[-3000:]
            if commit_interval == "1h":
                with kafka_clients.admin(broker.bootstrap) as admin:
                    assert admin.list_group_offsets({group: None})[group] == {}  # nothing committed
            produce(broker.bootstrap, topics["events"], lines[600:])
            stage = FleetStage(broker.bootstrap, topics, tmp_path, "fleet", extra=faust_log).start()
            records = incidents_until(broker.bootstrap, topics["incidents"], {dedupe_key(x) for x in expected}, 120)
        finally:
            stage.stop()
    assert before and set(before) <= set(expected), stage.log()[-4000:]
    by_key: dict[tuple, set[bytes]] = {}
    for record in records:
        by_key.setdefault(dedupe_key(record), set()).add(record)
    assert all(len(same) == 1 for same in by_key.values()), "a re-published record differs"
    assert sorted(record for (record,) in by_key.values()) == sorted(expected), stage.log()[-4000:]
    assert stage.lines("bad_verdict")[0]["error"].startswith("JSON is malformed")
    # only blocks and aborts were regrouped, each under its fingerprint
    replayed = run_cli("--config", str(CONFIG), str(FLEET)).stdout.splitlines()
    counted = {(v.run_id, v.seq) for v in map(decode_verdict, replayed) if fingerprint(v)}
    regrouped = consume(broker.bootstrap, regroup, count=10**6, timeout=5)
    assert {r.key.decode() for r in regrouped} == {decode_incident(x).fingerprint for x in expected}
    assert all(fingerprint(decode_verdict(r.value)) == r.key.decode() for r in regrouped)
    assert {(v.run_id, v.seq) for v in (decode_verdict(r.value) for r in regrouped)} == counted
    # each start said when its partitions were assigned and when it took verdicts again
    for event in ("assigned", "ready"):
        steps = stage.lines(event)
        assert len(steps) >= 2 and {line["topic"] for line in steps} == {regroup}, stage.log()[-4000:]
        assert steps[-1]["partitions"] == "0,1,2"
    opened = {line["fingerprint"] for line in stage.lines("incident_open")}
    assert opened == {decode_incident(x).fingerprint for x in expected}  # one operator line each


def test_each_tenant_is_counted_apart_and_published_as_the_offline_command_prints_it(broker, tmp_path):
    """The same verdicts (same run ids, same fingerprints) on the stage's own
    decisions topic, on tenant A's found at start-up and on tenant B's made
    while the stage runs: three sets of incidents, none merged, each what
    `loopwarden incidents [--tenant NAME]` prints."""
    verdicts = run_cli("--config", str(CONFIG), str(FLEET)).stdout.splitlines()
    tag = names("fleet")["app_id"].removeprefix("fleet-")
    first, later = f"a-{tag}", f"b-{tag}"
    expected: dict[str | None, list[bytes]] = {}
    for tenant in (None, first, later):
        option = ("--tenant", tenant) if tenant else ()
        expected[tenant] = run_cli(
            *option, "--config", str(CONFIG), str(FLEET), command="incidents"
        ).stdout.splitlines()
        assert len(expected[tenant]) == 4 and {decode_incident(x).tenant for x in expected[tenant]} == {tenant}
    topics = names("fleet")
    ensure_topics(broker.bootstrap, Topics(topics["events"], topics["decisions"], topics["deadletter"], partitions=1))
    make_tenant_topics(broker.bootstrap, first)
    with FleetStage(broker.bootstrap, topics, tmp_path, "fleet", extra=["--tenant-refresh", "1s"]) as stage:

        def served() -> set[str]:
            return {line["tenant"] for line in stage.lines("tenant_added")}

        stage.wait_for(lambda: stage.lines("ready"), 90, "the stage taking verdicts")
        assert first in served()  # found at start-up
        make_tenant_topics(broker.bootstrap, later)
        stage.wait_for(lambda: later in served(), 60, "the later tenant")
        produce(broker.bootstrap, topics["decisions"], verdicts)
        produce(broker.bootstrap, tenant_topics(first)[1], verdicts)
        produce(broker.bootstrap, tenant_topics(later)[1], verdicts)
        wanted = {dedupe_key(x) for lines in expected.values() for x in lines}
        records = incidents_until(broker.bootstrap, topics["incidents"], wanted, 120)
    published: dict[str | None, set[bytes]] = {}
    for record in records:
        published.setdefault(decode_incident(record).tenant, set()).add(record)
    # The stage serves every tenant on the broker, and other tests of this session leave theirs on it:
    # only this test's tenants are compared.
    mine = {tenant: found for tenant, found in published.items() if tenant in expected}
    assert mine == {tenant: set(lines) for tenant, lines in expected.items()}, stage.log()[-4000:]
    assert {"-", first, later} <= {line["tenant"] for line in stage.lines("incident_open")}


def describe_verdict(key: bytes | None, value: bytes | None) -> str:
    verdict = decode_verdict(value or b"")
    return f"{(key or b'').decode(errors='replace')} run={verdict.run_id} seq={verdict.seq} {verdict.decision}"


def describe_tally(key: bytes | None, value: bytes | None) -> str:
    shown = "tombstone" if value is None else msgspec.json.encode(decode_tally(value)).decode()
    return f"{(key or b'').decode(errors='replace')} {shown}"


def describe_incident(key: bytes | None, value: bytes | None) -> str:
    return (value or b"").decode(errors="replace")


def make_tenant_topics(bootstrap: str, tenant: str) -> None:
    """A tenant's topic pair, one partition each (what `tenants add` makes, without its ACLs)."""
    ensure(bootstrap, [(topic, 1, {}) for topic in tenant_topics(tenant)], 1)


def test_an_idle_fingerprint_is_forgotten_after_the_ttl(broker, tmp_path):
    """Verdicts published straight to the decision topic; once the sweep has
    deleted the fingerprint's tally, the same runs open a new incident."""
    topics = names("sweep")
    lines = unknown_tool_blocks(2)
    ensure_topics(broker.bootstrap, Topics(topics["events"], topics["decisions"], topics["deadletter"], partitions=1))
    options = ["--window", "1s", "--lateness", "0s", "--ttl", "2s", "--min-runs", "2"]
    with FleetStage(broker.bootstrap, topics, tmp_path, "fleet", partitions=1, extra=options) as stage:
        produce(broker.bootstrap, topics["decisions"], lines)
        stage.wait_for(lambda: stage.lines("incident_open"), 60, "the first incident")
        stage.wait_for(lambda: stage.lines("swept"), 30, "the sweep")
        produce(broker.bootstrap, topics["decisions"], lines)
        stage.wait_for(lambda: len(stage.lines("incident_open")) == 2, 30, "the incident opened again")
    assert stage.lines("swept")[0]["fingerprints"] == "1"
    # The table's changelog is made with the stage's other topics, before Faust subscribes.
    created = {line["topic"]: line["partitions"] for line in stage.lines("topic_created")}
    assert created == {
        f"{topics['app_id']}-fleet-fingerprint-repartition": "1",
        topics["incidents"]: "1",
        f"{topics['app_id']}-fleet-incidents-changelog": "1",
    }


def test_a_missing_decision_topic_stops_the_stage_at_start_up(broker, tmp_path):
    topics = names("nodecisions")
    with FleetStage(broker.bootstrap, topics, tmp_path, "fleet") as stage:
        assert stage.proc.wait(60) == 1
    (failed,) = stage.lines("startup_failed")
    assert failed["msg"] == (
        f"topic {topics['decisions']} does not exist: create it with `loopwarden topics create --bootstrap {broker.bootstrap}`"
    )
    assert stage.lines("topic_created") == []  # nothing made for a stage that cannot run
