"""The Redis Streams channel against real servers: the machine's shared Redis (streams of each
test's own, deleted after) and private redis-servers on free ports for what needs a server of its
own (TLS, one stopped mid-send). Each outcome is held against what the stream really holds."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from standardwebhooks.webhooks import Webhook

from outbox import Attempt, Destination, Intent, OnUnknown, Outcome, Status, Submission, channels
from receivers import wire
from sender.channel import Send, SendResult
from sender.redis import RedisChannel, RedisSpec, dedupe_key
from tests import smtp
from tests.conftest import SECRET, eventually
from tests.kafka import Listener
from tests.redis_servers import RedisServer, private_redis, shared_redis

from ..problems import assert_problem
from .conftest import Api, SenderEnv

__all__ = ["private_redis", "shared_redis"]  # fixtures used here


@pytest.fixture
async def channel() -> AsyncIterator[RedisChannel]:
    redis = RedisChannel()
    yield redis
    await redis.aclose()


async def register(env: SenderEnv, stream: str, destination_id: str = "log", *, port: int = 6379,
                   **spec: Any) -> Destination:
    options: dict[str, Any] = {"channel": "redis", "host": "127.0.0.1", "port": port, "stream": stream,
                               "allow_private_network": True, "timeout_seconds": 2.0, "secret": SECRET, **spec}
    destination, _ = await env.box.put_destination(destination_id, RedisSpec.model_validate(options))
    return destination


async def entries(client: Redis, stream: str) -> list[tuple[str, dict[str, str]]]:
    return [(entry.decode(), {k.decode(): v.decode() for k, v in fields.items()})
            for entry, fields in await client.xrange(stream)]


async def send(channel: RedisChannel, intent: Intent, destination: Destination, attempt: int = 1) -> SendResult:
    return await channel.send(intent, destination, attempt_id=f"attempt-{attempt}", fence=attempt)


def facts(result: SendResult | Attempt) -> tuple[str | None, Submission | None, Outcome | None]:
    return result.stage, result.submission, result.outcome


async def test_an_entry_carries_its_identity_and_the_canonical_payload(env: SenderEnv, shared_redis):
    client, names = shared_redis
    stream = names.stream()
    await register(env, stream)
    await env.enqueue("order-1", {"total": 12.5, "id": "o-1"}, destination="log")
    async with env.running(channels={"redis": RedisChannel()}):
        assert await eventually(lambda: env.status_is("order-1", Status.DELIVERED), timeout=15)
    intent = await env.box.get("order-1")
    [attempt] = (await env.box.history("order-1")).attempts
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
    [(entry, fields)] = await entries(client, stream)
    assert attempt.external_id == entry and attempt.reply == f"added {entry} to {stream}"
    signed = {wire.KAFKA_TIMESTAMP: fields.pop(wire.KAFKA_TIMESTAMP),
              wire.KAFKA_SIGNATURE: fields.pop(wire.KAFKA_SIGNATURE)}
    assert fields == {
        wire.KAFKA_IDEMPOTENCY_KEY: "acme/order-1", wire.KAFKA_PAYLOAD_DIGEST: intent.payload_digest,
        wire.KAFKA_ATTEMPT_ID: attempt.attempt_id, wire.KAFKA_FENCE: str(attempt.fence),
        "payload": '{"id":"o-1","total":12.5}'}
    assert Webhook(SECRET).verify(fields["payload"], {"webhook-id": "acme/order-1", **signed}) == {
        "id": "o-1", "total": 12.5}
    ttl = await client.ttl(dedupe_key(stream, "acme/order-1"))
    assert 7 * 24 * 3600 - 60 < ttl <= 7 * 24 * 3600


async def test_a_resend_is_answered_with_the_first_entry_and_the_stream_holds_one(
        env: SenderEnv, channel: RedisChannel, shared_redis):
    """The retry of an attempt whose reply was lost: the script finds the dedupe key and answers
    the entry the first attempt added. Once the key has expired (deleted here), a resend is a
    second entry, which the consumer's idempotency recognises by its idempotency-key."""
    client, names = shared_redis
    stream = names.stream()
    destination = await register(env, stream, dedupe_ttl_seconds=3600)
    intent = await env.enqueue("order-2", destination="log")
    first = await send(channel, intent, destination, 1)
    again = await send(channel, intent, destination, 2)
    assert facts(first) == facts(again) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
    assert again.external_id == first.external_id
    assert again.reply == f"found {first.external_id}, added to {stream} by an earlier attempt: not added again"
    [(entry, fields)] = await entries(client, stream)
    assert entry == first.external_id and fields[wire.KAFKA_ATTEMPT_ID] == "attempt-1"
    assert 3540 < await client.ttl(dedupe_key(stream, "acme/order-2")) <= 3600
    await client.delete(dedupe_key(stream, "acme/order-2"))  # as if its TTL had passed
    later = await send(channel, intent, destination, 3)
    assert later.external_id != first.external_id
    assert [f[wire.KAFKA_IDEMPOTENCY_KEY] for _, f in await entries(client, stream)] == ["acme/order-2"] * 2


async def test_a_cycles_entries_go_in_one_pipeline_each_answered_in_its_place(
        env: SenderEnv, channel: RedisChannel, shared_redis):
    """A batch to two destinations, one of whose streams is a key of another type: that
    destination's entries are refused by the server (submitted, rejected: it can never take
    them), the other's are added, each result in its place."""
    client, names = shared_redis
    good, wrong = names.stream("good"), names.stream("wrong")
    await client.set(wrong, "not a stream")
    to_good, to_wrong = await register(env, good), await register(env, wrong, "wrong")
    sends = []
    for n in range(6):
        destination = to_wrong if n % 3 == 1 else to_good
        intent = await env.enqueue(f"b-{n}", destination=destination.id)
        sends.append(Send(intent, destination, f"attempt-{n}", 1))
    results = await channel.send_many(sends)
    for n, result in enumerate(results):
        if n % 3 == 1:
            assert facts(result) == ("add", Submission.SUBMITTED, Outcome.REJECTED), result
            assert "WRONGTYPE" in (result.error or "") and result.answered
        else:
            assert facts(result) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), result
    added = await entries(client, good)
    assert [entry for entry, _ in added] == [r.external_id for n, r in enumerate(results) if n % 3 != 1]
    assert [f[wire.KAFKA_IDEMPOTENCY_KEY] for _, f in added] == ["acme/b-0", "acme/b-2", "acme/b-3", "acme/b-5"]
    assert await client.get(wrong) == b"not a stream"


async def test_max_len_trims_the_stream(env: SenderEnv, channel: RedisChannel, shared_redis):
    client, names = shared_redis
    stream = names.stream()
    destination = await register(env, stream, max_len=10)
    sends = [Send(await env.enqueue(f"t-{n}", destination="log"), destination, f"attempt-{n}", 1) for n in range(400)]
    results = await channel.send_many(sends)
    assert {facts(r) for r in results} == {("done", Submission.SUBMITTED, Outcome.DELIVERED)}
    assert await client.xlen(stream) < 200  # ~: trimmed by whole nodes (100 entries each), never below 10


async def test_fewer_replicas_than_asked_is_retried_and_the_retry_adds_nothing(
        env: SenderEnv, channel: RedisChannel, shared_redis):
    """The shared server has no replicas: WAIT answers 0 of 1. The entry is on the primary (its id
    is recorded) but not known to be on a replica: submitted and retryable, and the retry is
    answered with the same entry."""
    client, names = shared_redis
    stream = names.stream()
    destination = await register(env, stream, wait_replicas=1, wait_timeout_ms=50)
    intent = await env.enqueue("w-1", destination="log")
    first = await send(channel, intent, destination, 1)
    assert facts(first) == ("wait", Submission.SUBMITTED, Outcome.RETRYABLE), first
    assert "0 of 1 replicas acknowledged it" in (first.error or "")
    again = await send(channel, intent, destination, 2)
    assert facts(again) == facts(first) and again.external_id == first.external_id
    assert [entry for entry, _ in await entries(client, stream)] == [first.external_id]


async def test_failures_before_the_script_was_written_are_not_submitted(
        env: SenderEnv, channel: RedisChannel, shared_redis, closed_port: int):
    """No server, an ACL user the server does not know, a database it does not have, a password
    without TLS: nothing was written, and the stream was never made."""
    client, names = shared_redis
    stream = names.stream()
    cases: list[tuple[dict[str, Any], tuple[str, Submission, Outcome], str]] = [
        ({"port": closed_port}, ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), "ConnectionError"),
        ({"username": "nobody-here", "password": "not-it", "allow_insecure": True},
         ("auth", Submission.NOT_SUBMITTED, Outcome.REJECTED), "refused the credentials"),
        ({"db": 60000}, ("select", Submission.NOT_SUBMITTED, Outcome.REJECTED), "DB index is out of range"),
    ]
    for n, (change, expected, words) in enumerate(cases):
        destination = await register(env, stream, f"d{n}", **change)
        intent = await env.enqueue(f"f-{n}", destination=destination.id)
        result = await send(channel, intent, destination)
        assert facts(result) == expected, result
        assert words in (result.error or ""), result.error
    # a password held, and an update that turned TLS off: refused before connecting
    await register(env, stream, "d9", password="s3cret-pw", tls=True)
    destination = await register(env, stream, "d9", tls=False)
    intent = await env.enqueue("f-9", destination="d9")
    result = await send(channel, intent, destination)
    assert facts(result) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert "holds a password and has no tls" in (result.error or "")
    assert not await client.exists(stream)


async def test_a_server_silent_after_the_write_is_maybe_submitted_and_the_retry_finds_the_entry(
        env: SenderEnv, channel: RedisChannel, private_redis: RedisServer):
    """The server stops answering once connected (SIGSTOP): the script call is written and never
    answered in time (maybe_submitted). Woken, the server runs it; the retry is answered with that
    entry, and the stream holds one."""
    server = private_redis
    destination = await register(env, "orders", port=server.port, timeout_seconds=0.5)
    warm = await send(channel, await env.enqueue("warm", destination="log"), destination)
    assert facts(warm)[2] is Outcome.DELIVERED
    assert server.process is not None
    intent = await env.enqueue("order-3", destination="log")
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        lost = await send(channel, intent, destination, 1)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert facts(lost) == ("add", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN), lost
    client = server.client()
    try:
        assert await eventually(lambda: _length(client, "orders", 2), timeout=5)  # the server ran it after all
        again = await send(channel, intent, destination, 2)
        assert facts(again) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
        assert (again.reply or "").startswith("found ")
        added = await entries(client, "orders")
        assert [entry for entry, _ in added] == [warm.external_id, again.external_id]
        assert added[1][1][wire.KAFKA_ATTEMPT_ID] == "attempt-1"
    finally:
        await client.aclose()


async def _length(client: Redis, stream: str, length: int) -> bool:
    return bool(await client.xlen(stream) == length)


async def test_a_killed_server_is_not_submitted_until_it_is_back(
        env: SenderEnv, channel: RedisChannel, private_redis: RedisServer):
    """The pool's connection died with the server: the next send reconnects, which fails
    (nothing written), and succeeds once the server is back, its acknowledged entry still there."""
    server = private_redis
    destination = await register(env, "orders", port=server.port, timeout_seconds=1.0)
    first = await send(channel, await env.enqueue("a", destination="log"), destination)
    server.stop()
    await asyncio.sleep(0.1)  # the client's loop sees the connection closed
    down = await send(channel, await env.enqueue("b", destination="log"), destination)
    assert facts(down) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), down
    server.start()
    back = await send(channel, await env.enqueue("b2", destination="log"), destination)
    assert facts(back) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), back
    client = server.client()
    try:
        assert [entry for entry, _ in await entries(client, "orders")] == [first.external_id, back.external_id]
    finally:
        await client.aclose()


async def test_a_loopback_server_without_the_private_network_is_never_connected_to(env: SenderEnv,
                                                                                   channel: RedisChannel):
    """``localhost`` resolves only to loopback: the guard refuses it before any connection, and the
    listener there counts none. The control: allowed, the same destination reaches it."""
    async with Listener() as listener:
        refused, _ = await env.box.put_destination("ssrf", RedisSpec.model_validate({
            "channel": "redis", "host": "localhost", "port": listener.port, "stream": "orders", "secret": SECRET}))
        result = await send(channel, await env.enqueue("ssrf", destination="ssrf"), refused)
        assert facts(result) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED), result
        assert "refused: localhost resolves only to non-public addresses" in (result.error or "")
        await asyncio.sleep(0.2)
        assert listener.connections == 0
        allowed = await register(env, "orders", "allowed", port=listener.port)
        result = await send(channel, await env.enqueue("allowed", destination="allowed"), allowed)
        # (the listener closes it before the connection's setup is answered: nothing was written)
        assert facts(result) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), result
        assert listener.connections == 1


@pytest.fixture
def tls_server(tmp_path: Path) -> Any:
    """A private redis-server taking TLS only, its certificate naming ``localhost`` alone."""
    cert = smtp.CA.issue_cert("localhost")
    chain, key = tmp_path / "chain.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    server = RedisServer(tmp_path, tls=(chain, key)).start()
    yield server
    server.stop()


def trusting() -> ssl.SSLContext:
    context = ssl.create_default_context()
    smtp.CA.configure_trust(context)
    return context


async def test_tls_verifies_the_servers_certificate_against_its_name(env: SenderEnv, tls_server: RedisServer):
    """The guard connects the socket (to the address it checked); TLS over it still verifies the
    certificate against the host's name: ``localhost`` checks out, ``127.0.0.1`` (not named by
    the certificate) does not, and a CA the channel does not trust does not either."""
    channel = RedisChannel(tls_context=trusting())
    try:
        named = await register(env, "orders", "named", port=tls_server.port, tls=True, host="localhost")
        result = await send(channel, await env.enqueue("over-tls", destination="named"), named)
        assert facts(result) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), result
        by_address = await register(env, "orders", "by-address", port=tls_server.port, tls=True)
        result = await send(channel, await env.enqueue("by-address", destination="by-address"), by_address)
        assert facts(result) == ("tls", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), result
        assert "certificate" in (result.error or "")
    finally:
        await channel.aclose()
    untrusting = RedisChannel()  # the system's CAs
    try:
        result = await send(untrusting, await env.enqueue("untrusted", destination="named"), named)
        assert facts(result) == ("tls", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), result
    finally:
        await untrusting.aclose()


async def test_the_destination_defaults_say_what_redis_needs(env: SenderEnv):
    destination = await register(env, "orders")
    assert destination.on_unknown is OnUnknown.ALWAYS
    assert destination.settings["dedupe_ttl_seconds"] == 7 * 24 * 3600 and destination.settings["port"] == 6379
    assert channels.target(destination) == "stream orders on 127.0.0.1:6379/0"  # what the console shows


async def test_the_api_registers_redis_destinations_and_refuses_what_cannot_be_written(api: Api):
    base = {"channel": "redis", "host": "redis.example.com", "stream": "orders", "secret": SECRET}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"secret": None}, "is new: it needs a whsec_ secret to sign its entries"),
        ({"secret": "hunter2-pw"}, "give the password as password"),
        ({"password": "hunter2-pw"}, "set tls, or allow_insecure"),
        ({"password": SECRET, "tls": True}, "must not start with 'whsec_'"),
        ({"stream": "bad stream"}, "is not a stream key"),
        ({"stream": "a{b}"}, "is not a stream key"),
        ({"host": "10.0.0.1"}, "is not a public address"),
        ({"host": "0x7f000001"}, "looks like an IPv4 address"),
        ({"port": 0}, "port"),
        ({"max_len": 0}, "max_len"),
        ({"dedupe_ttl_seconds": 1}, "dedupe_ttl_seconds"),
        ({"wait_replicas": 0}, "wait_replicas"),
        ({"username": "two words"}, "username"),
        ({"reconcile": True}, "leave reconcile off"),
        ({"url": "redis://redis.example.com"}, "url"),
    ]
    async with api.client(api.admin) as admin:
        for change, words in cases:
            refused = await admin.put("/v1/destinations/log", json={**base, **change})
            assert_problem(refused, 422, "invalid-input", words)
        registered = await admin.put("/v1/destinations/log", json={
            **base, "tls": True, "username": "svc", "password": "hunter2-pw"})
        assert registered.status_code == 201, registered.text
        shown = registered.json()
        assert (shown["channel"], shown["stream"], shown["on_unknown"], shown["port"]) == (
            "redis", "orders", "always", 6379)
        assert "hunter2" not in registered.text and SECRET not in registered.text and "password" not in shown
        assert shown["signing_secrets"] == 1
        listed = await admin.get("/v1/destinations/log")
        assert "hunter2" not in listed.text and listed.json()["signing_secrets"] == 1


async def test_the_password_is_kept_across_updates_sealed_and_never_shown(env: SenderEnv, channel: RedisChannel,
                                                                         shared_redis):
    """An update without the password keeps it (after the signing secrets), one with a new one
    replaces it; neither the destination's repr nor its client's, nor the database file, holds it."""
    _, names = shared_redis
    stream = names.stream()
    first = await register(env, stream, username="svc", password="first-pw-1", tls=True)
    assert first.secrets == (SECRET, "first-pw-1")
    kept = await register(env, stream, username="svc", tls=True)
    assert kept.secrets == (SECRET, "first-pw-1")
    replaced = await register(env, stream, username="svc", password="second-pw-2", tls=True)
    assert replaced.secrets == (SECRET, "second-pw-2")
    assert "second-pw" not in repr(replaced) and "second-pw" not in repr(RedisSpec.model_validate(
        {"channel": "redis", "host": "redis.example.com", "stream": stream, "password": "second-pw-2", "tls": True}))
    await send(channel, await env.enqueue("pw", destination="log"), replaced)  # (the server has no such user)
    client = await channel._clients.client(replaced)
    assert "second-pw" not in repr(client) and "second-pw" not in repr(client.pool)
    assert env.path is not None
    stored = b"".join(path.read_bytes() for path in env.path.parent.glob(env.path.name + "*"))  # with the WAL
    assert b"first-pw" not in stored and b"second-pw" not in stored and b"svc" in stored


async def test_an_emptied_script_cache_is_answered_by_sending_the_script(
        env: SenderEnv, channel: RedisChannel, private_redis: RedisServer):
    """NOSCRIPT says the call did nothing: the same attempt sends the script itself (EVAL), in
    the batch's places, and each entry is added once."""
    destination = await register(env, "orders", port=private_redis.port)
    first = await send(channel, await env.enqueue("first", destination="log"), destination)
    client = private_redis.client()
    try:
        await client.script_flush()
        sends = [Send(await env.enqueue(f"n-{n}", destination="log"), destination, f"attempt-{n}", 1)
                 for n in range(3)]
        results = await channel.send_many(sends)
        assert {facts(r) for r in [first, *results]} == {("done", Submission.SUBMITTED, Outcome.DELIVERED)}
        added = await entries(client, "orders")
        assert [entry for entry, _ in added] == [first.external_id, *(r.external_id for r in results)]
    finally:
        await client.aclose()


async def test_error_replies_that_may_pass_are_retried(env: SenderEnv, channel: RedisChannel, tmp_path: Path):
    """A replica answers READONLY and a server at its memory limit OOM: the script added nothing
    (submitted), and either may take the entry later (retryable)."""
    primary, replica = RedisServer(tmp_path).start(), RedisServer(tmp_path).start()
    client = replica.client()
    try:
        await client.replicaof("127.0.0.1", str(primary.port))
        readonly = await register(env, "orders", "replica", port=replica.port)
        result = await send(channel, await env.enqueue("r", destination="replica"), readonly)
        assert facts(result) == ("add", Submission.SUBMITTED, Outcome.RETRYABLE), result
        assert "ReadOnlyError" in (result.error or "")
        await client.replicaof("NO", "ONE")
        await client.config_set("maxmemory", "1")
        full = await register(env, "orders", "full", port=replica.port)
        result = await send(channel, await env.enqueue("m", destination="full"), full)
        assert facts(result) == ("add", Submission.SUBMITTED, Outcome.RETRYABLE), result
        assert "OutOfMemoryError" in (result.error or "")
        assert await client.xlen("orders") == 0
    finally:
        await client.aclose()
        primary.stop()
        replica.stop()


async def test_a_script_refused_by_the_acl_part_way_has_written_nothing(
        env: SenderEnv, channel: RedisChannel, private_redis: RedisServer):
    """A script's writes are not undone when it fails, so the one whose error reply says the entry
    was not added must have written nothing: a user that may not SET (the dedupe key) is refused
    before the entry is added, one that may not XADD leaves no dedupe key behind, and one that
    may only read the dedupe keys is refused before the script runs."""
    client = private_redis.client()
    users = {"no-set": (("~*", "+@all", "-set"), "can't run this command"),
             "no-xadd": (("~*", "+@all", "-xadd"), "can't run this command"),
             "read-only-dedupe": (("~orders", "%R~{orders}:*", "+@all"), "no permissions to access one of the keys")}
    try:
        for n, (user, (rules, refusal)) in enumerate(users.items()):
            await client.execute_command("ACL", "SETUSER", user, "on", f">pw-{n}", *rules)
            destination = await register(env, "orders", user, port=private_redis.port, username=user,
                                         password=f"pw-{n}", allow_insecure=True)
            result = await send(channel, await env.enqueue(f"acl-{n}", destination=user), destination)
            assert facts(result) == ("add", Submission.SUBMITTED, Outcome.REJECTED), result
            assert refusal in (result.error or ""), result.error
            assert not await client.exists("orders", dedupe_key("orders", f"acme/acl-{n}")), user
    finally:
        await client.aclose()


@pytest.mark.parametrize("held", ["reply", "connect"])
async def test_a_destination_updated_mid_send_neither_cuts_that_send_nor_leaks_its_connection(
        env: SenderEnv, private_redis: RedisServer, held: str):
    """The destination changes while a send waits on the server (stopped: the send's pipeline, or
    its connection's handshake, unanswered): the old pool is closed only once that send is
    answered, so the send is delivered, not made unknown; after aclose the server holds no
    connection of the channel's."""
    server = private_redis
    assert server.process is not None
    first = await register(env, "orders", port=server.port, timeout_seconds=10.0)
    channel = RedisChannel()
    if held == "reply":
        warm = await send(channel, await env.enqueue("warm", destination="log"), first)
        assert facts(warm)[2] is Outcome.DELIVERED, warm.error
    a_intent, b_intent = await env.enqueue("a", destination="log"), await env.enqueue("b", destination="log")
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        sending = asyncio.ensure_future(send(channel, a_intent, first))
        await asyncio.sleep(0.3)  # (its pipeline, or its connection's first command, written: unanswered)
        env.clock.advance(1)
        updated = await register(env, "orders", port=server.port, timeout_seconds=9.0)
        assert updated.updated_at != first.updated_at
        after = asyncio.ensure_future(send(channel, b_intent, updated))
        await asyncio.sleep(0.3)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    a, b = await asyncio.gather(sending, after)
    assert facts(a) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), a.error
    assert facts(b) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), b.error
    await channel.aclose()
    client = server.client()
    try:
        assert await _length(client, "orders", 3 if held == "reply" else 2)

        async def alone() -> bool:
            return len(await client.client_list()) == 1  # (this client's own connection)
        assert await eventually(alone), await client.client_list()
    finally:
        await client.aclose()


class BrokenFor(RedisChannel):
    """The Redis channel with a fault of its own in one destination's group (as a bug would raise)."""

    def __init__(self, broken: str) -> None:
        super().__init__()
        self.broken = broken

    async def _added(self, client: Any, destination: Destination, sends: Any) -> list[SendResult]:
        if destination.id == self.broken:
            raise RuntimeError("a fault of the channel's own")
        return await super()._added(client, destination, sends)


async def test_one_destinations_fault_leaves_the_other_destinations_results_in_a_batch(env: SenderEnv,
                                                                                       shared_redis):
    """A batch for two destinations, one of whose groups raises: that group's sends are unknown
    (they may have gone out), the other's are delivered with their entries' ids."""
    client, names = shared_redis
    good, bad = names.stream("good"), names.stream("bad")
    to_good, to_bad = await register(env, good, "good"), await register(env, bad, "bad")
    sends = [Send(await env.enqueue(f"n-{n}", destination=destination.id), destination, f"attempt-{n}", 1)
             for n, destination in enumerate([to_good, to_bad, to_good, to_bad])]
    channel = BrokenFor("bad")
    try:
        results = await channel.send_many(sends)
    finally:
        await channel.aclose()
    added = [entry for entry, _ in await entries(client, good)]
    assert [(r.submission, r.outcome, r.external_id) for r in results] == [
        (Submission.SUBMITTED, Outcome.DELIVERED, added[0]), (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, None),
        (Submission.SUBMITTED, Outcome.DELIVERED, added[1]), (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, None)]
    assert "RuntimeError: a fault of the channel's own" in (results[1].error or "")
    assert len(added) == 2 and await client.xlen(bad) == 0
