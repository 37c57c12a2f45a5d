"""The secure local broker's set-up: a private CA and a broker certificate,
SCRAM users created when the storage is formatted, the `StandardAuthorizer`
with the ACLs of the two roles, and the files a client needs.

Used by `LocalBroker(secure=True)` (streams/tools/broker.py). The broker's
one client listener speaks SASL_SSL with SCRAM-SHA-512 and nothing else; the
controller listener speaks SASL_SSL with PLAIN, for the broker itself only.
The `admin` user is the broker's own identity and the one super user: it
creates the topics and the ACLs; a gateway, a worker or an auditor is never
given its env file.

Roles (principals `User:gateway`, `User:worker`, `User:auditor`), and nothing else:

- gateway: write the events topic, read the decisions topic, with no
  consumer group (it reads its reply partition by assignment, so there is no
  group another gateway could join to take it over);
- worker: read the events topic; write the decisions and dead-letter topics
  (and read and write `WORKER_TOPICS`); own every topic and transactional id
  starting with its app id and `-` (Faust's changelog and repartition
  topics, and its transactions under exactly_once); use its consumer group,
  which is the app id. The fleet stage (`loopwarden fleet`) runs as the
  worker too: it reads the decisions topic with the group `FLEET_APP_ID`,
  its own topics start with `loopwarden-` as well, and it writes the
  incident topic, which the set-up creates with the others so that no role
  needs Create on a topic other clients read;
- auditor: read (and so describe) the events, decisions and incident topics,
  and every tenant's pair (streams/tools/tenants.py), without a consumer
  group: what `audit`, `explain` and `dashboard` need, and nothing else (no
  write, no group, no dead letters, no changelog, no other topic).

What a client needs lands in `DATA_DIR/secrets/`: `ca.pem`, one
`USER.password` and one `USER.env` (every `LOOPWARDEN_*` setting, bootstrap
included) per user: `gateway`, `worker`, `auditor`, `admin`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schemas.topics import DEADLETTER_TOPIC, DECISIONS_TOPIC, EVENTS_TOPIC, INCIDENTS_TOPIC, tenant_topics
from streams.fleet.settings import FLEET_APP_ID
from streams.kafka.clients import KafkaSecurity

SECRETS_DIR = "secrets"
CA_FILE = "ca.pem"
ADMIN = "admin"
GATEWAY = "gateway"
WORKER = "worker"
AUDITOR = "auditor"
ROLES = (GATEWAY, WORKER, AUDITOR)
MECHANISM = "SCRAM-SHA-512"
#: The app id the worker role's ACLs are written for (the worker's default).
APP_ID = "loopwarden"
#: The prefix gateways' consumer groups had; no group ACL names it any more.
GATEWAY_GROUP_PREFIX = "loopwarden-gateway-"
#: Topics of later stages that the worker reads and writes besides its own three.
WORKER_TOPICS: tuple[str, ...] = (INCIDENTS_TOPIC,)
#: What the auditor reads (`audit`, `explain`, `dashboard`): never the dead letters or a changelog.
AUDITED_TOPICS: tuple[str, ...] = (EVENTS_TOPIC, DECISIONS_TOPIC, INCIDENTS_TOPIC)

_BROKER_KEYSTORE = "broker.pem"  # the broker's PKCS#8 key, then its certificate
_DAYS = "3650"


class SecureSetupError(RuntimeError):
    """The CA, the certificates or the ACLs could not be made."""


def secrets_dir(data_dir: Path) -> Path:
    return data_dir / SECRETS_DIR


def password_file(data_dir: Path, user: str) -> Path:
    return secrets_dir(data_dir) / f"{user}.password"


def _openssl(*args: str, cwd: Path) -> None:
    try:
        proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise SecureSetupError("`openssl` not found on PATH: install it (e.g. apt-get install openssl)") from None
    if proc.returncode != 0:
        raise SecureSetupError(f"openssl {args[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def private_dir(path: Path) -> Path:
    """Create `path` (and its parents) if missing; either way only its owner
    may enter it: broker logs, run tables and secrets live there."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (created so, never widened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def make_secrets(data_dir: Path) -> None:
    """The CA, the broker's key and certificate (for 127.0.0.1 and localhost)
    and one random password per user; kept when they exist, so a restarted
    broker keeps its identity and its clients their settings."""
    folder = private_dir(secrets_dir(data_dir))
    written = _written(folder)
    for user in (ADMIN, *ROLES):
        path = password_file(data_dir, user)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise SecureSetupError(f"{path} is not a regular file: remove it")
        if not path.exists():
            write_private(path, secrets.token_urlsafe(24) + "\n")
            written[path.name] = _digest(path)
        elif written.get(path.name) != _digest(path):
            raise SecureSetupError(
                f"{path} was not written by this set-up (or was changed since): a password someone else chose "
                "is never adopted; remove it (and the broker's storage, whose users it set) to start afresh"
            )
    write_private(folder / _WRITTEN, json.dumps(written, sort_keys=True) + "\n")
    _fix_modes(folder)
    if (folder / _BROKER_KEYSTORE).exists():
        return
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    # The CA's key signs the broker's certificate and is deleted with the
    # work dir: no one can mint another certificate this CA vouches for.
    with tempfile.TemporaryDirectory(dir=folder) as work:
        _openssl(
            "req", "-x509", *ec, "-keyout", f"{work}/ca.key", "-out", CA_FILE, "-days", _DAYS,
            "-subj", "/CN=loopwarden local CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=folder,
        )  # fmt: skip
        extensions = Path(work) / "broker.ext"
        extensions.write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
            "keyUsage=critical,digitalSignature\n"
        )
        _openssl("req", "-new", *ec, "-keyout", f"{work}/broker.key", "-out", f"{work}/broker.csr",
                 "-subj", "/CN=localhost", cwd=folder)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{work}/broker.csr", "-CA", CA_FILE, "-CAkey", f"{work}/ca.key",
                 "-CAcreateserial", "-CAserial", f"{work}/ca.srl", "-out", f"{work}/broker.crt", "-days", _DAYS,
                 "-extfile", str(extensions), cwd=folder)  # fmt: skip
        key = Path(work, "broker.key").read_text()
        write_private(folder / _BROKER_KEYSTORE, key + Path(work, "broker.crt").read_text())
    _fix_modes(folder)


_WRITTEN = "written.json"
"""The password files this set-up wrote, with the SHA-256 of each: only those are adopted."""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _written(folder: Path) -> dict[str, str]:
    """The password files recorded as written here; a data dir set up before
    the record existed has its files recorded once, as they are."""
    record = folder / _WRITTEN
    if record.exists():
        return dict(json.loads(record.read_text(encoding="utf-8")))
    if not (folder / _BROKER_KEYSTORE).exists():
        return {}  # nothing set up yet: any password file found was put there by someone else
    return {path.name: _digest(path) for path in folder.glob("*.password") if path.is_file()}


def _fix_modes(folder: Path) -> None:
    """Owner-only for every file the secrets dir holds, but the CA certificate
    (public, for clients); fixed at every start, whatever made them wider."""
    for path in folder.rglob("*"):
        if path.is_symlink():
            continue
        if path.is_dir():
            path.chmod(0o700)
        else:
            path.chmod(0o644 if path == folder / CA_FILE else 0o600)


def _password(data_dir: Path, user: str) -> str:
    return password_file(data_dir, user).read_text(encoding="utf-8").strip()


def server_properties(data_dir: Path) -> dict[str, str]:
    """The broker properties of the secure mode (the listeners are named in
    the template: SASL_SSL for clients, CONTROLLER for the quorum)."""
    folder = secrets_dir(data_dir)
    admin = _password(data_dir, ADMIN)
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(folder / _BROKER_KEYSTORE),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(folder / CA_FILE),
        "ssl.client.auth": "none",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            f'{scram} required username="{ADMIN}" password="{admin}";'
        ),
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": (
            f'{plain} required username="{ADMIN}" password="{admin}" user_{ADMIN}="{admin}";'
        ),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN}",
        "allow.everyone.if.no.acl.found": "false",
    }


@contextlib.contextmanager
def format_arguments(data_dir: Path) -> Iterator[list[str]]:
    """`--add-scram` arguments for `kafka-storage format`, in a Java argument
    file (`@FILE`, owner-only, deleted afterwards): the passwords never show
    in a process listing."""
    lines = [
        f"--add-scram\n{MECHANISM}=[name={user},password={_password(data_dir, user)}]\n" for user in (ADMIN, *ROLES)
    ]
    path = secrets_dir(data_dir) / "format.args"
    write_private(path, "".join(lines))
    try:
        yield [f"@{path}"]
    finally:
        path.unlink(missing_ok=True)


def role_security(data_dir: Path, user: str) -> KafkaSecurity:
    """The settings a client of `user` connects with (checked, password read)."""
    return KafkaSecurity.checked(
        {
            "protocol": "SASL_SSL",
            "sasl_mechanism": MECHANISM,
            "sasl_username": user,
            "sasl_password_file": str(password_file(data_dir, user)),
            "ssl_cafile": str(secrets_dir(data_dir) / CA_FILE),
        }
    )


def admin_security(data_dir: Path) -> KafkaSecurity | None:
    """The super user's settings if `data_dir` holds a secure broker's
    secrets, else None (a plaintext broker, or none set up yet)."""
    return role_security(data_dir, ADMIN) if password_file(data_dir, ADMIN).exists() else None


def write_env_files(data_dir: Path, bootstrap: str) -> None:
    """`secrets/<user>.env`: `set -a; . DIR/secrets/worker.env` then
    `loopwarden worker` connects as that user."""
    for role in (*ROLES, ADMIN):
        values = {"LOOPWARDEN_BOOTSTRAP": bootstrap, **role_security(data_dir, role).env()}
        if role == WORKER:
            values["LOOPWARDEN_APP_ID"] = APP_ID
        write_private(secrets_dir(data_dir) / f"{role}.env", "".join(f"{k}={v}\n" for k, v in values.items()))


def role_acls() -> list[object]:
    """Every ACL of the roles (kafka-python `ACL`s), and no other."""
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )

    literal, prefixed = ACLResourcePatternType.LITERAL, ACLResourcePatternType.PREFIXED
    op = ACLOperation
    grants = [
        (GATEWAY, ResourceType.TOPIC, EVENTS_TOPIC, literal, op.WRITE),
        (GATEWAY, ResourceType.TOPIC, DECISIONS_TOPIC, literal, op.READ),
        (WORKER, ResourceType.TOPIC, EVENTS_TOPIC, literal, op.READ),
        (WORKER, ResourceType.TOPIC, DECISIONS_TOPIC, literal, op.WRITE),
        (WORKER, ResourceType.TOPIC, DECISIONS_TOPIC, literal, op.READ),  # the fleet stage's input
        (WORKER, ResourceType.TOPIC, DEADLETTER_TOPIC, literal, op.WRITE),
        *(
            (WORKER, ResourceType.TOPIC, topic, literal, action)
            for topic in WORKER_TOPICS
            for action in (op.READ, op.WRITE)
        ),
        (WORKER, ResourceType.TOPIC, f"{APP_ID}-", prefixed, op.ALL),
        (WORKER, ResourceType.GROUP, APP_ID, literal, op.READ),
        (WORKER, ResourceType.GROUP, FLEET_APP_ID, literal, op.READ),
        (WORKER, ResourceType.TRANSACTIONAL_ID, f"{APP_ID}-", prefixed, op.WRITE),
        (WORKER, ResourceType.TRANSACTIONAL_ID, f"{APP_ID}-", prefixed, op.DESCRIBE),
        *((AUDITOR, ResourceType.TOPIC, topic, literal, op.READ) for topic in AUDITED_TOPICS),
    ]
    return [
        ACL(f"User:{user}", "*", action, ACLPermissionType.ALLOW, ResourcePattern(kind, name, pattern))
        for user, kind, name, pattern, action in grants
    ]


def tenant_principal(name: str) -> str:
    """The SCRAM user of tenant `name` (never one of the roles: those have no dash)."""
    return f"tenant-{name}"


def tenant_acls(name: str) -> list[object]:
    """A tenant's literal ACLs: its principal writes its events and reads its
    decisions, and nothing else (no group: its client reads without one); the
    worker reads its events and writes its decisions, and reads those for the
    fleet stage; the auditor reads both."""
    from kafka.admin import ACL, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePattern
    from kafka.admin import ResourceType

    events, decisions = tenant_topics(name)
    op = ACLOperation
    grants = [
        (tenant_principal(name), events, op.WRITE),
        (tenant_principal(name), decisions, op.READ),
        (WORKER, events, op.READ),
        (WORKER, decisions, op.WRITE),
        (WORKER, decisions, op.READ),
        (AUDITOR, events, op.READ),
        (AUDITOR, decisions, op.READ),
    ]
    return [
        ACL(
            f"User:{user}",
            "*",
            action,
            ACLPermissionType.ALLOW,
            ResourcePattern(ResourceType.TOPIC, topic, ACLResourcePatternType.LITERAL),
        )
        for user, topic, action in grants
    ]


def create_acls(admin: Any, wanted: list[object], timeout: float = 30.0) -> None:
    """Add ACLs (idempotent) and return once the broker enforces them: they
    reach its authorizer through the metadata log, a moment after they are accepted."""
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType
    from kafka.admin import ResourcePatternFilter, ResourceType

    every_acl = ACLFilter(
        None,
        None,
        ACLOperation.ANY,
        ACLPermissionType.ANY,
        ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
    )
    failed = admin.create_acls(wanted)["failed"]
    if failed:
        raise SecureSetupError(f"cannot create ACLs: {failed}")
    deadline = time.monotonic() + timeout
    while not set(wanted) <= set(admin.describe_acls(every_acl)[0]):
        if time.monotonic() >= deadline:
            raise SecureSetupError(f"the broker did not enforce the ACLs within {timeout:g}s")
        time.sleep(0.05)


def add_users(admin: Any, data_dir: Path, users: tuple[str, ...]) -> None:
    """Give `users` their SCRAM credentials from their password files: a
    storage formatted before a role existed (the auditor) gets it at start."""
    from kafka.admin import UserScramCredentialUpsertion

    upserts = [UserScramCredentialUpsertion(user, MECHANISM, _password(data_dir, user)) for user in users]
    failed = {user: error for user, error in admin.alter_user_scram_credentials(upserts).items() if error}
    if failed:
        raise SecureSetupError(f"cannot set SCRAM credentials: {failed}")


def grant(data_dir: Path, bootstrap: str, timeout: float = 30.0) -> None:
    """As the super user: add the roles' ACLs and create the project's topics,
    the incident topic among them (both idempotent, so every start adds what is missing), then write the
    env files. Returns once the broker enforces the ACLs: they reach its
    authorizer through the metadata log, a moment after they are accepted."""
    from streams.kafka import clients as kafka_clients
    from streams.kafka.topics import Topics
    from streams.kafka.topics import TopicError, ensure_project_topics

    admin_security = role_security(data_dir, ADMIN)
    admin = kafka_clients.admin(bootstrap, security=admin_security, client_id="loopwarden-broker-setup")
    try:
        add_users(admin, data_dir, ROLES)
        create_acls(admin, role_acls(), timeout)
    finally:
        admin.close()
    try:
        ensure_project_topics(bootstrap, Topics(), security=admin_security)
    except TopicError as exc:
        raise SecureSetupError(str(exc)) from None
    write_env_files(data_dir, bootstrap)
