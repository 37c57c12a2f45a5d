"""The checkpoint's order, with fakes for the broker, the table and Faust:
verdicts acknowledged, then states written, then events acknowledged."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from streams.worker.checkpoint import ACKS_PER_YIELD, Checkpoint, Checkpoints, finish


class FakeStates:
    """Records what the checkpoint asks of the state store; its changelog
    sends stay pending until the test acknowledges them."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.changelog: list[asyncio.Future[Any]] = []

    async def write(self, checkpoint: Checkpoint) -> list[asyncio.Future[Any]]:
        self.log.append("write states")
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda _: self.log.append("states acknowledged"))
        self.changelog.append(future)
        return [future]

    def persist(self, records: list[Any]) -> None:
        self.log.append("offsets persisted")


def message(offset: int) -> Any:
    return SimpleNamespace(offset=offset)


def verdict_send(log: list[str], name: str) -> asyncio.Future[Any]:
    future = asyncio.get_running_loop().create_future()
    future.add_done_callback(lambda _: log.append(f"{name} acknowledged"))
    return future


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_finish_waits_for_each_step_before_the_next() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        states = FakeStates(log)
        checkpoint = Checkpoint()
        checkpoint.messages += [message(1), message(2)]
        verdicts = [verdict_send(log, "verdict 1"), verdict_send(log, "dead letter 2")]
        checkpoint.sent += verdicts
        task = asyncio.ensure_future(finish(checkpoint, states, lambda m: log.append(f"ack {m.offset}")))
        await settle()
        assert log == [], "nothing written or acknowledged before the broker acknowledged the verdicts"
        verdicts[1].set_result(None)
        await settle()
        assert log == ["dead letter 2 acknowledged"]
        verdicts[0].set_result(None)
        await settle()
        assert log[-1] == "write states", "states written once every send was acknowledged"
        states.changelog[0].set_result(None)
        await task
        return log

    assert asyncio.run(scenario()) == [
        "dead letter 2 acknowledged",
        "verdict 1 acknowledged",
        "write states",
        "states acknowledged",
        "offsets persisted",
        "ack 1",
        "ack 2",
    ]


def test_a_failed_verdict_send_writes_and_acknowledges_nothing() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        checkpoint = Checkpoint()
        checkpoint.messages.append(message(1))
        sent = verdict_send(log, "verdict 1")
        checkpoint.sent.append(sent)
        sent.set_exception(ConnectionError("broker gone"))
        with pytest.raises(ConnectionError):
            await finish(checkpoint, FakeStates(log), lambda m: log.append(f"ack {m.offset}"))
        return log

    assert asyncio.run(scenario()) == ["verdict 1 acknowledged"]


def test_a_failed_state_write_acknowledges_nothing() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        states = FakeStates(log)
        checkpoint = Checkpoint()
        checkpoint.messages.append(message(1))
        task = asyncio.ensure_future(finish(checkpoint, states, lambda m: log.append(f"ack {m.offset}")))
        await settle()
        states.changelog[0].set_exception(ConnectionError("changelog refused"))
        with pytest.raises(ConnectionError):
            await task
        return log

    assert asyncio.run(scenario()) == ["write states", "states acknowledged"]


def test_events_are_acknowledged_a_slice_at_a_time() -> None:
    """Between two slices of acknowledgements the processor gets its turn:
    a checkpoint of a few thousand events never holds it for all of them.
    Each slice is let go once acknowledged."""

    async def scenario() -> tuple[list[int], list[int], int]:
        acked: list[int] = []
        states = FakeStates([])
        checkpoint = Checkpoint()
        checkpoint.messages += [message(n) for n in range(2 * ACKS_PER_YIELD + 1)]
        task = asyncio.ensure_future(finish(checkpoint, states, lambda m: acked.append(m.offset)))
        await settle()
        states.changelog[0].set_result(None)
        seen: list[int] = []  # acknowledgements done whenever another task ran
        while not task.done():
            seen.append(len(acked))
            await asyncio.sleep(0)
        await task
        return acked, seen, len(checkpoint.messages)

    acked, seen, left = asyncio.run(scenario())
    assert acked == list(range(2 * ACKS_PER_YIELD + 1))
    assert ACKS_PER_YIELD in seen and 2 * ACKS_PER_YIELD in seen
    assert left == 0


def test_checkpoints_finish_in_order() -> None:
    """The second checkpoint's sends are acknowledged first; it still waits
    for the first to finish. Closing one takes no events any more into it."""

    async def scenario() -> tuple[list[str], list[int]]:
        log: list[str] = []
        states = FakeStates(log)
        finished: list[int] = []
        checkpoints = Checkpoints(
            states, lambda m: log.append(f"ack {m.offset}"), 3600.0, lambda c: finished.append(c.size)
        )
        runner = asyncio.ensure_future(checkpoints.run())
        first = checkpoints.join(message(1))
        first.sent.append(verdict_send(log, "verdict 1"))
        checkpoints.close()
        second = checkpoints.join(message(2))
        assert first.closed and not second.closed
        second.sent.append(verdict_send(log, "verdict 2"))
        checkpoints.close()
        assert second.closed and checkpoints.open.messages == []
        assert log == []
        second.sent[0].set_result(None)
        await settle()
        assert "write states" not in log
        first.sent[0].set_result(None)
        await settle()
        states.changelog[0].set_result(None)
        await settle()
        states.changelog[1].set_result(None)
        await settle()
        runner.cancel()
        return log, finished

    log, finished = asyncio.run(scenario())
    first = ["write states", "states acknowledged", "offsets persisted", "ack 1"]
    second = ["write states", "states acknowledged", "offsets persisted", "ack 2"]
    assert log == ["verdict 2 acknowledged", "verdict 1 acknowledged", *first, *second]
    assert finished == [1, 1]


def test_an_open_checkpoint_closes_after_the_flush_interval() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        checkpoints = Checkpoints(FakeStates(log), lambda m: log.append(f"ack {m.offset}"), 0.01, lambda c: None)
        runner = asyncio.ensure_future(checkpoints.run())
        checkpoints.join(message(7))
        states = checkpoints.states
        assert isinstance(states, FakeStates)
        while not states.changelog:
            await asyncio.sleep(0.005)
        states.changelog[0].set_result(None)
        await settle()
        runner.cancel()
        return log

    assert asyncio.run(scenario()) == ["write states", "states acknowledged", "offsets persisted", "ack 7"]
