"""The NATS JetStream channel against real servers: the machine's shared one (each test a stream
of its own, deleted after) and private ``nats-server -js`` processes for TLS and credentials;
each failure recorded as what it is, held against what the stream really holds."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from standardwebhooks.webhooks import Webhook

from outbox import Attempt, Destination, Intent, OnUnknown, Outcome, Status, Submission, channels
from receivers import wire
from sender import hosts
from sender.nats import NatsChannel, NatsSpec
from tests import smtp
from tests.conftest import SECRET, eventually
from tests.kafka import Listener
from tests.nats import InfoProxy, NatsServer, Stream

from ..problems import assert_problem
from .conftest import Api, SenderEnv


@pytest.fixture
async def stream() -> AsyncIterator[Stream]:
    async with Stream.made() as made:
        yield made


@pytest.fixture
async def channel() -> AsyncIterator[NatsChannel]:
    made = NatsChannel()
    yield made
    await made.aclose()


async def register(env: SenderEnv, servers: list[str], subject: str, destination_id: str = "log",
                   **spec: Any) -> Any:
    options: dict[str, Any] = {"channel": "nats", "servers": servers, "subject": subject,
                               "allow_private_network": True, "timeout_seconds": 2.0, "secret": SECRET, **spec}
    return await env.box.put_destination(destination_id, NatsSpec.model_validate(options))


async def attempts_of(env: SenderEnv, action_id: str) -> list[Attempt]:
    return list((await env.box.history(action_id)).attempts)


async def run_until(env: SenderEnv, channel: NatsChannel, action_id: str, attempts: int = 1) -> tuple[Intent, Attempt]:
    """Run a worker until ``attempts`` attempts of the intent have finished (the worker closes
    the channel when it stops)."""

    async def finished() -> bool:
        found = await attempts_of(env, action_id)
        return len(found) >= attempts and found[-1].finished_at is not None

    async with env.running(channels={"nats": channel}):
        assert await eventually(finished, timeout=15)
    return await env.box.get(action_id), (await attempts_of(env, action_id))[-1]


def facts(attempt: Attempt) -> tuple[str | None, Submission | None, Outcome | None]:
    return attempt.stage, attempt.submission, attempt.outcome


async def test_a_message_carries_its_identity_and_the_canonical_payload(env: SenderEnv, channel, stream: Stream):
    await register(env, ["127.0.0.1:4222"], stream.subject)
    await env.enqueue("order-1", {"total": 10, "currency": "EUR"}, destination="log")
    intent, attempt = await run_until(env, channel, "order-1")
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
    assert intent.status is Status.DELIVERED
    [message] = await stream.messages()
    assert attempt.external_id == f"{stream.name}/{message.seq}"
    assert message.data == b'{"currency":"EUR","total":10}'
    headers = message.headers
    assert headers["Nats-Msg-Id"] == headers[wire.KAFKA_IDEMPOTENCY_KEY] == "acme/order-1"
    assert headers[wire.KAFKA_PAYLOAD_DIGEST] == intent.payload_digest
    assert (headers[wire.KAFKA_ATTEMPT_ID], headers[wire.KAFKA_FENCE]) == (attempt.attempt_id, str(attempt.fence))
    Webhook(SECRET).verify(message.data, {"webhook-id": "acme/order-1", "webhook-timestamp":
                                          headers[wire.KAFKA_TIMESTAMP],
                                          "webhook-signature": headers[wire.KAFKA_SIGNATURE]})


async def test_a_resend_is_dropped_by_the_duplicate_window_and_delivered_with_the_first_sequence(
        env: SenderEnv, channel, stream: Stream):
    """A lost PubAck, as the outbox sees it: the same intent published again (a new attempt). JetStream
    answers duplicate with the first message's sequence, which is the evidence it landed; the
    stream holds one message."""
    destination, _ = await register(env, ["127.0.0.1:4222"], stream.subject)
    intent = await env.enqueue("order-2", destination="log")
    first = await channel.send(intent, destination, attempt_id="a-1", fence=1)
    again = await channel.send(intent, destination, attempt_id="a-2", fence=2)
    assert (first.outcome, again.outcome) == (Outcome.DELIVERED, Outcome.DELIVERED)
    assert first.external_id == again.external_id == f"{stream.name}/1"
    assert "duplicate" not in (first.reply or "") and "duplicate" in (again.reply or "")
    assert [m.headers[wire.KAFKA_ATTEMPT_ID] for m in await stream.messages()] == ["a-1"]


async def test_a_cycles_messages_are_published_together_each_answered_in_its_place(
        env: SenderEnv, channel, stream: Stream):
    from sender.channel import Send

    destination, _ = await register(env, ["127.0.0.1:4222"], stream.subject)
    other, _ = await register(env, ["127.0.0.1:4222"], f"{stream.name}.nowhere", destination_id="elsewhere")
    sends = [Send(await env.enqueue(f"b-{n}", destination="log"), destination, f"at-{n}", 1) for n in range(5)]
    sends.insert(2, Send(await env.enqueue("lost", destination="elsewhere"), other, "at-lost", 1))
    results = await channel.send_many(sends)
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 2 + [Outcome.RETRYABLE] + [Outcome.DELIVERED] * 3
    assert [r.external_id for r in results if r.external_id] == [f"{stream.name}/{n}" for n in range(1, 6)]
    assert [m.headers[wire.KAFKA_ATTEMPT_ID] for m in await stream.messages()] == [f"at-{n}" for n in range(5)]


async def test_a_subject_no_stream_stores_is_submitted_and_retried(env: SenderEnv, channel, stream: Stream):
    """No responders: the server answered that nothing took the message, so nothing was stored."""
    await register(env, ["127.0.0.1:4222"], f"{stream.name}.unstored")
    await env.enqueue("no-stream", destination="log")
    intent, attempt = await run_until(env, channel, "no-stream")
    assert facts(attempt) == ("publish", Submission.SUBMITTED, Outcome.RETRYABLE)
    assert "no responders" in (attempt.error or "") and intent.status is Status.PENDING
    assert await stream.messages() == []


async def test_another_stream_than_the_expected_one_is_a_refusal(env: SenderEnv, channel, stream: Stream):
    await register(env, ["127.0.0.1:4222"], stream.subject, expected_stream="not_this_one")
    await env.enqueue("elsewhere", destination="log")
    intent, attempt = await run_until(env, channel, "elsewhere")
    assert facts(attempt) == ("publish", Submission.SUBMITTED, Outcome.REJECTED), attempt.error
    assert "10060" in (attempt.error or "") and intent.status is Status.DEAD
    assert await stream.messages() == []


async def test_no_server_at_all_is_not_submitted(env: SenderEnv, channel, closed_port: int):
    await register(env, [f"127.0.0.1:{closed_port}"], "orders", timeout_seconds=1.0)
    await env.enqueue("nowhere", destination="log")
    intent, attempt = await run_until(env, channel, "nowhere")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)
    assert intent.status is Status.PENDING


async def test_a_loopback_server_without_the_private_network_is_never_connected_to(env: SenderEnv, channel):
    async with Listener() as listener:
        await register(env, [f"localhost:{listener.port}"], "orders", allow_private_network=False)
        await env.enqueue("ssrf", destination="log")
        intent, attempt = await run_until(env, channel, "ssrf")
        await asyncio.sleep(0.2)  # time for any connection that would still be opening
    assert listener.connections == 0
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert "refused: localhost resolves only to non-public addresses" in (attempt.error or "")
    assert intent.status is Status.DEAD


PUBLIC = "127.0.0.2"  # a loopback address the test below judges public, as a server on the internet would be


async def test_a_server_the_cluster_advertises_is_never_connected_to(
        env: SenderEnv, channel, stream: Stream, monkeypatch: pytest.MonkeyPatch):
    """A hostile server (the proxy, at an address the guard allows) advertises a listener on
    loopback as another server of its cluster. Delivered through the proxy; then every connection
    dropped, and the next send connects to the destination's own server again, never the listener."""
    judged = hosts.is_public
    monkeypatch.setattr(hosts, "is_public", lambda address: address == PUBLIC or judged(address))
    async with Listener() as listener, InfoProxy(("127.0.0.1", 4222), PUBLIC,
                                                 f"127.0.0.1:{listener.port}") as proxy:
        destination, _ = await register(env, [f"{PUBLIC}:{proxy.port}"], stream.subject,
                                        allow_private_network=False)
        first = await channel.send(await env.enqueue("one", destination="log"), destination, attempt_id="a", fence=1)
        proxy.drop()
        await asyncio.sleep(0.2)  # the client sees its connection closed
        second = await channel.send(await env.enqueue("two", destination="log"), destination, attempt_id="b",
                                    fence=1)
        await asyncio.sleep(0.2)
    assert proxy.rewritten >= 2 and proxy.connections == 2
    assert listener.connections == 0
    assert (first.outcome, second.outcome) == (Outcome.DELIVERED, Outcome.DELIVERED), (first.error, second.error)
    assert len(await stream.messages()) == 2


def tls_server(tmp_path: Path, name: str) -> NatsServer:
    cert = smtp.CA.issue_cert(name)
    cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    cert.private_key_pem.write_to_path(tmp_path / "key.pem")
    return NatsServer(tmp_path, extra=("--tls", "--tlscert", str(tmp_path / "cert.pem"),
                                       "--tlskey", str(tmp_path / "key.pem"), "--user", "svc",
                                       "--pass", "hunter2-pw")).start()


def trusting() -> ssl.SSLContext:
    client = ssl.create_default_context()
    smtp.CA.configure_trust(client)
    return client


@pytest.mark.parametrize(("name", "password", "expected"), [
    ("localhost", "hunter2-pw", ("done", Submission.SUBMITTED, Outcome.DELIVERED)),
    ("localhost", "wrong-pw", ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED)),
    ("nats.example", "hunter2-pw", ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)),
])
async def test_tls_verifies_the_servers_name_and_the_password_is_checked(
        env: SenderEnv, tmp_path: Path, name: str, password: str, expected: tuple[Any, ...]):
    """The client connects to the checked address and verifies the certificate against the
    server's name: one naming only ``localhost`` checks out for ``localhost:port`` (not for
    127.0.0.1); one for another name fails before anything is written, and so do wrong credentials."""
    server = tls_server(tmp_path, name)
    try:
        if name == "localhost":  # (a stream to store the message, made over the same TLS)
            admin = await nats.connect(f"tls://localhost:{server.port}", tls=trusting(), user="svc",
                                       password="hunter2-pw", allow_reconnect=False)
            await admin.jetstream().add_stream(name="orders", subjects=["orders.x"])
            await admin.close()
        await register(env, [f"localhost:{server.port}"], "orders.x", tls=True, auth="password", username="svc",
                       password=password)
        await env.enqueue("over-tls", destination="log")
        _, attempt = await run_until(env, NatsChannel(tls_context=trusting()), "over-tls")
    finally:
        server.stop()
    assert facts(attempt)[1:] == expected[1:], attempt.error
    if expected[2] is Outcome.REJECTED:
        assert "refused the destination's credentials" in (attempt.error or "")
    if name != "localhost":
        assert "CERTIFICATE_VERIFY_FAILED" in (attempt.error or ""), attempt.error


async def test_the_destination_defaults_say_what_jetstream_needs(env: SenderEnv, stream: Stream):
    destination, _ = await register(env, ["nats://127.0.0.1"], stream.subject)
    assert destination.on_unknown is OnUnknown.ALWAYS
    assert destination.settings["servers"] == ["127.0.0.1:4222"]


async def test_the_api_registers_nats_destinations_and_refuses_what_cannot_be_published(api: Api):
    base = {"channel": "nats", "servers": ["nats.example.com:4222"], "subject": "orders.created", "secret": SECRET}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"secret": None}, "is new: it needs a whsec_ secret to sign its messages"),
        ({"secret": "hunter2-pw"}, "give the password as password"),
        ({"password": "hunter2-pw"}, "password needs auth: password"),
        ({"token": "t0ken"}, "token needs auth: token"),
        ({"subject": "orders.*"}, "is not a NATS subject"),
        ({"subject": "orders.>"}, "is not a NATS subject"),
        ({"subject": "$JS.API.STREAM.DELETE.orders"}, "is not a NATS subject"),
        ({"subject": "_INBOX.abc"}, "is not a NATS subject"),
        ({"subject": "orders..created"}, "is not a NATS subject"),
        ({"servers": ["nats.example.com"]}, "has no port"),
        ({"servers": ["nats://svc:pw@nats.example.com:4222"]}, "no credentials"),
        ({"servers": ["10.0.0.1:4222"]}, "is not a public address"),
        ({"servers": []}, "servers"),
        ({"expected_stream": "a.b"}, "is not a stream name"),
        ({"auth": "password", "username": "svc", "tls": True, "password": "whsec_x"}, "must not start with"),
        ({"auth": "token"}, "set tls, or allow_insecure"),
        ({"reconcile": True}, "leave reconcile off"),
    ]
    async with api.client(api.admin) as admin:
        for change, words in cases:
            refused = await admin.put("/v1/destinations/log", json={**base, **change})
            assert_problem(refused, 422, "invalid-input", words)
        registered = await admin.put("/v1/destinations/log", json={
            **base, "tls": True, "auth": "password", "username": "svc", "password": "hunter2-pw"})
        assert registered.status_code == 201, registered.text
        shown = registered.json()
        assert (shown["channel"], shown["subject"], shown["servers"], shown["on_unknown"]) == (
            "nats", "orders.created", ["nats.example.com:4222"], "always")
        assert "hunter2" not in registered.text and SECRET not in registered.text
        assert "password" not in shown and "token" not in shown and shown["signing_secrets"] == 1
        updated = await admin.put("/v1/destinations/log", json={**base, "secret": None, "tls": True,
                                                                 "auth": "token", "token": "s3cret-token"})
        assert updated.status_code == 200, updated.text
        listed = await admin.get("/v1/destinations/log")
        assert "s3cret" not in listed.text and "hunter2" not in listed.text and listed.json()["signing_secrets"] == 1


def test_an_attempt_records_the_subject_and_the_servers_as_its_target():
    at = datetime(2030, 1, 1, tzinfo=UTC)
    destination = Destination("d", "nats", {"subject": "orders.paid", "servers": ["n1:4222", "n2:4222"]}, (), False,
                              86_400, OnUnknown.ALWAYS, 10.0, False, False, False, at, at)
    assert channels.target(destination) == "subject orders.paid on n1:4222, n2:4222"


def test_a_password_or_token_is_never_in_the_settings_their_repr_or_their_schema():
    spec = NatsSpec.model_validate({"channel": "nats", "servers": ["nats.example.com:4222"], "subject": "orders",
                                    "secret": SECRET, "tls": True, "auth": "password", "username": "svc",
                                    "password": "hunter2-pw"})
    assert all("hunter2" not in shown for shown in (repr(spec), str(spec.settings()), spec.model_dump_json()))
    schema = NatsSpec.model_json_schema()["properties"]
    assert schema["password"]["writeOnly"] is True and schema["token"]["writeOnly"] is True


@pytest.mark.parametrize(("token", "expected"), [
    ("t0ken-of-svc", ("done", Submission.SUBMITTED, Outcome.DELIVERED)),
    ("wrong-token", ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED)),
])
async def test_a_token_is_the_one_the_server_checks(env: SenderEnv, tmp_path: Path, token: str,
                                                      expected: tuple[Any, ...]):
    server = NatsServer(tmp_path, extra=("--auth", "t0ken-of-svc")).start()
    try:
        admin = await nats.connect(server.url, token="t0ken-of-svc", allow_reconnect=False)
        await admin.jetstream().add_stream(name="orders", subjects=["orders.x"])
        await admin.close()
        await register(env, [server.address], "orders.x", auth="token", token=token, allow_insecure=True)
        await env.enqueue("with-token", destination="log")
        _, attempt = await run_until(env, NatsChannel(), "with-token")
    finally:
        server.stop()
    assert facts(attempt) == expected, attempt.error


async def test_a_message_larger_than_the_servers_max_payload_is_refused_before_it_is_written(
        env: SenderEnv, tmp_path: Path):
    (tmp_path / "small.conf").write_text("max_payload: 512\n")
    server = NatsServer(tmp_path, extra=("-c", str(tmp_path / "small.conf"))).start()
    try:
        await register(env, [server.address], "orders.x")
        await env.enqueue("big", {"note": "x" * 600}, destination="log")
        intent, attempt = await run_until(env, NatsChannel(), "big")
    finally:
        server.stop()
    assert facts(attempt) == ("publish", Submission.NOT_SUBMITTED, Outcome.REJECTED), attempt.error
    assert "max_payload" in (attempt.error or "") and intent.status is Status.DEAD


async def test_a_server_silent_after_the_publish_is_maybe_submitted_and_its_connection_replaced(
        env: SenderEnv, tmp_path: Path):
    """Silent once connected (the proxy in front holds the server's answers back: a SIGSTOP of the
    server took effect too late on a loaded machine, and the ack came in time): the publish is
    written and never acknowledged. The connection may be
    dead without knowing it, so the next send opens a new one (counted by a proxy in front); the
    resend, within the duplicate window, is answered duplicate: one message stored."""
    server = NatsServer(tmp_path).start()
    channel = NatsChannel()
    try:
        async with Stream.made(server.url) as stream, InfoProxy(("127.0.0.1", server.port), "127.0.0.1",
                                                                server.address) as proxy:
            destination, _ = await register(env, [f"127.0.0.1:{proxy.port}"], stream.subject, timeout_seconds=0.5)
            assert (await channel.send(await env.enqueue("first", destination="log"), destination, attempt_id="a",
                                       fence=1)).outcome is Outcome.DELIVERED
            intent = await env.enqueue("silent", destination="log")
            proxy.pause()  # the server's answers held back, as a server stopped would not send them
            try:
                lost = await channel.send(intent, destination, attempt_id="b", fence=1)
            finally:
                proxy.resume()
            again = await channel.send(intent, destination, attempt_id="c", fence=2)
            held = await stream.messages()
    finally:
        await channel.aclose()
        server.stop()
    assert (lost.submission, lost.outcome, lost.answered) == (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, False)
    assert again.outcome is Outcome.DELIVERED and "duplicate" in (again.reply or ""), again
    assert proxy.connections == 2
    assert [m.headers[wire.KAFKA_ATTEMPT_ID] for m in held] == ["a", "b"]


async def test_tls_is_used_even_when_the_servers_info_does_not_ask_for_it(env: SenderEnv, tmp_path: Path):
    """An attacker on the path strips ``tls_required`` from the server's INFO: the client upgrades to
    TLS all the same, so neither the CONNECT nor the password crosses in the clear."""
    server = tls_server(tmp_path, "localhost")
    channel = NatsChannel(tls_context=trusting())
    try:
        admin = await nats.connect(f"tls://localhost:{server.port}", tls=trusting(), user="svc",
                                   password="hunter2-pw", allow_reconnect=False)
        await admin.jetstream().add_stream(name="orders", subjects=["orders.x"])
        await admin.close()
        async with InfoProxy(("127.0.0.1", server.port), "127.0.0.1", server.address, strip_tls=True) as proxy:
            destination, _ = await register(env, [f"localhost:{proxy.port}"], "orders.x", tls=True, auth="password",
                                            username="svc", password="hunter2-pw")
            result = await channel.send(await env.enqueue("stripped", destination="log"), destination,
                                        attempt_id="a", fence=1)
    finally:
        await channel.aclose()
        server.stop()
    assert proxy.rewritten >= 1 and proxy.sent
    assert b"hunter2-pw" not in proxy.sent and b"CONNECT" not in proxy.sent
    assert result.outcome is Outcome.DELIVERED, result.error


async def test_tls_to_a_server_without_it_is_not_submitted(env: SenderEnv, tmp_path: Path):
    server = NatsServer(tmp_path).start()
    channel = NatsChannel(tls_context=trusting())
    try:
        async with Stream.made(server.url) as stream:
            destination, _ = await register(env, [f"localhost:{server.port}"], stream.subject, tls=True)
            result = await channel.send(await env.enqueue("plain", destination="log"), destination,
                                        attempt_id="a", fence=1)
            held = await stream.messages()
    finally:
        await channel.aclose()
        server.stop()
    assert (result.stage, result.submission, result.outcome) == (
        "connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), result
    assert held == []


async def test_a_large_batch_to_a_stalled_server_settles_within_its_timeout(env: SenderEnv, tmp_path: Path):
    """SIGSTOP once connected, then a batch far larger than the sockets' buffers: nats-py's forced
    flush (over 2 MiB unflushed) would wait on the stalled server for as long as it stays stopped.
    The batch settles while the server is still stopped: what was handed to the connection
    ``maybe_submitted``, the rest ``not_submitted``; once the server resumes, the stream holds none of
    the ``not_submitted`` ones."""
    from sender.channel import Send

    server = NatsServer(tmp_path).start()
    channel = NatsChannel()
    try:
        async with Stream.made(server.url) as stream:
            destination, _ = await register(env, [server.address], stream.subject, timeout_seconds=1.0)
            first = await channel.send(await env.enqueue("first", destination="log"), destination, attempt_id="f",
                                       fence=1)
            assert first.outcome is Outcome.DELIVERED, first.error
            sends = [Send(await env.enqueue(f"big-{n}", {"note": f"{n}" + "x" * 900_000}, destination="log"),
                          destination, f"at-{n}", 1) for n in range(40)]
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                batch = asyncio.create_task(channel.send_many(sends))
                await asyncio.wait({batch}, timeout=30)
                settled = batch.done()
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            results = await batch
            await asyncio.sleep(1)  # (time for the server to read what the kernel held for it)
            stored = {m.headers[wire.KAFKA_ATTEMPT_ID] for m in await stream.messages()}
    finally:
        await channel.aclose()
        server.stop()
    assert settled, "the batch waited on the stopped server"
    facts_of = {(r.submission, r.outcome) for r in results}
    assert facts_of <= {(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN), (Submission.NOT_SUBMITTED, Outcome.RETRYABLE)}
    assert results[0].submission is Submission.MAYBE_SUBMITTED and results[-1].submission is Submission.NOT_SUBMITTED
    unsent = {send.attempt_id for send, result in zip(sends, results, strict=True)
              if result.submission is Submission.NOT_SUBMITTED}
    assert not stored & unsent


async def test_a_replaced_connection_is_closed_once_its_sends_are_answered(env: SenderEnv, channel, stream: Stream):
    """A send awaits its PubAck (held back by the proxy) when the destination changes: the next send
    opens a new connection, and the old one stays until the PubAck has come, then closes."""
    async with InfoProxy(("127.0.0.1", 4222), "127.0.0.1", "127.0.0.1:4222") as proxy:
        old, _ = await register(env, [f"127.0.0.1:{proxy.port}"], stream.subject, timeout_seconds=10.0)
        assert (await channel.send(await env.enqueue("one", destination="log"), old, attempt_id="a",
                                   fence=1)).outcome is Outcome.DELIVERED
        proxy.pause()
        waiting = asyncio.create_task(channel.send(await env.enqueue("two", destination="log"), old, attempt_id="b",
                                                   fence=1))
        assert await eventually(lambda: holds(stream, 2), timeout=10)  # stored; its PubAck held back
        env.clock.advance(1)
        new, _ = await register(env, ["127.0.0.1:4222"], stream.subject)
        changed = await channel.send(await env.enqueue("three", destination="log"), new, attempt_id="c", fence=1)
        still_open = proxy.open
        proxy.resume()
        answered = await waiting
        assert await eventually(lambda: proxy.open == 0, timeout=10)
    assert changed.outcome is Outcome.DELIVERED, changed.error
    assert still_open == 1
    assert (answered.outcome, answered.external_id) == (Outcome.DELIVERED, f"{stream.name}/2"), answered.error


async def test_a_connection_opened_while_its_destination_changes_is_closed_not_leaked(
        env: SenderEnv, channel, stream: Stream):
    """A send is still connecting (the server's INFO held back) when the destination changes and a
    send of the new version goes ahead: the old version's connection, once open and used, is closed,
    not left open on an entry no longer kept."""
    async with InfoProxy(("127.0.0.1", 4222), "127.0.0.1", "127.0.0.1:4222") as proxy:
        old, _ = await register(env, [f"127.0.0.1:{proxy.port}"], stream.subject, timeout_seconds=10.0)
        proxy.pause()
        connecting = asyncio.create_task(channel.send(await env.enqueue("one", destination="log"), old,
                                                      attempt_id="a", fence=1))
        assert await eventually(lambda: proxy.connections == 1, timeout=10)
        env.clock.advance(1)
        new, _ = await register(env, ["127.0.0.1:4222"], stream.subject)
        changed = await channel.send(await env.enqueue("two", destination="log"), new, attempt_id="b", fence=1)
        proxy.resume()
        first = await connecting
        assert await eventually(lambda: proxy.open == 0, timeout=10)
    assert (first.outcome, changed.outcome) == (Outcome.DELIVERED, Outcome.DELIVERED), (first.error, changed.error)


async def holds(stream: Stream, n: int) -> bool:
    return len(await stream.messages()) == n


def test_a_connections_repr_shows_none_of_the_destinations_secrets():
    from sender.nats.connections import Connection

    spec = NatsSpec.model_validate({"channel": "nats", "servers": ["nats.example.com:4222"], "subject": "orders",
                                    "tls": True, "auth": "password", "username": "svc"})
    entry = Connection(spec, datetime(2030, 1, 1, tzinfo=UTC), signing=((SECRET, "hunter2-pw"), (SECRET,)))
    assert "hunter2" not in repr(entry) and SECRET not in repr(entry)
