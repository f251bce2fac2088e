"""The SQS channel against moto's server (tests/sqs.py): what a message carries, FIFO
deduplication, batches, the registration's checks, the SSRF guard and TLS, each failure recorded
as what it is, held against what the queue really holds."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from outbox import Attempt, Intent, InvalidInput, OnUnknown, Outcome, Status, Submission
from receivers import wire
from sender import hosts
from sender.channel import Send
from sender.sqs import SqsChannel, SqsSpec
from tests import smtp
from tests.conftest import SECRET, eventually
from tests.faults.proxy import Proxy
from tests.kafka import Listener
from tests.sqs import ACCESS_KEY_ID, ACCOUNT, REGION, SECRET_ACCESS_KEY, MotoServer, queue_name

from ..problems import assert_problem
from .conftest import Api, SenderEnv


async def register(env: SenderEnv, moto: MotoServer, url: str, destination_id: str = "q", **spec: Any) -> Any:
    options: dict[str, Any] = {"channel": "sqs", "region": REGION, "queue_url": url, "endpoint_url": moto.endpoint,
                               "allow_insecure": True, "allow_private_network": True, "timeout_seconds": 2.0,
                               "access_key_id": ACCESS_KEY_ID, "secret_access_key": SECRET_ACCESS_KEY,
                               "secret": SECRET, **spec}
    destination, _ = await env.box.put_destination(destination_id, SqsSpec.model_validate(options))
    return destination


@pytest.fixture
def api_settings() -> dict[str, Any]:
    """The served API takes payloads up to 1 MiB (its default), so SQS's own limit is the one met."""
    return {"max_payload_bytes": 1024 * 1024, "worker": False}


@pytest.fixture
async def channel() -> AsyncIterator[SqsChannel]:
    sqs = SqsChannel()
    yield sqs
    await sqs.aclose()


async def attempts_of(env: SenderEnv, action_id: str) -> list[Attempt]:
    return list((await env.box.history(action_id)).attempts)


async def run_until(env: SenderEnv, channel: SqsChannel, action_id: str, attempts: int = 1) -> tuple[Intent, Attempt]:
    """Run a worker until ``attempts`` attempts of the intent have finished."""
    async def finished() -> bool:
        found = await attempts_of(env, action_id)
        return len(found) >= attempts and found[-1].finished_at is not None

    async with env.running(channels={"sqs": channel}):
        assert await eventually(finished, timeout=15)
    return await env.box.get(action_id), (await attempts_of(env, action_id))[-1]


def facts(attempt: Attempt) -> tuple[str | None, Submission | None, Outcome | None]:
    return attempt.stage, attempt.submission, attempt.outcome


def attributes(message: dict[str, Any]) -> dict[str, str]:
    return {name: value["StringValue"] for name, value in message.get("MessageAttributes", {}).items()}


async def test_a_message_carries_its_identity_and_the_canonical_payload(env: SenderEnv, channel, moto: MotoServer):
    url = await moto.create_queue(queue_name())
    destination = await register(env, moto, url)
    assert destination.on_unknown is OnUnknown.ALWAYS
    await env.enqueue("order-1", {"total": 12.5, "id": "o-1"}, destination="q")
    intent, attempt = await run_until(env, channel, "order-1")
    assert intent.status is Status.DELIVERED
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
    [message] = await moto.received(url)
    assert attempt.external_id == message["MessageId"]
    assert message["Body"] == intent.payload_json == '{"id":"o-1","total":12.5}'
    headers = attributes(message)
    signed = {wire.KAFKA_TIMESTAMP: headers.pop(wire.KAFKA_TIMESTAMP),
              wire.KAFKA_SIGNATURE: headers.pop(wire.KAFKA_SIGNATURE)}
    assert headers == {wire.KAFKA_IDEMPOTENCY_KEY: "acme/order-1", wire.KAFKA_PAYLOAD_DIGEST: intent.payload_digest,
                       wire.KAFKA_ATTEMPT_ID: attempt.attempt_id, wire.KAFKA_FENCE: str(attempt.fence)}
    assert all(value["DataType"] == "String" for value in message["MessageAttributes"].values())
    # signed as a webhook is, the idempotency key standing for webhook-id (the reference library agrees)
    assert Webhook(SECRET).verify(message["Body"], {"webhook-id": "acme/order-1", **signed}) == {
        "id": "o-1", "total": 12.5}


async def test_a_fifo_resend_of_the_same_intent_is_dropped_by_its_deduplication_id(
        env: SenderEnv, channel: SqsChannel, moto: MotoServer):
    """moto implements SQS's five-minute deduplication: the second send of the intent (a retry
    after an unknown outcome, a new attempt) is answered as sent, and the queue holds one message."""
    url = await moto.create_queue(queue_name(fifo=True))
    destination = await register(env, moto, url)
    intent = await env.enqueue("pay-1", {"amount": 5}, destination="q", ordering_key="customer-7")
    first, again = [(await channel.send_many([Send(intent, destination, attempt, fence)]))[0]
                    for attempt, fence in (("a-1", 1), ("a-2", 2))]
    assert (first.submission, first.outcome) == (again.submission, again.outcome) == (
        Submission.SUBMITTED, Outcome.DELIVERED)
    [message] = await moto.received(url)
    assert attributes(message)[wire.KAFKA_ATTEMPT_ID] == "a-1"
    assert message["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(b"acme/pay-1").hexdigest()
    assert message["Attributes"]["MessageGroupId"] == "customer-7"  # the ordering key


async def test_a_cycle_of_more_than_ten_messages_is_sent_in_batches_each_answered_in_its_place(
        env: SenderEnv, channel: SqsChannel, moto: MotoServer):
    """23 small messages and three of 100 KiB, through a proxy counting requests (moto closes each
    connection after its answer): batches of at most ten, and no request over 256 KiB (moto does
    not check that sum; SQS does), so 10, 10, 3 small and two large, then the last large one.
    Every message is delivered with its own MessageId, one message each."""
    url = await moto.create_queue(queue_name())
    with Proxy(moto.port, weights={"pass": 1.0}) as proxy:
        destination = await register(env, moto, url, endpoint_url=proxy.url)
        intents = [await env.enqueue(f"m-{n}", {"n": n}, destination="q") for n in range(23)]
        intents += [await env.enqueue(f"big-{n}", {"blob": "x" * 100_000}, destination="q") for n in range(3)]
        results = await channel.send_many([Send(intent, destination, f"a-{n}", 1)
                                           for n, intent in enumerate(intents)])
        requests = proxy.faults["pass"]
    assert {(r.submission, r.outcome) for r in results} == {(Submission.SUBMITTED, Outcome.DELIVERED)}
    assert requests == 4
    received = await moto.received(url)
    by_key = {attributes(m)[wire.KAFKA_IDEMPOTENCY_KEY]: m["MessageId"] for m in received}
    assert len(received) == len(by_key) == 26
    assert [by_key[intent.key] for intent in intents] == [r.external_id for r in results]


async def test_a_queue_that_does_not_exist_is_submitted_and_rejected(env: SenderEnv, channel, moto: MotoServer):
    await register(env, moto, f"{moto.endpoint}/{ACCOUNT}/{queue_name()}")
    await env.enqueue("lost", destination="q")
    intent, attempt = await run_until(env, channel, "lost")
    assert facts(attempt) == ("send", Submission.SUBMITTED, Outcome.REJECTED)
    assert attempt.status_code == 400 and "QueueDoesNotExist" in (attempt.error or "")
    assert intent.status is Status.DEAD


async def test_no_server_at_all_is_not_submitted(env: SenderEnv, channel, moto: MotoServer, closed_port: int):
    await register(env, moto, f"http://127.0.0.1:{closed_port}/{ACCOUNT}/q", endpoint_url=f"http://127.0.0.1:{closed_port}")
    await env.enqueue("nowhere", destination="q")
    intent, attempt = await run_until(env, channel, "nowhere")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error
    assert intent.status is Status.PENDING


async def test_a_server_silent_after_the_request_is_maybe_submitted(env: SenderEnv, channel, moto: MotoServer):
    """A listener that takes the request and never answers: the destination's timeout passes with
    the request written, which SQS may have acted on."""
    heard = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        heard.set()
        await asyncio.sleep(30)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await register(env, moto, f"http://127.0.0.1:{port}/{ACCOUNT}/q", endpoint_url=f"http://127.0.0.1:{port}",
                       timeout_seconds=0.5)
        await env.enqueue("silent", destination="q")
        _, attempt = await run_until(env, channel, "silent")
    finally:
        server.close()
    assert heard.is_set()
    assert facts(attempt) == ("send", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN), attempt.error
    assert not attempt.external_id


async def test_a_loopback_endpoint_without_the_private_network_is_never_connected_to(
        env: SenderEnv, channel: SqsChannel):
    """An endpoint named ``localhost`` (a name, so registration cannot judge it) without
    ``allow_private_network``: the guard resolves it, refuses its loopback addresses, and the
    listener there counts no connection."""
    async with Listener() as listener:
        endpoint = f"http://localhost:{listener.port}"
        await env.box.put_destination("q", SqsSpec.model_validate({
            "channel": "sqs", "region": REGION, "queue_name": "orders", "account_id": ACCOUNT,
            "endpoint_url": endpoint, "allow_insecure": True, "access_key_id": ACCESS_KEY_ID,
            "secret_access_key": SECRET_ACCESS_KEY, "secret": SECRET, "timeout_seconds": 2.0}))
        await env.enqueue("ssrf", destination="q")
        intent, attempt = await run_until(env, channel, "ssrf")
        await asyncio.sleep(0.2)  # time for any connection still being opened
    assert listener.connections == 0
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED), attempt.error
    assert "non-public" in (attempt.error or "") and intent.status is Status.DEAD


async def test_the_same_endpoint_is_reached_when_the_private_network_is_allowed(env: SenderEnv, channel: SqsChannel):
    """The control for the test above: the listener counts the connection."""
    async with Listener() as listener:
        await env.box.put_destination("q", SqsSpec.model_validate({
            "channel": "sqs", "region": REGION, "queue_name": "orders", "account_id": ACCOUNT,
            "endpoint_url": f"http://localhost:{listener.port}", "allow_insecure": True,
            "allow_private_network": True, "access_key_id": ACCESS_KEY_ID,
            "secret_access_key": SECRET_ACCESS_KEY, "secret": SECRET, "timeout_seconds": 2.0}))
        await env.enqueue("private", destination="q")
        _, attempt = await run_until(env, channel, "private")
    assert listener.connections >= 1
    assert attempt.submission is not Submission.NOT_SUBMITTED, attempt.error


async def tls_front(moto: MotoServer, context: ssl.SSLContext) -> asyncio.Server:
    """A TLS listener on 127.0.0.1 forwarding each connection to moto's plain HTTP."""
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", moto.port)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    return await asyncio.start_server(forward, "127.0.0.1", 0, ssl=context)


@pytest.mark.parametrize(("named", "delivered"), [("localhost", True), ("sqs.example.com", False)])
async def test_a_guarded_tls_connection_verifies_the_certificate_against_the_endpoints_name(
        env: SenderEnv, moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str,
        delivered: bool):
    """The guard checks the address (127.0.0.1, judged public here) and TLS still checks the
    certificate against the endpoint's name: one issued for ``localhost`` checks out, one for
    another name fails the handshake, before anything is written (not submitted)."""
    judged = hosts.is_public
    monkeypatch.setattr(hosts, "is_public", lambda address: address == "127.0.0.1" or judged(address))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    smtp.CA.issue_cert(named).configure_cert(server_context)
    ca = tmp_path / "ca.pem"
    smtp.CA.cert_pem.write_to_path(str(ca))
    url = await moto.create_queue(queue_name())
    front = await tls_front(moto, server_context)
    endpoint = f"https://localhost:{front.sockets[0].getsockname()[1]}"
    channel = SqsChannel(verify=str(ca))
    try:
        await env.box.put_destination("q", SqsSpec.model_validate({
            "channel": "sqs", "region": REGION, "queue_url": url, "endpoint_url": endpoint,
            "access_key_id": ACCESS_KEY_ID, "secret_access_key": SECRET_ACCESS_KEY, "secret": SECRET,
            "timeout_seconds": 2.0}))
        await env.enqueue("over-tls", destination="q")
        _, attempt = await run_until(env, channel, "over-tls")
    finally:
        front.close()
    if delivered:
        assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
        assert len(await moto.received(url)) == 1
    else:
        assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error
        assert await moto.received(url) == []


async def test_a_payload_sqs_could_never_take_is_refused_at_enqueue(env: SenderEnv, moto: MotoServer):
    await register(env, moto, f"{moto.endpoint}/{ACCOUNT}/q")
    with pytest.raises(InvalidInput, match="an SQS message holds at most"):
        await env.enqueue("huge", {"blob": "x" * 260_000}, destination="q")
    with pytest.raises(InvalidInput, match=r"U\+FFFF"):
        await env.enqueue("odd", {"text": "\uffff"}, destination="q")


async def test_the_api_registers_sqs_destinations_and_refuses_what_cannot_be_sent(api: Api):
    base = {"channel": "sqs", "region": "eu-west-1", "queue_url": f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/o",
            "access_key_id": ACCESS_KEY_ID, "secret_access_key": SECRET_ACCESS_KEY, "secret": SECRET}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"secret": None}, "is new: it needs a whsec_ secret to sign its messages"),
        ({"secret": "hunter2-hunter2-pw"}, "give the secret access key as secret_access_key"),
        ({"secret_access_key": None}, "secret_access_key: an SQS destination needs the secret access key"),
        ({"secret_access_key": "short"}, "secret_access_key is not"),
        ({"region": "Europe"}, "region 'Europe' is not an AWS region"),
        ({"queue_url": "https://sqs.eu-west-1.amazonaws.com/o"}, "is not an SQS queue URL"),
        ({"queue_name": "o", "account_id": ACCOUNT}, "give the queue as queue_url, or as queue_name"),
        ({"queue_url": None, "queue_name": "o"}, "give queue_name and account_id together"),
        ({"queue_url": None, "queue_name": "bad name", "account_id": ACCOUNT}, "queue_name 'bad name' is not"),
        ({"endpoint_url": "http://sqs.example.com"}, "use https, or set allow_insecure"),
        ({"endpoint_url": "https://10.0.0.1"}, "is not a public address"),
        ({"endpoint_url": "https://sqs.example.com/path"}, "without a path"),
        ({"session_token": "FwoGZXIvYXdzEJr//////////wEaDM", "secret_access_key": None},
         "give session_token with the secret_access_key"),
        ({"reconcile": True}, "leave reconcile off"),
        ({"access_key_id": "ak"}, "access_key_id 'ak' is not"),
        ({"region": "us-east-1"}, "queue_url names a queue in eu-west-1, but region is us-east-1"),
    ]
    async with api.client(api.admin) as admin:
        for change, words in cases:
            refused = await admin.put("/v1/destinations/q", json={**base, **change})
            assert_problem(refused, 422, "invalid-input", words)
            assert SECRET_ACCESS_KEY not in refused.text
        token = "FwoGZXIvYXdzEJr//////////wEaDMtoken"
        registered = await admin.put("/v1/destinations/q", json={**base, "session_token": token})
        assert registered.status_code == 201, registered.text
        shown = registered.json()
        assert (shown["channel"], shown["queue_url"], shown["on_unknown"]) == ("sqs", base["queue_url"], "always")
        for secret in (SECRET_ACCESS_KEY, token, SECRET):
            assert secret not in registered.text
            assert secret not in (await admin.get("/v1/destinations/q")).text
        assert "secret_access_key" not in shown and "session_token" not in shown
        assert shown["signing_secrets"] == 1  # the key held beside the whsec_ secret is a credential
        # an update without the key keeps it (no 422 for a missing key)
        kept = await admin.put("/v1/destinations/q", json={**base, "secret_access_key": None, "secret": None,
                                                           "timeout_seconds": 3.0})
        assert kept.status_code == 200, kept.text
        big = await admin.post("/v1/intents", json={"destination": "q", "scope": "acme", "action_id": "big",
                                                    "payload": {"blob": "x" * 300_000}})
        assert_problem(big, 422, "invalid-input", "an SQS message holds at most")
        odd = await admin.post("/v1/intents", json={"destination": "q", "scope": "acme", "action_id": "odd",
                                                    "payload": {"text": "\ufffe"}})
        assert_problem(odd, 422, "invalid-input", "U+FFFE, which SQS does not take")


async def test_a_destination_updated_mid_send_gets_a_new_client_and_the_old_ones_request_finishes(
        env: SenderEnv, channel: SqsChannel, moto: MotoServer):
    """A send is under way on the destination's client (its answer held back by the proxy) when
    the destination is updated: the next send makes a new client, and the old one is closed only
    once its request has its answer (closing it at once would cut that request short, unknown)."""
    url = await moto.create_queue(queue_name())
    with Proxy(moto.port, script=["late"], weights={"pass": 1.0}, late_seconds=0.5) as proxy:
        destination = await register(env, moto, url, endpoint_url=proxy.url)
        first = await env.enqueue("first", destination="q")
        slow = asyncio.create_task(channel.send(first, destination, attempt_id="a-1", fence=1))
        assert await eventually(lambda: proxy.faults["late"] == 1)
        env.clock.advance(1)  # (a new updated_at)
        updated = await register(env, moto, url, endpoint_url=proxy.url, timeout_seconds=3.0)
        assert updated.updated_at != destination.updated_at
        second = await env.enqueue("second", destination="q")
        now = await channel.send(second, updated, attempt_id="a-2", fence=1)
        late = await slow
    assert (late.outcome, now.outcome) == (Outcome.DELIVERED, Outcome.DELIVERED), (late.error, now.error)
    assert len(await moto.received(url)) == 2


async def test_a_proxy_named_in_the_environment_is_not_used(
        env: SenderEnv, channel: SqsChannel, moto: MotoServer, monkeypatch: pytest.MonkeyPatch):
    """botocore takes HTTP(S)_PROXY from the environment by default; a proxy would make the
    connection to the endpoint itself, past the SSRF guard, so the channel uses none."""
    url = await moto.create_queue(queue_name())
    async with Listener() as listener:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{listener.port}")
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        await register(env, moto, url)
        await env.enqueue("direct", destination="q")
        _, attempt = await run_until(env, channel, "direct")
    assert listener.connections == 0
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error


async def test_an_attempts_trace_travels_as_attributes_and_the_console_names_the_queue(
        env: SenderEnv, channel: SqsChannel, moto: MotoServer):
    from opentelemetry import trace

    from outbox import channels

    url = await moto.create_queue(queue_name())
    destination = await register(env, moto, url)
    assert channels.target(destination) == f"queue {url}"
    span = trace.SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=False,
                             trace_flags=trace.TraceFlags(1))
    context = trace.set_span_in_context(trace.NonRecordingSpan(span))
    intent = await env.enqueue("traced", destination="q")
    [result] = await channel.send_many([Send(intent, destination, "a-1", 1, context)])
    assert result.outcome is Outcome.DELIVERED, result.error
    [message] = await moto.received(url)
    found = attributes(message)
    assert found["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert "tracestate" not in found  # (empty: left out, as SQS refuses an empty attribute)


async def test_a_redirect_is_the_endpoints_answer_and_is_not_followed(env: SenderEnv, channel: SqsChannel):
    """An endpoint answering 307 to another server: following it would re-send the signed request
    there and take that server's answer for SQS's. The 3xx is the answer (submitted, rejected) and
    the server it points to counts no connection."""
    async with Listener() as target:
        async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:%d/%s/q\r\n"
                         b"Content-Length: 0\r\n\r\n" % (target.port, ACCOUNT.encode()))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(redirect, "127.0.0.1", 0)
        endpoint = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            await env.box.put_destination("q", SqsSpec.model_validate({
                "channel": "sqs", "region": REGION, "queue_url": f"{endpoint}/{ACCOUNT}/q", "endpoint_url": endpoint,
                "allow_insecure": True, "allow_private_network": True, "access_key_id": ACCESS_KEY_ID,
                "secret_access_key": SECRET_ACCESS_KEY, "secret": SECRET, "timeout_seconds": 2.0}))
            await env.enqueue("redirected", destination="q")
            intent, attempt = await run_until(env, channel, "redirected")
        finally:
            server.close()
    assert target.connections == 0
    assert facts(attempt) == ("send", Submission.SUBMITTED, Outcome.REJECTED), attempt.error
    assert attempt.status_code == 307 and not attempt.external_id and intent.status is Status.DEAD


class Held(SqsChannel):
    """The SQS channel, each request held once it is built and before it is sent, until ``go``."""

    def __init__(self) -> None:
        super().__init__()
        self.built, self.go = asyncio.Event(), asyncio.Event()

    async def _batch(self, client: Any, destination: Any, batch: Any) -> Any:
        self.built.set()
        await self.go.wait()
        return await super()._batch(client, destination, batch)


async def test_a_client_retired_while_a_request_on_it_waits_is_closed_only_after_it(env: SenderEnv, moto: MotoServer):
    """Between a request being built on a client and its send, another send's lost answer may
    retire that client. The request counts from when it is built, so the client stays open for it
    and the message is delivered (closed, the request would fail unsent and be recorded unknown)."""
    url = await moto.create_queue(queue_name())
    destination = await register(env, moto, url)
    channel = Held()
    try:
        channel.go.set()
        warm = await channel.send(await env.enqueue("warm", destination="q"), destination, attempt_id="a-1", fence=1)
        assert warm.outcome is Outcome.DELIVERED, warm.error
        channel.go.clear()
        channel.built.clear()
        held = asyncio.create_task(channel.send(await env.enqueue("held", destination="q"), destination,
                                                attempt_id="a-2", fence=1))
        await asyncio.wait_for(channel.built.wait(), 10)
        await channel._retire(destination.id, channel._clients[destination.id])  # as a lost answer would
        channel.go.set()
        result = await asyncio.wait_for(held, 10)
    finally:
        await channel.aclose()
    assert result.outcome is Outcome.DELIVERED, result.error


async def test_a_clients_repr_holds_no_secret(env: SenderEnv, channel: SqsChannel, moto: MotoServer):
    url = await moto.create_queue(queue_name())
    destination = await register(env, moto, url)
    result = await channel.send(await env.enqueue("shown", destination="q"), destination, attempt_id="a-1", fence=1)
    assert result.outcome is Outcome.DELIVERED, result.error
    shown = repr(channel._clients["q"])
    assert SECRET not in shown and SECRET.removeprefix("whsec_") not in shown and SECRET_ACCESS_KEY not in shown
