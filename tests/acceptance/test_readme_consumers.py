"""The README's RabbitMQ and NATS consumer examples run as printed, against the shared servers:
messages published as the broker channels publish them (``sender.envelope``), each action's
effect made once, a key reused for another payload and a forged message refused."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import nats
import pytest

from tests.conftest import SECRET, eventually
from tests.receivers.brokers import Sent, require, sent, suffix

from .test_readme import load

FORGED = "whsec_" + "Wg" * 22
#: The sender's retry of invoice-1 (same payload), a different payload under its key, and a
#: message someone else signed under invoice-3's key.
ACTIONS = [sent("invoice-1", {"amount": 10}), sent("invoice-2", {"amount": 20}),
           sent("invoice-1", {"amount": 10}, fence=2), sent("invoice-1", {"amount": 99}, fence=3),
           sent("invoice-3", {"amount": 1}, signing=(FORGED,))]


async def run_until(example: dict[str, Any], done: Callable[[str], bool], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the example's ``main`` until ``done(printed)``, then SIGTERM it as an operator would."""
    running = asyncio.create_task(example["main"]())
    printed: list[str] = []

    def settled() -> bool:
        printed.append(capsys.readouterr().out)
        return done("".join(printed)) or running.done()

    assert await eventually(settled, 20)
    os.kill(os.getpid(), signal.SIGTERM)  # main's signal handler stops the consumer gracefully
    await asyncio.wait_for(running, 20)
    return "".join(printed) + capsys.readouterr().out


async def test_the_rabbitmq_consumer_example_handles_each_action_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    require(5672, "RabbitMQ")
    monkeypatch.setenv("RABBITMQ_SIGNING_SECRET", SECRET)
    example = load("rabbitmq-consumer", tmp_path)
    example["QUEUE"] = queue = f"readme-orders-{suffix()}"
    monkeypatch.chdir(tmp_path)  # where its record store lives
    connection = await aio_pika.connect_robust(example["URL"])
    channel = await connection.channel(publisher_confirms=True)
    try:
        await channel.declare_queue(queue, durable=True)
        for action in ACTIONS:
            await channel.default_exchange.publish(_amqp(action), queue)
        printed = await run_until(example, lambda out: "acme/invoice-3: invalid-signature" in out, capsys)
        assert example["invoices"] == ["acme/invoice-1", "acme/invoice-2"]
        assert "refused acme/invoice-1: idempotency-key-reused" in printed
        assert (await channel.declare_queue(queue, passive=True)).declaration_result.message_count == 0
    finally:
        await channel.queue_delete(queue)
        await connection.close()
    assert (tmp_path / "idempotency.db").exists()


def _amqp(action: Sent) -> aio_pika.Message:
    return aio_pika.Message(action.body, headers=dict(action.headers), message_id=action.key,
                            content_type="application/json", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


async def test_the_nats_consumer_example_handles_each_action_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    require(4222, "NATS")
    monkeypatch.setenv("NATS_SIGNING_SECRET", SECRET)
    example = load("nats-consumer", tmp_path)
    example["STREAM"] = stream = f"readme-orders-{suffix()}"
    monkeypatch.chdir(tmp_path)
    connection = await nats.connect(example["SERVERS"])
    js = connection.jetstream()
    try:
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        for action in ACTIONS:  # copies kept, as when the sender's retry comes after the duplicate window
            await js.publish(f"{stream}.orders", action.body, headers=action.headers)
        refusals: list[str] = []
        example["IdempotentJetStreamConsumer"] = _reporting(example["IdempotentJetStreamConsumer"], refusals)
        await run_until(example, lambda out: len(refusals) == 2, capsys)
        assert example["invoices"] == ["acme/invoice-1", "acme/invoice-2"]
        assert refusals == ["idempotency-key-reused", "invalid-signature"]
        info = await js.consumer_info(stream, example["DURABLE"])
        assert (info.num_pending, info.num_ack_pending) == (0, 0)
    finally:
        await js.delete_stream(stream)
        await connection.close()


def _reporting(cls: Any, refusals: list[str]) -> Any:
    """The consumer class, its refusals told to the test (the example keeps the default, a warning)."""
    def make(*args: Any, **options: Any) -> Any:
        return cls(*args, on_error=lambda message, why: refusals.append(why.reason.value), **options)
    return make
