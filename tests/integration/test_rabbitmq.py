"""The RabbitMQ channel against the machine's RabbitMQ (each test under exchange and queue names of
its own, deleted after): each outcome recorded as what it is, held against what the queues hold."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest

from outbox import Attempt, Intent, OnUnknown, Outcome, Status, Submission
from receivers import wire
from sender import hosts
from sender.rabbitmq import RabbitChannel, RabbitSpec
from tests import smtp
from tests.conftest import SECRET, eventually
from tests.kafka import Listener
from tests.rabbitmq import PORT, Rabbit, TcpProxy

from ..problems import assert_problem
from .conftest import Api, SenderEnv

KEY = "orders"


def options(rabbit: Rabbit, **spec: Any) -> dict[str, Any]:
    return {"channel": "rabbitmq", "url": f"amqp://guest@127.0.0.1:{PORT}/", "password": "guest",
            "allow_insecure": True, "allow_private_network": True, "exchange": rabbit.exchange, "routing_key": KEY,
            "timeout_seconds": 2.0, "secret": SECRET, **spec}


async def register(env: SenderEnv, rabbit: Rabbit, destination_id: str = "bus", **spec: Any) -> Any:
    return await env.box.put_destination(destination_id, RabbitSpec.model_validate(options(rabbit, **spec)))


@pytest.fixture
async def channel() -> AsyncIterator[RabbitChannel]:
    rabbitmq = RabbitChannel()
    yield rabbitmq
    await rabbitmq.aclose()


async def attempts_of(env: SenderEnv, action_id: str) -> list[Attempt]:
    return list((await env.box.history(action_id)).attempts)


async def run_until(env: SenderEnv, channel: RabbitChannel, action_id: str,
                    attempts: int = 1) -> tuple[Intent, Attempt]:
    """Run a worker until ``attempts`` attempts of the intent have finished."""

    async def finished() -> bool:
        found = await attempts_of(env, action_id)
        return len(found) >= attempts and found[-1].finished_at is not None

    async with env.running(channels={"rabbitmq": channel}):
        assert await eventually(finished, timeout=15)
    return await env.box.get(action_id), (await attempts_of(env, action_id))[-1]


def facts(attempt: Attempt) -> tuple[str | None, Submission | None, Outcome | None]:
    return attempt.stage, attempt.submission, attempt.outcome


async def test_a_message_carries_its_identity_the_canonical_payload_and_a_signature(env: SenderEnv, channel,
                                                                                    rabbit: Rabbit):
    await rabbit.bind(KEY)
    await register(env, rabbit)
    await env.enqueue("order-1", {"total": 12.5, "id": "o-1"}, destination="bus")
    intent, attempt = await run_until(env, channel, "order-1")
    assert intent.status is Status.DELIVERED
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
    assert attempt.external_id == f"{rabbit.exchange}/{KEY}/{attempt.attempt_id}"
    [message] = await rabbit.messages()
    assert message.body == intent.payload_json.encode() == b'{"id":"o-1","total":12.5}'
    assert (message.exchange, message.routing_key) == (rabbit.exchange, KEY)
    assert (message.delivery_mode, message.message_id, message.content_type) == (2, "acme/order-1", "application/json")
    assert message.timestamp is not None
    headers = dict(message.headers)
    assert all(isinstance(value, str) for value in headers.values()), headers
    signed = {wire.WEBHOOK_TIMESTAMP: headers.pop(wire.KAFKA_TIMESTAMP),
              wire.WEBHOOK_SIGNATURE: headers.pop(wire.KAFKA_SIGNATURE)}
    assert int(signed[wire.WEBHOOK_TIMESTAMP]) == int(message.timestamp.timestamp())
    assert headers == {wire.KAFKA_IDEMPOTENCY_KEY: "acme/order-1", wire.KAFKA_PAYLOAD_DIGEST: intent.payload_digest,
                       wire.KAFKA_ATTEMPT_ID: attempt.attempt_id, wire.KAFKA_FENCE: str(attempt.fence)}
    # signed as a webhook is, the idempotency key standing for webhook-id
    wire.verify_signature(SECRET, {wire.WEBHOOK_ID: "acme/order-1", **signed}, message.body,
                          now=int(signed[wire.WEBHOOK_TIMESTAMP]))
    with pytest.raises(wire.InvalidSignature):  # the signature covers the key
        wire.verify_signature(SECRET, {wire.WEBHOOK_ID: "acme/order-2", **signed}, message.body,
                              now=int(signed[wire.WEBHOOK_TIMESTAMP]))


async def test_the_default_exchange_delivers_to_the_queue_the_routing_key_names(env: SenderEnv, channel,
                                                                                rabbit: Rabbit):
    queue = await rabbit.declare_queue()
    await register(env, rabbit, exchange="", routing_key=queue)
    await env.enqueue("direct", destination="bus")
    _, attempt = await run_until(env, channel, "direct")
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
    assert attempt.external_id == f"amq.default/{queue}/{attempt.attempt_id}"
    assert [m.message_id for m in await rabbit.messages()] == ["acme/direct"]


async def test_a_message_no_queue_is_bound_for_comes_back_and_is_dead(env: SenderEnv, channel, rabbit: Rabbit):
    """The broker answers with basic.return (mandatory): it dropped the message, so it is not
    delivered; publishing it again would reach no queue either."""
    await rabbit.bind("refunds")  # a queue, bound for another key
    await register(env, rabbit)
    await env.enqueue("lost", destination="bus")
    intent, attempt = await run_until(env, channel, "lost")
    assert facts(attempt) == ("publish", Submission.SUBMITTED, Outcome.REJECTED), attempt.error
    assert intent.status is Status.DEAD
    assert f"exchange {rabbit.exchange} with routing key 'orders'" in (attempt.error or "")
    assert "312 NO_ROUTE" in (attempt.error or "") and "bind a queue" in (attempt.error or "")
    assert await rabbit.messages() == []


async def test_a_message_the_broker_refuses_is_submitted_and_retried(env: SenderEnv, channel, rabbit: Rabbit):
    """A queue that takes no more messages (its overflow: reject-publish) has the broker nack them."""
    await rabbit.bind(KEY, **{"x-max-length": 0, "x-overflow": "reject-publish"})
    await register(env, rabbit)
    await env.enqueue("full", destination="bus")
    intent, attempt = await run_until(env, channel, "full")
    assert facts(attempt) == ("publish", Submission.SUBMITTED, Outcome.RETRYABLE), attempt.error
    assert "basic.nack" in (attempt.error or "")
    assert intent.status is Status.PENDING


async def test_a_missing_exchange_is_not_submitted(env: SenderEnv, channel, rabbit: Rabbit):
    await register(env, rabbit)  # its exchange never declared
    await env.enqueue("nowhere", destination="bus")
    intent, attempt = await run_until(env, channel, "nowhere")
    assert facts(attempt) == ("channel", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error
    assert f"exchange {rabbit.exchange!r} does not exist in vhost '/': declare it" in (attempt.error or "")
    assert intent.status is Status.PENDING
    await rabbit.bind(KEY)  # declared now: the retry is delivered on the same channel object
    await env.advance_until_due("nowhere")
    intent, attempt = await run_until(env, channel, "nowhere", attempts=2)
    assert intent.status is Status.DELIVERED
    assert [m.message_id for m in await rabbit.messages()] == ["acme/nowhere"]


async def test_a_refused_password_is_not_submitted_and_never_shown(env: SenderEnv, channel, rabbit: Rabbit):
    await rabbit.bind(KEY)
    await register(env, rabbit, password="hunter2-wrong")
    await env.enqueue("denied", destination="bus")
    _, attempt = await run_until(env, channel, "denied")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error
    assert "refused the connection of user 'guest' to vhost '/'" in (attempt.error or "")
    assert "hunter2" not in (attempt.error or "")
    assert await rabbit.messages() == []


async def test_a_destination_without_a_password_is_dead_before_any_connection(env: SenderEnv, channel,
                                                                             rabbit: Rabbit):
    async with Listener() as listener:
        spec = options(rabbit, url=f"amqp://guest@127.0.0.1:{listener.port}/")
        del spec["password"]
        await env.box.put_destination("bus", RabbitSpec.model_validate(spec))
        await env.enqueue("no-password", destination="bus")
        intent, attempt = await run_until(env, channel, "no-password")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED), attempt.error
    assert "holds no password" in (attempt.error or "") and intent.status is Status.DEAD
    assert listener.connections == 0


async def test_a_broker_that_refuses_has_answered_and_one_that_is_gone_has_not(env: SenderEnv, channel,
                                                                                rabbit: Rabbit, closed_port: int):
    """What the destination's circuit counts: a broker that refused the credentials or has no such
    exchange answered (the circuit stays closed); a port nobody listens on did not."""
    cases = [({"password": "hunter2-wrong"}, True), ({}, True),  # (its exchange never declared)
             ({"url": f"amqp://guest@127.0.0.1:{closed_port}/"}, False)]
    for n, (change, answered) in enumerate(cases):
        destination, _ = await register(env, rabbit, f"bus-{n}", **change)
        await env.enqueue(f"asked-{n}", destination=f"bus-{n}")
        result = await channel.send(await env.box.get(f"asked-{n}"), destination, attempt_id=f"a-{n}", fence=1)
        assert (result.submission, result.answered) == (Submission.NOT_SUBMITTED, answered), result


async def test_no_broker_at_all_is_not_submitted(env: SenderEnv, channel, rabbit: Rabbit, closed_port: int):
    await register(env, rabbit, url=f"amqp://guest@127.0.0.1:{closed_port}/")
    await env.enqueue("closed", destination="bus")
    intent, attempt = await run_until(env, channel, "closed")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error
    assert intent.status is Status.PENDING


async def test_a_loopback_broker_without_the_private_network_is_never_connected_to(env: SenderEnv, channel,
                                                                                  rabbit: Rabbit):
    """A name resolving to loopback (the spec cannot see through a name): the guard refuses it
    before any connection, which the listener would count."""
    async with Listener() as listener:
        await register(env, rabbit, url=f"amqp://guest@localhost:{listener.port}/", allow_private_network=False)
        await env.enqueue("ssrf", destination="bus")
        intent, attempt = await run_until(env, channel, "ssrf")
    assert listener.connections == 0
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED), attempt.error
    assert "refused: localhost resolves only to non-public addresses" in (attempt.error or "")
    assert intent.status is Status.DEAD


async def test_the_same_listener_is_reached_when_the_private_network_is_allowed(env: SenderEnv, channel,
                                                                               rabbit: Rabbit):
    """The control for the test above: the same destination, allowed the private network."""
    async with Listener() as listener:
        await register(env, rabbit, url=f"amqp://guest@localhost:{listener.port}/")
        await env.enqueue("private", destination="bus")
        _, attempt = await run_until(env, channel, "private")
    assert listener.connections >= 1
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error


@pytest.mark.parametrize("named", ["localhost", "broker.example.com"])
async def test_amqps_verifies_the_brokers_certificate_against_the_urls_host(
        env: SenderEnv, rabbit: Rabbit, monkeypatch: pytest.MonkeyPatch, named: str):
    """A TLS-terminating proxy in front of the broker, its certificate for ``named``, reached as
    ``localhost`` through the guard (which connects the socket itself, to 127.0.0.1, judged public
    here): the certificate checks out only if TLS was given the URL's host name."""
    judged = hosts.is_public
    monkeypatch.setattr(hosts, "is_public", lambda address: address == "127.0.0.1" or judged(address))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    smtp.CA.issue_cert(named).configure_cert(server)
    client = ssl.create_default_context()
    smtp.CA.configure_trust(client)
    await rabbit.bind(KEY)
    async with TcpProxy(tls=server) as proxy:
        await register(env, rabbit, url=f"amqps://guest@localhost:{proxy.port}/", allow_insecure=False,
                       allow_private_network=False)
        await env.enqueue("over-tls", destination="bus")
        _, attempt = await run_until(env, RabbitChannel(tls_context=client), "over-tls")
    if named == "localhost":
        assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
        assert [m.message_id for m in await rabbit.messages()] == ["acme/over-tls"]
    else:
        assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error
        assert "CERTIFICATE_VERIFY_FAILED" in (attempt.error or "")
        assert await rabbit.messages() == []


class Batches(RabbitChannel):
    """The RabbitMQ channel, noting the attempts of each batch a worker hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def send_many(self, sends):
        self.batches.append([send.intent.action_id for send in sends])
        return await super().send_many(sends)


async def test_a_cycles_messages_are_published_as_one_batch_each_answered_in_its_place(open_env, rabbit: Rabbit):
    """One destination routes by ordering key: the message whose key no queue is bound for comes
    back, the others are confirmed, each attempt with its own result. (Authority allows all, so a
    cycle starts its leases together: none waits on a read of its grant, which under load could
    start in a cycle of its own.)"""
    env = await open_env(authority="allow-all")
    await rabbit.bind("k1")
    await register(env, rabbit, routing_key_from="ordering_key", routing_key="k1")
    channel = Batches()
    worker = env.worker(channels={"rabbitmq": channel}, concurrency=8)
    await env.enqueue("warm", destination="bus")
    assert await worker.run_once() == 1
    for action_id, key in (("a", "k1"), ("b", "k2"), ("c", None)):
        await env.box.enqueue(action_id=action_id, scope="acme", destination="bus", payload={"id": action_id},
                              ordering_key=key)
    assert await worker.run_once() == 3
    await worker.aclose()
    [handed] = channel.batches  # (the warm-up, alone in its cycle, was a send)
    assert sorted(handed) == ["a", "b", "c"]
    for action_id in ("a", "c"):
        attempt = (await attempts_of(env, action_id))[-1]
        assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
    attempt = (await attempts_of(env, "b"))[-1]
    assert facts(attempt) == ("publish", Submission.SUBMITTED, Outcome.REJECTED), attempt.error
    assert "routing key 'k2'" in (attempt.error or "")
    assert sorted(m.message_id for m in await rabbit.messages()) == ["acme/a", "acme/c", "acme/warm"]


async def test_the_destination_defaults_say_what_rabbitmq_needs(env: SenderEnv, rabbit: Rabbit):
    destination, _ = await register(env, rabbit)
    assert destination.on_unknown is OnUnknown.ALWAYS
    assert "password" not in destination.settings
    assert "guest" in destination.secrets


async def test_the_api_registers_rabbitmq_destinations_and_refuses_what_cannot_be_published(api: Api):
    base = {"channel": "rabbitmq", "url": "amqps://svc@rabbit.example.com/prod", "exchange": "events",
            "routing_key": "orders", "secret": SECRET}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"secret": None}, "is new: it needs a whsec_ secret to sign its messages"),
        ({"secret": "hunter2-pw"}, "give the broker's password as password"),
        ({"url": "amqps://svc:hunter2-pw@rabbit.example.com/"}, "must not hold the password"),
        ({"url": "http://rabbit.example.com/"}, "is not amqp://"),
        ({"url": "amqp://rabbit.example.com/?heartbeat=5"}, "without query"),
        ({"url": "amqp://10.0.0.1/", }, "is not a public address"),
        ({"url": "amqp://rabbit.example.com/", "password": "hunter2-pw"}, "use amqps://, or set allow_insecure"),
        ({"exchange": "bad exchange"}, "is not an exchange name"),
        ({"exchange": "", "routing_key": ""}, "the routing_key names the queue"),
        ({"routing_key": "x" * 256}, "routing_key is at most 255 bytes"),
        ({"routing_key_from": "action_id"}, "routing_key_from"),
        ({"reconcile": True}, "leave reconcile off"),
        ({"durable": True}, "durable"),
    ]
    async with api.client(api.admin) as admin:
        for change, words in cases:
            refused = await admin.put("/v1/destinations/bus", json={**base, **change})
            assert_problem(refused, 422, "invalid-input", words)
            assert "hunter2" not in refused.text
        registered = await admin.put("/v1/destinations/bus", json={**base, "password": "hunter2-pw"})
        assert registered.status_code == 201, registered.text
        shown = registered.json()
        assert (shown["channel"], shown["exchange"], shown["routing_key"], shown["on_unknown"]) == (
            "rabbitmq", "events", "orders", "always")
        assert "password" not in shown
        assert "hunter2" not in registered.text and SECRET not in registered.text
        assert shown["signing_secrets"] == 1
        updated = await admin.put("/v1/destinations/bus", json={**base, "secret": None, "routing_key": "refunds"})
        assert updated.status_code == 200, updated.text
        fetched = await admin.get("/v1/destinations/bus")
        assert "hunter2" not in fetched.text and fetched.json()["routing_key"] == "refunds"


async def test_an_update_without_the_password_keeps_it(env: SenderEnv, rabbit: Rabbit):
    await register(env, rabbit)
    spec = options(rabbit, routing_key="refunds")
    del spec["password"], spec["secret"]
    updated, created = await env.box.put_destination("bus", RabbitSpec.model_validate(spec))
    assert not created and updated.secrets == (SECRET, "guest")
    assert updated.settings["routing_key"] == "refunds"
    given = RabbitSpec.model_validate(options(rabbit, password="hunter2-pw"))
    assert "hunter2" not in repr(given) and "hunter2" not in given.model_dump_json()


async def test_a_destination_changed_gets_a_new_connection(env: SenderEnv, channel, rabbit: Rabbit):
    await rabbit.bind(KEY)
    await rabbit.bind("refunds")
    await register(env, rabbit)
    await env.enqueue("first", destination="bus")
    await run_until(env, channel, "first")
    await register(env, rabbit, routing_key="refunds")
    await env.enqueue("second", destination="bus")
    _, attempt = await run_until(env, channel, "second")
    assert attempt.external_id == f"{rabbit.exchange}/refunds/{attempt.attempt_id}"
    assert [m.routing_key for m in await rabbit.messages()] == [KEY, "refunds"]


async def test_probe_says_the_broker_cannot_be_asked(channel, env: SenderEnv, rabbit: Rabbit):
    destination, _ = await register(env, rabbit)
    await env.enqueue("asked", destination="bus")
    answer = await channel.probe(await env.box.get("asked"), destination, fence=1)
    assert answer.state is None and "cannot be asked" in (answer.error or "")


@pytest.mark.parametrize("held", ["confirm", "connect"])
async def test_a_destination_updated_mid_send_neither_cuts_that_send_nor_leaks_its_connection(
        env: SenderEnv, rabbit: Rabbit, held: str):
    """The destination changes while a send waits on the broker (its confirm, or its connection's
    handshake, held back by the proxy): the old link is closed only once that send is answered,
    so the send is delivered, not made unknown; after aclose no connection is left at the proxy."""
    await rabbit.bind(KEY)
    async with TcpProxy() as proxy:
        url = f"amqp://guest@127.0.0.1:{proxy.port}/"
        first, _ = await register(env, rabbit, url=url, timeout_seconds=10.0)
        channel = RabbitChannel()
        if held == "confirm":
            warm = await channel.send(await env.enqueue("warm", destination="bus"), first, attempt_id="w", fence=1)
            assert warm.outcome is Outcome.DELIVERED, warm.error
        proxy.answering.clear()
        sending = asyncio.ensure_future(channel.send(await env.enqueue("a", destination="bus"), first,
                                                     attempt_id="a", fence=1))
        await asyncio.sleep(0.3)  # (its publish, or its connection's first frames, forwarded: the answer held)
        env.clock.advance(1)
        updated, _ = await register(env, rabbit, url=url, timeout_seconds=9.0)
        assert updated.updated_at != first.updated_at
        after = asyncio.ensure_future(channel.send(await env.enqueue("b", destination="bus"), updated,
                                                   attempt_id="b", fence=1))
        # Held past the 5 s an old connection's close is given (``links.shut``): a link closed
        # at the update, not once idle, would be torn down with the send's confirm still held.
        await asyncio.sleep(5.5 if held == "confirm" else 0.3)
        proxy.answering.set()
        a, b = await asyncio.gather(sending, after)
        assert (a.submission, a.outcome) == (Submission.SUBMITTED, Outcome.DELIVERED), a.error
        assert (b.submission, b.outcome) == (Submission.SUBMITTED, Outcome.DELIVERED), b.error
        assert sorted(m.message_id for m in await rabbit.messages()) == sorted(
            ["acme/a", "acme/b"] + (["acme/warm"] if held == "confirm" else []))
        await channel.aclose()
        assert await eventually(lambda: proxy.open == 0), f"{proxy.open} connections left open"
