"""Creating the project's topics (events, decisions, dead-letter; and the
fleet stage's own).

Used by ``loopwarden topics create`` and the secure broker's set-up (which
create the incident topic too), by the worker and the fleet stage at
start-up and by ``loopwarden up``. Uses kafka-python's admin client (no Faust). A topic that
already exists is left as it is; its partition count is reported, because the
worker sizes its table (and the table's changelog) from the events topic that
really exists.

Unless a replication factor is given, it follows the cluster (``replication``):
three replicas once there are three brokers, with ``min.insync.replicas=2``,
so that a write acknowledged by all in-sync replicas (``acks=all``) survives
the loss of any one broker, and one broker down stops no producer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from schemas.topics import DEADLETTER_TOPIC, DECISIONS_TOPIC, EVENTS_TOPIC, INCIDENTS_TOPIC
from streams.kafka import clients as kafka_clients
from streams.kafka.clients import PLAINTEXT, KafkaSecurity, not_authorized
from streams.kafka.options import DEFAULT_BOOTSTRAP

log = logging.getLogger("loopwarden.topics")

#: Partitions of the events topic unless told otherwise: the worker's unit of scale.
DEFAULT_PARTITIONS = 12


@dataclass(frozen=True)
class Topics:
    """Names and partition counts of the three topics the project owns."""

    events: str = EVENTS_TOPIC
    decisions: str = DECISIONS_TOPIC
    deadletter: str = DEADLETTER_TOPIC
    partitions: int = DEFAULT_PARTITIONS
    decisions_partitions: int | None = None  # None: same as the events topic
    deadletter_partitions: int | None = None  # None: same as the events topic
    replication_factor: int | None = None  # None: from the cluster (streams.kafka.topics.replication)

    def plan(self) -> list[tuple[str, int]]:
        """(name, partitions) of each topic, events first."""
        return [
            (self.events, self.partitions),
            (self.decisions, self.decisions_partitions or self.partitions),
            (self.deadletter, self.deadletter_partitions or self.partitions),
        ]


#: Seconds an admin request (create, list, describe) may take.
ADMIN_TIMEOUT = 30.0

TOPIC_AUTHORIZATION_FAILED = 29
TOPIC_ALREADY_EXISTS = 36

#: Per-topic configs. The dead-letter topic keeps refused events longer, so an
#: operator has time to look at them.
#: A dead letter is the refused event unchanged plus headers, so it may be
#: a little larger than the largest event the events topic accepted.
TOPIC_CONFIGS: dict[str, dict[str, str]] = {
    "deadletter": {"retention.ms": str(14 * 24 * 3600 * 1000), "max.message.bytes": str(4 * 1024 * 1024)},
}


class TopicError(RuntimeError):
    """A topic could not be created or described."""


def missing_topic(topic: str, bootstrap: str) -> str:
    """How every command says that a topic it needs is not there, and which command creates it."""
    where = "" if bootstrap == DEFAULT_BOOTSTRAP else f" --bootstrap {bootstrap}"
    return f"topic {topic} does not exist: create it with `loopwarden topics create{where}`"


def require_topic(bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT) -> int:
    """The partition count of `topic`; TopicError (`missing_topic`) when there is no such topic."""
    found = describe_partitions(bootstrap, [topic], security=security)
    if topic not in found:
        raise TopicError(missing_topic(topic, bootstrap))
    return found[topic]


class TopicNotAuthorized(TopicError):
    """The principal may not describe a topic (the ACLs refuse it)."""


@dataclass(frozen=True)
class TopicState:
    name: str
    partitions: int
    created: bool
    replicas: int = 1

    def describe(self) -> str:
        """`12 partitions`, and the replicas when there are more than one: `12 partitions, 3 replicas`."""
        replicas = f", {self.replicas} replicas" if self.replicas > 1 else ""
        return f"{self.partitions} partitions{replicas}"


def admin_client(bootstrap: str, timeout: float = ADMIN_TIMEOUT, security: KafkaSecurity = PLAINTEXT):
    ms = int(timeout * 1000)
    return kafka_clients.admin(
        bootstrap,
        security=security,
        client_id="loopwarden-admin",
        request_timeout_ms=ms,
        bootstrap_timeout_ms=ms,
    )


def connected_admin(bootstrap: str, timeout: float, security: KafkaSecurity):
    """An admin client, or TopicError when the brokers cannot be reached."""
    try:
        return admin_client(bootstrap, timeout, security)
    except Exception as exc:
        raise TopicError(f"cannot reach Kafka at {bootstrap}: {kafka_clients.describe_error(exc)}") from None


#: Replicas of a topic on a cluster large enough: one broker may be lost
#: (and another be restarted meanwhile) without losing an acknowledged write.
REPLICAS = 3
#: In-sync replicas a write needs with three replicas: one broker down still takes writes.
MIN_INSYNC_REPLICAS = 2


def replication_factor(brokers: int) -> int:
    """The replication factor topics get on a cluster of `brokers`: one per
    broker, up to `REPLICAS`."""
    return max(1, min(REPLICAS, brokers))


def replication_configs(factor: int) -> dict[str, str]:
    """The topic configs that go with `factor` replicas: `min.insync.replicas`
    once there are `REPLICAS` (below that the broker's default, 1)."""
    return {"min.insync.replicas": str(MIN_INSYNC_REPLICAS)} if factor >= REPLICAS else {}


def broker_count(admin) -> int:
    """Brokers in the cluster metadata (those up now)."""
    return len(admin.describe_cluster().get("brokers", []))


def replication(
    bootstrap: str, requested: int | None, *, timeout: float = ADMIN_TIMEOUT, security: KafkaSecurity = PLAINTEXT
) -> int:
    """`requested` if given (an explicit --replication-factor wins), else the
    factor for the brokers the cluster metadata lists now."""
    if requested is not None:
        return requested
    admin = connected_admin(bootstrap, timeout, security)
    try:
        return replication_factor(broker_count(admin))
    except Exception as exc:
        raise TopicError(f"cannot read the brokers of {bootstrap}: {kafka_clients.describe_error(exc)}") from None
    finally:
        admin.close()


def partitions_of(admin, names: Iterable[str], security: KafkaSecurity = PLAINTEXT) -> dict[str, int]:
    """Partition counts of the topics that exist (missing ones are left out);
    TopicError for a topic the principal may not describe, which the broker
    reports whether it exists or not."""
    return {name: partitions for name, (partitions, _) in _shapes(admin, names, security).items()}


def _shapes(admin, names: Iterable[str], security: KafkaSecurity) -> dict[str, tuple[int, int]]:
    """`partitions_of`, with each topic's replica count beside its partition count."""
    found: dict[str, tuple[int, int]] = {}
    for topic in admin.describe_topics(list(names)):
        if topic.get("error_code") == TOPIC_AUTHORIZATION_FAILED:
            raise TopicNotAuthorized(not_authorized(f"describe topic {topic['name']}", security))
        if topic.get("error_code", 0) == 0 and topic.get("partitions"):
            parts = topic["partitions"]
            found[topic["name"]] = (len(parts), max(len(part["replica_nodes"]) for part in parts))
    return found


def ensure_topics(
    bootstrap: str, topics: Topics, *, timeout: float = ADMIN_TIMEOUT, security: KafkaSecurity = PLAINTEXT
) -> list[TopicState]:
    """Create whichever of the three topics are missing; describe them all."""
    plan = topics.plan()
    kinds = dict(zip((name for name, _ in plan), ("events", "decisions", "deadletter"), strict=True))
    states = ensure(
        bootstrap,
        [(name, partitions, TOPIC_CONFIGS.get(kinds[name], {})) for name, partitions in plan],
        topics.replication_factor,
        timeout=timeout,
        security=security,
    )
    for state, (_, partitions) in zip(states, plan, strict=True):
        if not state.created and state.partitions != partitions and kinds[state.name] == "events":
            log.info(
                "events topic already exists with another partition count",
                extra={"fields": {"topic": state.name, "partitions": state.partitions, "requested": partitions}},
            )
    return states


def ensure_project_topics(
    bootstrap: str,
    topics: Topics,
    *,
    incidents_topic: str = INCIDENTS_TOPIC,
    incidents_partitions: int | None = None,
    timeout: float = ADMIN_TIMEOUT,
    security: KafkaSecurity = PLAINTEXT,
) -> list[TopicState]:
    """The three topics and the fleet stage's output (`incidents_partitions`,
    by default as many as the events topic): what an admin creates before
    anything runs, so that no role needs Create on a topic other clients read."""
    states = ensure_topics(bootstrap, topics, timeout=timeout, security=security)
    incidents = (incidents_topic, incidents_partitions or topics.partitions, {})
    return states + ensure(bootstrap, [incidents], topics.replication_factor, timeout=timeout, security=security)


def _visible(admin, names: list[str], timeout: float, security: KafkaSecurity) -> dict[str, tuple[int, int]]:
    """`_shapes` of topics just created, once every one shows (or `timeout`
    has passed): on a cluster each broker learns of a new topic on its own
    time, and the admin client may ask one that has not yet."""
    deadline = time.monotonic() + timeout
    while len(found := _shapes(admin, names, security)) < len(names) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def ensure(
    bootstrap: str,
    plan: list[tuple[str, int, dict[str, str]]],
    replicas: int | None,
    *,
    timeout: float = ADMIN_TIMEOUT,
    security: KafkaSecurity = PLAINTEXT,
) -> list[TopicState]:
    """Create whichever topics of `plan` (name, partitions, configs) are
    missing, with `replicas` (None: as many as the cluster's brokers, up to
    3, `replication_factor`) and the configs that go with them; describe them
    all, in the plan's order."""
    admin = connected_admin(bootstrap, timeout, security)
    try:
        existing = _shapes(admin, [name for name, _, _ in plan], security)
        missing_names = [name for name, _, _ in plan if name not in existing]
        factor = replicas or (replication_factor(broker_count(admin)) if missing_names else 1)
        missing = {
            name: {
                "num_partitions": partitions,
                "replication_factor": factor,
                "configs": {**replication_configs(factor), **configs},
            }
            for name, partitions, configs in plan
            if name in missing_names
        }
        created: set[str] = set()
        if missing:
            result = admin.create_topics(missing, timeout_ms=int(timeout * 1000), raise_errors=False)
            for entry in result.get("topics", []):
                code = entry.get("error_code", 0)
                if code == 0:
                    created.add(entry["name"])
                elif code != TOPIC_ALREADY_EXISTS:  # lost a race with another creator: fine
                    message = entry.get("error_message") or f"error code {code}"
                    raise TopicError(f"cannot create topic {entry['name']}: {message}")
            existing.update(_visible(admin, list(missing), timeout, security))
        states = []
        for name, _, _ in plan:
            if name not in existing:
                raise TopicError(f"topic {name} is not visible after creation")
            partitions, replicas_found = existing[name]
            states.append(TopicState(name, partitions, name in created, replicas_found))
        return states
    except TopicError:
        raise
    except Exception as exc:
        raise TopicError(f"cannot create topics on {bootstrap}: {kafka_clients.describe_error(exc)}") from None
    finally:
        admin.close()


def log_created(logger: logging.Logger, states: Iterable[TopicState]) -> None:
    """One operator line per topic this start-up created."""
    from streams.observability import logs

    for state in states:
        if state.created:
            logs.event(
                logger,
                logging.INFO,
                "topic created",
                event="topic_created",
                topic=state.name,
                partitions=state.partitions,
                replicas=state.replicas,
            )


@dataclass(frozen=True)
class TopicDescription:
    """A topic as `loopwarden topics describe` shows it."""

    name: str
    partitions: int
    replication_factor: int
    leaders: tuple[int, ...]  # broker id per partition, -1 while it has none


def list_topics(
    bootstrap: str, *, timeout: float = ADMIN_TIMEOUT, security: KafkaSecurity = PLAINTEXT
) -> dict[str, int]:
    """Every topic but Kafka's internal ones (`__consumer_offsets`, ...), by name, with its partition count."""
    admin = connected_admin(bootstrap, timeout, security)
    try:
        names = [name for name in admin.list_topics() if not name.startswith("__")]
        return dict(sorted(partitions_of(admin, names, security).items()))
    finally:
        admin.close()


def describe(
    bootstrap: str, names: Iterable[str], *, timeout: float = ADMIN_TIMEOUT, security: KafkaSecurity = PLAINTEXT
) -> list[TopicDescription]:
    """The topics of `names` that exist, in that order, with their partitions' leaders."""
    admin = connected_admin(bootstrap, timeout, security)
    try:
        found = {}
        for topic in admin.describe_topics(list(names)):
            if topic.get("error_code") == TOPIC_AUTHORIZATION_FAILED:
                raise TopicNotAuthorized(not_authorized(f"describe topic {topic['name']}", security))
            parts = sorted(topic.get("partitions") or [], key=lambda part: part["partition_index"])
            if topic.get("error_code", 0) == 0 and parts:
                replicas = max(len(part["replica_nodes"]) for part in parts)
                found[topic["name"]] = TopicDescription(
                    topic["name"], len(parts), replicas, tuple(part["leader_id"] for part in parts)
                )
        return [found[name] for name in names if name in found]
    finally:
        admin.close()


def describe_partitions(
    bootstrap: str, names: Iterable[str], *, timeout: float = ADMIN_TIMEOUT, security: KafkaSecurity = PLAINTEXT
) -> dict[str, int]:
    admin = connected_admin(bootstrap, timeout, security)
    try:
        return partitions_of(admin, names, security)
    finally:
        admin.close()
