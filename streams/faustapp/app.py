"""What the worker's and the fleet stage's Faust apps share: their defaults,
their web server, the start-up checks before either connects, the lines a
rebalance logs, and the Faust worker that runs them."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import faust
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from streams import listen
from streams.kafka import clients as kafka_clients
from streams.faustapp.table import STORE_URL
from streams.observability import logs
from streams.seams import faust as faust_seams
from streams.argtypes import format_duration

#: What every loopwarden Faust app shares (the worker and the fleet stage):
#: values stay the bytes of schemas/ (its codec decodes them), tables live in
#: loopwarden's RocksDB store, no leader topic (nothing uses Faust's leader
#: election), a new group starts from the earliest offsets, so nothing
#: published before the first start is skipped, and every write waits for all
#: in-sync replicas (their transports make the producer idempotent too).
APP_DEFAULTS: dict[str, Any] = {
    "producer_acks": -1,
    "autodiscover": False,
    "store": STORE_URL,
    "key_serializer": "raw",
    "value_serializer": "raw",
    "topic_disable_leader": True,
    "consumer_auto_offset_reset": "earliest",
}


class FlowControl(FlowControlEvent):
    """Faust's flow control, emptying the agents' queues on ``resume`` only
    when the flow really was suspended (faust-streaming 0.15.3).

    Faust's ``resume()`` empties the queues every time it is called. After a
    rebalance that needs no table recovery, Faust resumes the flow once when
    recovery ends and again when the stream partitions are resumed; events
    fetched in between would be dropped from the queue and, for a partition
    with no committed offset, never fetched again (aiokafka only seeks back
    when the committed offset is above 0). Queues hold events of an old
    generation only after a suspension, so that is when they are emptied.
    Events fetched twice are harmless: the worker's engine ignores a seq it
    has seen, and the fleet stage a run it has counted.
    """

    def resume(self) -> None:
        if not self.is_active():
            super().resume()


class App(faust.App):
    """A loopwarden Faust app, the worker's or the fleet stage's: Faust's,
    with the flow control above. The two other corrections of Faust's
    rebalance path are in the consumer both apps' transports use
    (streams/faustapp/consumer.py; docs/PROCESSING.md)."""

    # Faust's own lines stay under the faust logger (held at --faust-loglevel);
    # mode would otherwise name a subclass's logger after this module.
    logger = logging.getLogger("faust.loopwarden.app")

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return FlowControl(loop=self.loop)


def web_settings(port: int | None, host: str) -> dict[str, Any]:
    """Faust's web server for `/metrics` only: bound to `host` (127.0.0.1
    unless `--web-host` says otherwise; Faust binds 0.0.0.0 by default), and
    none of Faust's own pages. `/table/...` would show any run's stored
    history, and `/router`, `/graph` and the stats more of the worker, to
    anyone who reaches the port, past every ACL."""
    return {
        "web_enabled": port is not None,
        "web_port": port or 6066,
        "web_bind": host,
        "web_host": host,
        "web_tables_enabled": False,
        "web_router_enabled": False,
        "web_graph_enabled": False,
        "web_stats_enabled": False,
        "web_metrics_enabled": False,
    }


def log_rebalances(app: faust.App, logger: logging.Logger, topic: str) -> None:
    """One line when the group assigns this process its partitions of `topic`,
    and one when its tables are recovered and it takes events again: a
    (re)start that stalls then says at which of the two steps."""

    def say(message: str, event: str) -> None:
        mine = ",".join(str(tp.partition) for tp in sorted(app.assignor.assigned_actives()) if tp.topic == topic)
        logs.event(logger, logging.INFO, message, event=event, topic=topic, partitions=mine or "none")

    @app.on_partitions_assigned.connect
    async def _assigned(sender: Any, assigned: Any = (), **kwargs: Any) -> None:
        say("partitions assigned", "assigned")

    @app.on_rebalance_complete.connect
    async def _ready(sender: Any, **kwargs: Any) -> None:
        say("tables recovered; taking events", "ready")


class Worker(faust_seams.Worker):
    """Faust's worker (its log lines keep the name), with two changes to how a
    signal (SIGTERM, SIGINT) stops it. Neither can lose an event: one is
    acknowledged only once its verdict is delivered.

    - An error raised while the signal stops the start-up is the stop, not a
      failure: exit 0. Faust stops every service, also those still starting,
      and one can fail instead of stopping. Seen while the table's changelog
      topic is declared: the conductor awaits the same declaration, the stop
      cancels its task and with it the future it shares with the declaration
      (mode's ``StampedeWrapper``), whose ``set_result`` then raises
      InvalidStateError. An error raised before any signal still exits 1.
    - A stop not finished `stop_timeout` seconds after the signal ends the
      process (status 1, one `stop_overdue` error line), before the
      supervisor's grace period does and as its SIGKILL would. Seen, rarely,
      when the signal lands while the consumer is joining its group.

    Both lines go to ``logger``, the app's own.
    """

    def __init__(self, app: faust.App, *, logger: logging.Logger, stop_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.lines = logger
        self.stop_timeout = stop_timeout
        self._watchdog: threading.Timer | None = None
        self.stopped_by_signal = False

    def stop_signalled(self) -> None:
        self.stopped_by_signal = True
        if self._watchdog is None:  # a thread: the event loop may be what is stuck
            self._watchdog = threading.Timer(self.stop_timeout, self._stop_overdue)
            self._watchdog.daemon = True
            self._watchdog.start()

    def _stop_overdue(self) -> None:
        logs.event(
            self.lines,
            logging.ERROR,
            f"stop not finished {format_duration(self.stop_timeout)} after the signal: exiting",
            event="stop_overdue",
            stop_timeout=self.stop_timeout,
        )
        logging.shutdown()
        os._exit(1)

    async def start(self) -> None:
        try:
            await super().start()
        except Exception as exc:
            if not self.stopped_by_signal:
                raise
            logs.event(
                self.lines,
                logging.WARNING,
                "start-up stopped by a signal",
                event="startup_interrupted",
                error=f"{type(exc).__name__}: {exc}"[:300],
            )


def connection_accepted(
    logger: logging.Logger,
    bootstrap: str,
    security: kafka_clients.KafkaSecurity,
    group: str | None = None,
    timeout: float = kafka_clients.DEFAULT_CONNECT_TIMEOUT,
) -> bool:
    """Whether the brokers answer within `timeout` and accept this
    connection, and this user in consumer group `group` when one is given;
    if not, one `startup_failed` line naming what failed (no answer, TLS,
    SASL, a plaintext client on TLS, the group)."""
    try:
        if group is None:
            kafka_clients.check_connection(bootstrap, security, timeout)
        else:
            kafka_clients.check_group(bootstrap, security, group)
    except kafka_clients.CannotConnect as exc:
        logs.event(logger, logging.ERROR, str(exc), event="startup_failed")
        return False
    return True


def web_port_free(logger: logging.Logger, port: int | None, host: str) -> bool:
    """Whether the web server can listen on `host:port` (None: no web server); if
    not, one `startup_failed` line, before Faust would fail on it with a traceback."""
    if port is None:
        return True
    try:
        listen.check_free(host, port)
    except listen.CannotListen as exc:
        logs.event(logger, logging.ERROR, str(exc), event="startup_failed")
        return False
    return True
