"""Every Kafka client the project makes is configured here: the gateway
client's, the tools', the broker probe's and the tests' (kafka-python), the
benchmarks' (aiokafka) and the worker's Faust app (aiokafka underneath). How a
client reaches and authenticates to the brokers is decided in `connection`,
`aio_connection` and `faust_connection` only, from one `KafkaSecurity`, so
transport security is configured in one place.

`KafkaSecurity` is read once, at start-up, from the `LOOPWARDEN_SECURITY_*`,
`LOOPWARDEN_SASL_*` and `LOOPWARDEN_SSL_*` variables or their flags
(`security_from`), and checked then: a missing file, an unknown protocol or
mechanism, or SASL without a username fails with a `SecurityError` naming the
setting. The SASL password is read from a file, never taken from a command
line, and never shown: its repr is a mask.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from streams.listen import reason as socket_reason

Bootstrap = str | Sequence[str]
Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]

PROTOCOLS: tuple[Protocol, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS: tuple[Mechanism, ...] = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
DEFAULT_MECHANISM: Mechanism = "SCRAM-SHA-512"


class SecuritySetting(msgspec.Struct, frozen=True):
    """One security setting: its field, environment variable and flag; what
    applies when neither is given (`fallback`, none when empty)."""

    field: str
    env: str
    flag: str
    help: str
    fallback: str = ""


#: The settings, in the order they are documented; every command that talks
#: to Kafka takes each as a flag, and each flag wins over its variable.
SETTINGS: tuple[SecuritySetting, ...] = (
    SecuritySetting(
        "protocol",
        "LOOPWARDEN_SECURITY_PROTOCOL",
        "--security-protocol",
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
        "PLAINTEXT",
    ),
    SecuritySetting(
        "sasl_mechanism",
        "LOOPWARDEN_SASL_MECHANISM",
        "--sasl-mechanism",
        "SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN",
        DEFAULT_MECHANISM,
    ),
    SecuritySetting("sasl_username", "LOOPWARDEN_SASL_USERNAME", "--sasl-username", "SASL user name"),
    SecuritySetting(
        "sasl_password_file",
        "LOOPWARDEN_SASL_PASSWORD_FILE",
        "--sasl-password-file",
        "file holding the SASL password (never the password itself)",
    ),
    SecuritySetting(
        "ssl_cafile", "LOOPWARDEN_SSL_CAFILE", "--ssl-cafile", "PEM CA bundle to trust", "the system's CAs"
    ),
    SecuritySetting(
        "ssl_certfile", "LOOPWARDEN_SSL_CERTFILE", "--ssl-certfile", "PEM client certificate, for mutual TLS"
    ),
    SecuritySetting("ssl_keyfile", "LOOPWARDEN_SSL_KEYFILE", "--ssl-keyfile", "PEM key of --ssl-certfile"),
)
_BY_FIELD = {setting.field: setting for setting in SETTINGS}


class SecurityError(ValueError):
    """A security setting is wrong; the message names it."""


class Secret:
    """A password held in memory only: every way of printing it shows a mask,
    so it cannot reach a log line, an error message or a repr by accident."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The password itself, for the client that sends it."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class KafkaSecurity(msgspec.Struct, frozen=True, kw_only=True):
    """How every client of one process authenticates to and encrypts its
    traffic with the brokers. Build it with `security_from` (checked) or
    `KafkaSecurity.checked`; `PLAINTEXT` is the default everywhere."""

    protocol: Protocol = "PLAINTEXT"
    sasl_mechanism: Mechanism | None = None
    sasl_username: str | None = None
    sasl_password_file: str | None = None
    sasl_password: Secret | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @classmethod
    def checked(cls, values: Mapping[str, str | None]) -> KafkaSecurity:
        """From raw values by field name (None or "" for unset), validated,
        with the password read from its file."""
        return _check({name: value or None for name, value in values.items()})

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context all three client libraries share (None without TLS):
        the CA file (else the system's trust store), the hostname checked, and
        the client certificate for mutual TLS."""
        if not self.uses_ssl:
            return None
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        if self.ssl_certfile:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context

    def argv(self) -> list[str]:
        """The flags that give these settings to a child `loopwarden` process
        (the password file's path, never the password)."""
        out: list[str] = []
        for setting in SETTINGS:
            value = getattr(self, setting.field)
            if value is not None and not (setting.field == "protocol" and value == "PLAINTEXT"):
                out += [setting.flag, str(value)]
        return out

    def log_fields(self) -> dict[str, str]:
        """How a start-up log line says who connects: the protocol and the SASL user."""
        return {"security": self.protocol, "sasl_user": self.sasl_username or "-"}

    def env(self) -> dict[str, str]:
        """The `LOOPWARDEN_*` variables that give these settings (no password)."""
        return {
            setting.env: str(getattr(self, setting.field))
            for setting in SETTINGS
            if getattr(self, setting.field) is not None
        }


PLAINTEXT = KafkaSecurity()


def _name(field: str) -> str:
    setting = _BY_FIELD[field]
    return f"{setting.env} ({setting.flag})"


def _readable(field: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise SecurityError(f"{_name(field)}: cannot read {path}: {exc.strerror or exc}") from None


def _check(values: dict[str, str | None]) -> KafkaSecurity:
    protocol = (values.get("protocol") or "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise SecurityError(f"{_name('protocol')}: expected one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    sasl = protocol.startswith("SASL_")
    tls = protocol in ("SSL", "SASL_SSL")
    for field in ("sasl_mechanism", "sasl_username", "sasl_password_file"):
        if values.get(field) and not sasl:
            raise SecurityError(
                f"{_name(field)} is set, but {_name('protocol')} is {protocol}, not SASL_PLAINTEXT or SASL_SSL"
            )
    for field in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if values.get(field) and not tls:
            raise SecurityError(f"{_name(field)} is set, but {_name('protocol')} is {protocol}, not SSL or SASL_SSL")
    mechanism = password = None
    if sasl:
        mechanism = (values.get("sasl_mechanism") or DEFAULT_MECHANISM).upper()
        if mechanism not in MECHANISMS:
            raise SecurityError(
                f"{_name('sasl_mechanism')}: expected one of {', '.join(MECHANISMS)}, got {mechanism!r}"
            )
        for field in ("sasl_username", "sasl_password_file"):
            if not values.get(field):
                raise SecurityError(f"{_name(field)} is required with {protocol}")
        password = _read_password(values["sasl_password_file"] or "")
    if values.get("ssl_keyfile") and not values.get("ssl_certfile"):
        raise SecurityError(f"{_name('ssl_keyfile')} is set without {_name('ssl_certfile')}")
    for field in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if values.get(field):
            _readable(field, values[field] or "")
    security = KafkaSecurity(
        protocol=protocol,  # type: ignore[arg-type]
        sasl_mechanism=mechanism,  # type: ignore[arg-type]
        sasl_username=values.get("sasl_username") if sasl else None,
        sasl_password_file=values.get("sasl_password_file") if sasl else None,
        sasl_password=password,
        ssl_cafile=values.get("ssl_cafile"),
        ssl_certfile=values.get("ssl_certfile"),
        ssl_keyfile=values.get("ssl_keyfile"),
    )
    if tls:
        _loads("ssl_cafile", lambda: ssl.create_default_context(cafile=security.ssl_cafile))
        if security.ssl_certfile:
            context = ssl.create_default_context()
            _loads("ssl_certfile", lambda: context.load_cert_chain(security.ssl_certfile or "", security.ssl_keyfile))
    return security


def _loads(field: str, load: Callable[[], object]) -> None:
    try:
        load()
    except (ssl.SSLError, OSError) as exc:
        raise SecurityError(f"{_name(field)}: not a usable PEM file: {exc}") from None


def _read_password(path: str) -> Secret:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SecurityError(f"{_name('sasl_password_file')}: cannot read {path}: {detail}") from None
    password = text.rstrip("\r\n")
    if not password:
        raise SecurityError(f"{_name('sasl_password_file')}: {path} is empty")
    return Secret(password)


def security_from(
    flags: Mapping[str, str | None] | None = None, environ: Mapping[str, str] | None = None
) -> KafkaSecurity:
    """The settings of this process: each flag given (by field name), else its
    `LOOPWARDEN_*` variable; checked (SecurityError names what is wrong)."""
    given = flags or {}
    env = os.environ if environ is None else environ
    return KafkaSecurity.checked(
        {setting.field: given.get(setting.field) or env.get(setting.env) for setting in SETTINGS}
    )


# --------------------------------------------------------------------------
# Client settings
# --------------------------------------------------------------------------


def _sasl(security: KafkaSecurity) -> dict[str, Any]:
    if not security.uses_sasl or security.sasl_password is None:
        return {}
    return {
        "sasl_mechanism": security.sasl_mechanism,
        "sasl_plain_username": security.sasl_username,
        "sasl_plain_password": security.sasl_password.reveal(),
    }


def connection(bootstrap: Bootstrap, security: KafkaSecurity = PLAINTEXT) -> dict[str, Any]:
    """What every kafka-python and aiokafka client needs to reach and
    authenticate to the brokers (both libraries name these settings alike)."""
    settings: dict[str, Any] = {"bootstrap_servers": bootstrap}
    if security.protocol != "PLAINTEXT":
        settings["security_protocol"] = security.protocol
        settings.update(_sasl(security))
        context = security.ssl_context()
        if context is not None:
            settings["ssl_context"] = context
    return settings


def _made(
    factory: Callable[..., Any],
    bootstrap: Bootstrap,
    security: KafkaSecurity,
    options: dict[str, Any],
    topics: Sequence[str] = (),
) -> Any:
    return factory(*topics, **{**connection(bootstrap, security), **options})


#: Every producer's delivery settings unless its options say otherwise: a
#: write is acknowledged once every in-sync replica has it (with
#: min.insync.replicas=2 on three brokers, the loss of any one broker loses
#: nothing acknowledged), and the retries that follow a lost leader neither
#: double nor reorder a partition's records (each batch carries the
#: producer's id and sequence, which the broker checks).
DELIVERY: dict[str, Any] = {"acks": "all", "enable_idempotence": True}


def producer(bootstrap: Bootstrap, *, security: KafkaSecurity = PLAINTEXT, **options: Any) -> Any:
    """A kafka-python `KafkaProducer`, idempotent with acks=all (`DELIVERY`);
    `options` are its own settings (an option that contradicts idempotence,
    such as `acks=1` or `retries=0`, needs `enable_idempotence=False` too)."""
    from kafka import KafkaProducer

    return _made(KafkaProducer, bootstrap, security, {**DELIVERY, **options})


def consumer(bootstrap: Bootstrap, *topics: str, security: KafkaSecurity = PLAINTEXT, **options: Any) -> Any:
    """A kafka-python `KafkaConsumer`, subscribed to `topics` if any;
    `options` are its own settings."""
    from kafka import KafkaConsumer

    return _made(KafkaConsumer, bootstrap, security, options, topics)


def admin(bootstrap: Bootstrap, *, security: KafkaSecurity = PLAINTEXT, **options: Any) -> Any:
    """A kafka-python `KafkaAdminClient`; `options` are its own settings."""
    from kafka import KafkaAdminClient

    return _made(KafkaAdminClient, bootstrap, security, options)


def aio_producer(bootstrap: Bootstrap, *, security: KafkaSecurity = PLAINTEXT, **options: Any) -> Any:
    """An aiokafka `AIOKafkaProducer` (not started), idempotent with acks=all
    (`DELIVERY`); `options` are its own settings."""
    from aiokafka import AIOKafkaProducer

    return _made(AIOKafkaProducer, bootstrap, security, {**DELIVERY, **options})


def aio_consumer(bootstrap: Bootstrap, *topics: str, security: KafkaSecurity = PLAINTEXT, **options: Any) -> Any:
    """An aiokafka `AIOKafkaConsumer` (not started), subscribed to `topics`
    if any; `options` are its own settings."""
    from aiokafka import AIOKafkaConsumer

    return _made(AIOKafkaConsumer, bootstrap, security, options, topics)


def faust_connection(bootstrap: str, transport: str = "kafka", security: KafkaSecurity = PLAINTEXT) -> dict[str, Any]:
    """The same for a Faust app's settings: its broker URLs, under the Faust
    transport `transport` (the worker's own is "loopwarden",
    streams/worker/transport.py), and its `broker_credentials`, which Faust
    hands to every aiokafka client it makes (consumer, producer, topic admin)."""
    servers = [server.strip() for server in bootstrap.split(",") if server.strip()]
    settings: dict[str, Any] = {"broker": ",".join(f"{transport}://{server}" for server in servers)}
    if security.protocol == "PLAINTEXT":
        return settings
    import faust

    context = security.ssl_context()
    if security.uses_sasl:
        assert security.sasl_password is not None  # checked with the protocol
        credentials: Any = faust.SASLCredentials(
            username=security.sasl_username,
            password=security.sasl_password.reveal(),
            ssl_context=context,
            mechanism=security.sasl_mechanism,
        )
    else:
        credentials = faust.SSLCredentials(context)
    settings["broker_credentials"] = credentials
    return settings


# --------------------------------------------------------------------------
# Start-up check
# --------------------------------------------------------------------------


DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds a command waits for a bootstrap server to answer before it says so
(`--connect-timeout`): long enough for a broker that is starting, short enough
that a wrong address is named before a person wonders."""


class CannotConnect(RuntimeError):
    """This client cannot talk to the brokers; the message says why."""


class ConnectionRefused(CannotConnect):
    """The brokers refused this client's connection; the message says at
    which step (TCP, TLS handshake, SASL authentication) and why."""


class KafkaUnreachable(CannotConnect):
    """No bootstrap server answered within the connect timeout."""


def check_connection(
    bootstrap: str,
    security: KafkaSecurity = PLAINTEXT,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    *,
    retry: bool = True,
) -> None:
    """Connect to the bootstrap servers as every client will (TCP, the TLS
    handshake, SASL authentication, one metadata request) and raise
    `ConnectionRefused` saying what failed, or `KafkaUnreachable` when none
    answers within `timeout` seconds (tried again and again until then: a
    broker may be starting). The clients themselves retry quietly for their
    whole bootstrap timeout and then only say that they could not bootstrap;
    a command runs this first so that the problem is named at start-up.
    A timeout of 0 skips the check; without `retry`, one round of tries ends it."""
    import asyncio

    if timeout <= 0:
        return
    loop = asyncio.new_event_loop()  # never the thread's loop: Faust makes its own later
    try:
        loop.run_until_complete(_reach(bootstrap, security, timeout, retry))
    finally:
        loop.close()


#: Seconds between two rounds of connection attempts while none answers.
_RETRY_EVERY = 0.25


async def _reach(bootstrap: str, security: KafkaSecurity, timeout: float, retry: bool) -> None:
    """`_probe` each server in turn until one answers; KafkaUnreachable, with
    the last reason, once `timeout` has passed (without `retry`, after one round)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    servers = [server.strip() for server in bootstrap.split(",") if server.strip()]
    while True:
        for server in servers:
            left = deadline - loop.time()
            try:
                await asyncio.wait_for(_probe(server, security, max(left, 0.001)), max(left, 0.001))
                return
            except TimeoutError:
                reason = "no answer"
            except OSError as exc:
                reason = socket_reason(exc)
        if not retry or loop.time() + _RETRY_EVERY >= deadline:
            raise KafkaUnreachable(
                f"cannot reach Kafka at {bootstrap}: {reason} (waited {timeout:g}s, --connect-timeout)"
            )
        await asyncio.sleep(_RETRY_EVERY)


def describe_error(exc: BaseException) -> str:
    """A client error in one phrase: its type, then its message unless that
    only repeats the type (kafka-python's often does: `KafkaTimeoutError:
    KafkaTimeoutError: ...`)."""
    name = type(exc).__name__
    text = _ERROR_CODE.sub("", str(exc)).removeprefix(name).removeprefix(":").strip()
    return f"{name}: {text}" if text else name


_ERROR_CODE = re.compile(r"^\[Error -?\d+\]\s*")
"""kafka-python's broker errors open with their code: `[Error 29] TopicAuthorizationFailedError: ...`."""


def not_authorized(action: str, security: KafkaSecurity) -> str:
    """What the ACLs refused and whose ACLs they are: the one line an operator needs."""
    user = f"user {security.sasl_username}" if security.sasl_username else "this client"
    return f"not authorized to {action}: the ACLs of {user} do not allow it"


def check_group(bootstrap: str, security: KafkaSecurity, group: str, timeout: float = 10.0) -> None:
    """Raise `ConnectionRefused` when the brokers refuse this user the
    consumer group `group`. Without this, a consumer refused its group
    retries quietly and a worker or stage starts and processes nothing. Only
    an authenticated user is checked (ACLs name users); any other answer,
    such as a coordinator not ready yet, is left to the consumer's retries."""
    if security.protocol == "PLAINTEXT":
        return
    from kafka.errors import GroupAuthorizationFailedError, KafkaError

    client = admin(bootstrap, security=security, request_timeout_ms=int(timeout * 1000))
    try:
        client.describe_groups([group])
    except GroupAuthorizationFailedError:
        raise ConnectionRefused(not_authorized(f"use consumer group {group}", security)) from None
    except KafkaError:
        pass
    finally:
        client.close()


async def _probe(server: str, security: KafkaSecurity, timeout: float) -> None:
    """One connection to `server`: ConnectionRefused for a refusal; OSError
    (or the caller's timeout) when nothing answers."""
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaConnectionError, KafkaError
    from aiokafka.protocol.metadata import MetadataRequest

    host, _, port = server.rpartition(":")
    settings = connection(server, security)
    del settings["bootstrap_servers"]
    try:
        conn = await create_conn(host, int(port), request_timeout_ms=int(timeout * 1000), **settings)
        try:
            await conn.send(MetadataRequest(topics=[]))
        finally:
            conn.close()
    except ssl.SSLCertVerificationError as exc:
        raise ConnectionRefused(
            f"TLS handshake with {server} failed: {exc.verify_message}: the broker's certificate is not "
            f"signed by a CA this client trusts ({_name('ssl_cafile')}: {security.ssl_cafile or 'the system CAs'})"
        ) from None
    except ssl.SSLError as exc:
        raise ConnectionRefused(f"TLS handshake with {server} failed: {exc}") from None
    except KafkaConnectionError as exc:
        hint = (
            ""
            if security.uses_ssl
            else f"; does its listener require TLS? ({_name('protocol')} is {security.protocol})"
        )
        raise ConnectionRefused(f"{server} closed the connection ({exc}){hint}") from None
    except KafkaError as exc:  # SaslAuthenticationFailed, UnsupportedSaslMechanism ...
        who = f" as {security.sasl_username}" if security.uses_sasl else ""
        raise ConnectionRefused(f"{server} refused the connection{who}: {type(exc).__name__}: {exc}") from None
