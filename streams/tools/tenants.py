"""`loopwarden tenants add|list`: a tenant's principal, topic pair and ACLs.

A tenant is a group of gateways that may not see or steer another group's
runs (docs/SECURITY.md, "Tenants"). `add` makes, as the brokers' super user:

- the SCRAM user `tenant-NAME`, with a random password;
- the topics `loopwarden.NAME.events` and `loopwarden.NAME.decisions`, with
  the partitions of the default events topic (the worker co-partitions every
  events topic with its run table, so they must match);
- literal ACLs: the tenant writes its events and reads its decisions, and
  nothing else; the worker reads its events and writes (and reads, for the
  fleet stage) its decisions;
- `DATA_DIR/secrets/tenants/NAME/gateway.env` (and `gateway.password`): every
  setting a gateway needs, its two topics included.

Against the secure local broker of `DATA_DIR` (`loopwarden broker start
--secure`) it connects as that broker's `admin`; against any other cluster,
with the connection options or variables, which must be a super user's.
Running `add` again for the same tenant keeps its password and adds whatever
is missing.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path
from typing import Any

from schemas.topics import EVENTS_TOPIC, tenant_of, tenant_topics
from streams import kafka_clients
from streams.kafka_clients import KafkaSecurity
from streams.tools import secure

TENANTS_DIR = "tenants"
ENV_FILE = "gateway.env"
PASSWORD_FILE = "gateway.password"


class TenantError(RuntimeError):
    """A tenant could not be added or listed; the message says what and where."""


def tenant_dir(data_dir: Path, name: str) -> Path:
    return secure.secrets_dir(data_dir) / TENANTS_DIR / name


def _connection(args: argparse.Namespace) -> tuple[str, KafkaSecurity]:
    """The secure local broker of --data-dir as its super user, unless
    --bootstrap names another cluster (then the connection options)."""
    from streams.tools.broker import BOOTSTRAP_FILE
    from streams.worker.settings import connection_from_args

    data_dir: Path = args.data_dir
    local = secure.admin_security(data_dir)
    if args.bootstrap is None and local is not None and (data_dir / BOOTSTRAP_FILE).exists():
        bootstrap = (data_dir / BOOTSTRAP_FILE).read_text().strip()
        kafka_clients.check_connection(bootstrap, local)
        return bootstrap, local
    return connection_from_args(args)


def _password(folder: Path) -> Path:
    """The tenant's password file: kept if this command wrote it before (an
    owner-only regular file), else a new random one."""
    path = folder / PASSWORD_FILE
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise TenantError(f"{path} is not a regular file: remove it and run `tenants add` again")
    if not path.exists() or not path.read_text(encoding="utf-8").strip():
        secure.write_private(path, secrets.token_urlsafe(24) + "\n")
    path.chmod(0o600)
    return path


def add_tenant(
    name: str,
    data_dir: Path,
    bootstrap: str,
    admin_security: KafkaSecurity,
    *,
    partitions: int | None = None,
    decisions_partitions: int | None = None,
) -> dict[str, Any]:
    """Make tenant `name` (idempotent); what was made, for the report."""
    from kafka.admin import UserScramCredentialUpsertion

    from streams.worker.topics import TopicError, describe_partitions, ensure

    events, decisions = tenant_topics(name)
    folder = tenant_dir(data_dir, name)
    password_path = _password(folder)
    password = password_path.read_text(encoding="utf-8").strip()
    principal = secure.tenant_principal(name)
    try:
        if partitions is None:
            found = describe_partitions(bootstrap, [EVENTS_TOPIC], security=admin_security)
            if EVENTS_TOPIC not in found:
                raise TenantError(f"the default events topic {EVENTS_TOPIC} does not exist: give --partitions")
            partitions = found[EVENTS_TOPIC]
        states = ensure(
            bootstrap,
            [(events, partitions, {}), (decisions, decisions_partitions or partitions, {})],
            None,  # as many replicas as the cluster allows, as the project's own topics
            security=admin_security,
        )
    except TopicError as exc:
        raise TenantError(str(exc)) from None
    if states[0].partitions != partitions:
        raise TenantError(
            f"{events} has {states[0].partitions} partitions, not {partitions}: the worker serves only events "
            "topics with as many partitions as its own"
        )
    admin = kafka_clients.admin(bootstrap, security=admin_security, client_id="loopwarden-tenants")
    try:
        upsert = UserScramCredentialUpsertion(principal, secure.MECHANISM, password)
        error = admin.alter_user_scram_credentials([upsert]).get(principal)
        if error:
            raise TenantError(f"cannot set the SCRAM credentials of {principal}: {error}")
        secure.create_acls(admin, secure.tenant_acls(name))
    finally:
        admin.close()
    tenant = KafkaSecurity.checked(
        {
            "protocol": admin_security.protocol,
            "sasl_mechanism": secure.MECHANISM,
            "sasl_username": principal,
            "sasl_password_file": str(password_path),
            "ssl_cafile": admin_security.ssl_cafile,
        }
    )
    values = {
        "LOOPWARDEN_BOOTSTRAP": bootstrap,
        **tenant.env(),
        "LOOPWARDEN_EVENTS_TOPIC": events,
        "LOOPWARDEN_DECISIONS_TOPIC": decisions,
    }
    env_path = folder / ENV_FILE
    secure.write_private(env_path, "".join(f"{k}={v}\n" for k, v in values.items()))
    return {"name": name, "user": principal, "topics": [(s.name, s.partitions) for s in states], "env": env_path}


def list_tenants(bootstrap: str, admin_security: KafkaSecurity, data_dir: Path | None) -> list[dict[str, Any]]:
    """Every tenant whose topic pair exists: its user, partitions, whether
    its ACLs are all there, and its env file when `data_dir` holds it."""
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType
    from kafka.admin import ResourcePatternFilter, ResourceType

    from streams.worker.topics import partitions_of

    admin = kafka_clients.admin(bootstrap, security=admin_security, client_id="loopwarden-tenants")
    try:
        names = sorted(name for topic in admin.list_topics() if (name := tenant_of(topic)) is not None)
        every_acl = ACLFilter(
            None,
            None,
            ACLOperation.ANY,
            ACLPermissionType.ANY,
            ResourcePatternFilter(ResourceType.TOPIC, None, ACLResourcePatternType.LITERAL),
        )
        acls = set(admin.describe_acls(every_acl)[0])
        rows = []
        for name in names:
            events, decisions = tenant_topics(name)
            counts = partitions_of(admin, [events, decisions], admin_security)
            env = tenant_dir(data_dir, name) / ENV_FILE if data_dir is not None else None
            rows.append(
                {
                    "name": name,
                    "user": secure.tenant_principal(name),
                    "events": f"{events} ({counts.get(events, 0)})",
                    "decisions": f"{decisions} ({counts.get(decisions, 0)})",
                    "acls": "ok" if set(secure.tenant_acls(name)) <= acls else "missing",
                    "env": str(env) if env is not None and env.exists() else "-",
                }
            )
        return rows
    finally:
        admin.close()


def add_tenants_command(commands: Any) -> None:
    """`loopwarden tenants add|list`, registered on the CLI's subcommands."""
    from streams.helptext import add_command
    from streams.worker.settings import add_connection_options, positive_int

    tenants = add_command(
        commands,
        "tenants",
        help="add or list tenants: a principal, a topic pair and ACLs each (docs/SECURITY.md)",
    )
    sub = tenants.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    add = add_command(sub, "add", help="create a tenant's user, topics, ACLs and gateway.env")
    add.add_argument(
        "name", metavar="NAME", help="the tenant's name: its topics are loopwarden.NAME.events and .decisions"
    )
    add.add_argument("--partitions", type=positive_int, help="default: as the default events topic")
    add.add_argument("--decisions-partitions", type=positive_int, help="default: as --partitions")
    listing = add_command(sub, "list", help="the tenants whose topics exist")
    for parser in (add, listing):
        parser.add_argument(
            "--data-dir",
            type=Path,
            required=True,
            help="the secure local broker's data dir (its admin is used unless --bootstrap is given); "
            "tenants' settings go to DATA_DIR/secrets/tenants/NAME/",
        )
        add_connection_options(parser)
    tenants.set_defaults(run=run_tenants_command)


def run_tenants_command(args: argparse.Namespace) -> int:
    args.data_dir = args.data_dir.resolve()
    bootstrap, security = _connection(args)
    try:
        if args.tenants_command == "add":
            made = add_tenant(
                args.name,
                args.data_dir,
                bootstrap,
                security,
                partitions=args.partitions,
                decisions_partitions=args.decisions_partitions,
            )
            topics = ", ".join(f"{topic} ({count} partitions)" for topic, count in made["topics"])
            print(f"tenant {made['name']}: user {made['user']}; topics {topics}; settings in {made['env']}")
            return 0
        for row in list_tenants(bootstrap, security, args.data_dir):
            print("  ".join(f"{key}={value}" if key != "name" else value for key, value in row.items()))
        return 0
    except (TenantError, ValueError, secure.SecureSetupError) as exc:
        print(f"loopwarden tenants: {exc}", file=sys.stderr)
        return 2
