"""The webhook sender against real HTTP receivers: uvicorn on loopback, SQLite in tmp_path.

Time is a ManualClock, so backoff and retention run in milliseconds; what the receiver got is
read from its own record of every request.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import socket
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import aiohttp
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from outbox import DestinationSpec, IntentQuery, Outcome, Status, Submission, operations
from outbox.shapes import destination_json
from outbox.timestamps import LATEST
from sender import Backoff, CallableAuthority, webhook

from ..receiver import Receiver, Reply
from .conftest import SECRET, SECRET_NEW, SECRET_OTHER, Listener, SenderEnv


def kinds(history) -> list[str]:
    return [event.kind for event in history.events]


def last(history, kind: str):
    return [event for event in history.events if event.kind == kind][-1]


def content_digest(body: bytes) -> str:
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode() + ":"


# -- success ------------------------------------------------------------------------------


async def test_a_200_delivers_once_with_every_header_and_the_external_id(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200, headers={"External-Id": "ext-77"}, body={"ok": True}))
    await env.destination(f"{receiver.url}/hook")
    payload = {"invoice": 42, "lines": [1, 2], "note": "héllo"}
    await env.enqueue("a1", payload)

    assert await env.worker().run_once() == 1

    intent = await env.box.get("a1")
    assert intent.status is Status.DELIVERED
    assert intent.attempts == 1 and intent.last_error is None and intent.lease_owner is None
    history = await env.box.history("a1")
    [attempt] = history.attempts
    assert (attempt.number, attempt.submission, attempt.outcome) == (1, Submission.SUBMITTED, Outcome.DELIVERED)
    assert attempt.status_code == 200 and attempt.external_id == "ext-77" and attempt.error is None
    assert attempt.fence == intent.fence == 1 and attempt.finished_at is not None
    assert json.loads(attempt.reply)["headers"]["external-id"] == "ext-77"
    assert kinds(history) == ["enqueued", "leased", "attempt_started", "attempt_finished", "delivered"]
    started = last(history, "attempt_started").data  # the allowing decision is kept with the attempt
    assert started["attempt_id"] == attempt.attempt_id and started["fence"] == 1
    assert started["authority"] == "grant 'g1'" and started["authority_revision"] == "g1@1"
    assert started["target"] == f"{receiver.url}/hook"  # where it went, as the destination was then
    finished = last(history, "attempt_finished").data
    assert finished == {"attempt_id": attempt.attempt_id, "submission": "submitted",
                        "outcome": "delivered", "status_code": 200}
    assert last(history, "delivered").reason == "receiver answered 200"

    [request] = receiver.requests()
    assert request.method == "POST" and request.path == "/hook"
    assert request.body == intent.payload_json.encode()  # the canonical JSON, byte for byte
    assert json.loads(request.body) == payload
    headers = request.headers
    assert headers["content-type"] == "application/json"
    assert headers["idempotency-key"] == headers["webhook-id"] == "acme/a1"
    assert headers["webhook-timestamp"].isdigit()
    assert headers["webhook-signature"].startswith("v1,") and " " not in headers["webhook-signature"]
    assert headers["content-digest"] == content_digest(request.body)
    assert headers["outbox-attempt-id"] == attempt.attempt_id
    assert headers["outbox-fence"] == str(intent.fence)
    assert headers["user-agent"].startswith("outbox-delivery/")


async def test_the_external_id_is_read_from_a_json_body_too(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(201, body={"external_id": 9001, "status": "queued"}))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    await env.worker().run_once()
    [attempt] = (await env.box.history("a1")).attempts
    assert (await env.box.get("a1")).status is Status.DELIVERED
    assert attempt.status_code == 201 and attempt.external_id == "9001"


async def test_a_reply_streamed_in_pieces_is_kept_whole(env: SenderEnv, receiver: Receiver):
    """The receiver's 200 body arrives in two TCP writes; the attempt must keep the whole (short)
    reply and find the external_id in it, as it does for a body sent in one write."""
    body = json.dumps({"external_id": "E-1", "status": "accepted"}).encode()
    receiver.script("/hook", Reply(200, headers={"Content-Type": "application/json"},
                                   chunks=(body[:10], body[10:])))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    await env.worker().run_once()

    assert (await env.box.get("a1")).status is Status.DELIVERED
    [attempt] = (await env.box.history("a1")).attempts
    assert json.loads(attempt.reply)["body"] == body.decode()
    assert attempt.external_id == "E-1"


# -- signatures ----------------------------------------------------------------------------


async def test_signatures_verify_with_standard_webhooks(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(204))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1", {"z": 1, "a": [True, None, 1.5]})
    await env.worker().run_once()

    [request] = receiver.requests("/hook")
    assert Webhook(SECRET).verify(request.body, request.headers) == {"a": [True, None, 1.5], "z": 1}
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET_OTHER).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):  # the signature covers the body
        Webhook(SECRET).verify(request.body.replace(b"1.5", b"2.5"), request.headers)
    with pytest.raises(WebhookVerificationError):  # ... and the id
        Webhook(SECRET).verify(request.body, {**request.headers, "webhook-id": "acme/a2"})


async def test_after_a_rotation_both_secrets_verify(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    destination, created = await env.box.put_destination(
        "hook", DestinationSpec(url=f"{receiver.url}/hook", secret=SECRET_NEW, allow_private_network=True,
                                timeout_seconds=1, idempotent=True, retention_seconds=3600))
    assert not created and destination.secrets == (SECRET_NEW, SECRET)
    await env.enqueue("a1")
    await env.worker().run_once()

    [request] = receiver.requests("/hook")
    signatures = request.headers["webhook-signature"].split(" ")
    assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)
    assert Webhook(SECRET_NEW).verify(request.body, request.headers) == {"action": "a1"}
    assert Webhook(SECRET).verify(request.body, request.headers) == {"action": "a1"}
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET_OTHER).verify(request.body, request.headers)
    # each signature on its own belongs to exactly one secret, the new one first
    only_new = {**request.headers, "webhook-signature": signatures[0]}
    only_old = {**request.headers, "webhook-signature": signatures[1]}
    Webhook(SECRET_NEW).verify(request.body, only_new)
    Webhook(SECRET).verify(request.body, only_old)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(request.body, only_new)


# -- 5xx, then success ------------------------------------------------------------------------


async def test_a_503_is_retried_after_backoff_then_delivered(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(503, body="busy"), Reply(200, headers={"External-Id": "x-2"}))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    worker = env.worker()

    await worker.run_once()
    intent = await env.box.get("a1")
    assert intent.status is Status.PENDING and intent.attempts == 1
    assert intent.last_error == "retryable: receiver answered 503"
    delay = await env.due_in("a1")
    assert 0.5 <= delay <= 1.0  # Backoff(1.0): the first delay is 0.5 fixed + up to 0.5 random
    history = await env.box.history("a1")
    assert kinds(history)[-1] == "scheduled_retry"
    assert last(history, "scheduled_retry").data["next_attempt_at"] == intent.next_attempt_at.isoformat()
    [first] = history.attempts
    assert (first.submission, first.outcome, first.status_code) == (Submission.SUBMITTED, Outcome.RETRYABLE, 503)
    assert first.external_id is None

    assert await worker.run_once() == 0  # not due yet by the clock
    assert len(receiver.requests()) == 1

    await env.advance_until_due("a1")
    assert await worker.run_once() == 1
    intent = await env.box.get("a1")
    assert intent.status is Status.DELIVERED and intent.attempts == 2 and intent.last_error is None
    history = await env.box.history("a1")
    assert [(a.number, a.status_code, a.outcome) for a in history.attempts] == [
        (1, 503, Outcome.RETRYABLE), (2, 200, Outcome.DELIVERED)]
    assert history.attempts[1].external_id == "x-2"

    one, two = receiver.requests("/hook")
    assert one.headers["idempotency-key"] == two.headers["idempotency-key"] == "acme/a1"
    assert one.body == two.body
    assert [one.headers["outbox-attempt-id"], two.headers["outbox-attempt-id"]] == [
        a.attempt_id for a in history.attempts]
    assert one.headers["outbox-attempt-id"] != two.headers["outbox-attempt-id"]
    assert (one.headers["outbox-fence"], two.headers["outbox-fence"]) == ("1", "2")


# -- Retry-After --------------------------------------------------------------------------


@pytest.mark.parametrize(("retry_after", "expected"), [("120", 120.0), ("99999", 3600.0)])
async def test_retry_after_is_honoured_up_to_the_cap(env: SenderEnv, receiver: Receiver,
                                                     retry_after: str, expected: float):
    receiver.script("/hook", Reply(429, headers={"Retry-After": retry_after}))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    await env.worker().run_once()

    intent = await env.box.get("a1")
    assert intent.status is Status.PENDING
    assert intent.next_attempt_at == env.clock.now() + timedelta(seconds=expected)
    [attempt] = (await env.box.history("a1")).attempts
    assert (attempt.outcome, attempt.status_code) == (Outcome.RETRYABLE, 429)
    assert json.loads(attempt.reply)["headers"]["retry-after"] == retry_after


async def test_retry_after_as_an_http_date(env: SenderEnv, receiver: Receiver):
    when = datetime.now(UTC) + timedelta(seconds=300)
    receiver.script("/hook", Reply(503, headers={"Retry-After": format_datetime(when, usegmt=True)}))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    await env.worker().run_once()
    assert (await env.box.get("a1")).status is Status.PENDING
    assert 290 <= await env.due_in("a1") <= 300


# -- permanent refusals ---------------------------------------------------------------------


@pytest.mark.parametrize(("status", "outcome"), [
    (400, Outcome.REJECTED), (401, Outcome.REJECTED), (404, Outcome.REJECTED), (422, Outcome.CONFLICT),
])
async def test_a_permanent_4xx_dead_letters_at_once(env: SenderEnv, receiver: Receiver, status: int,
                                                    outcome: Outcome):
    receiver.script("/hook", Reply(status, body={"error": "no"}))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    await env.worker().run_once()

    intent = await env.box.get("a1")
    assert intent.status is Status.DEAD and intent.attempts == 1
    assert intent.last_error == f"{outcome.value}: receiver answered {status}"
    history = await env.box.history("a1")
    [attempt] = history.attempts
    assert (attempt.submission, attempt.outcome, attempt.status_code) == (Submission.SUBMITTED, outcome, status)
    assert kinds(history)[-1] == "dead_lettered"
    assert len(receiver.requests()) == 1
    env.clock.advance(86_400)  # and nothing is ever sent again
    assert await env.worker().run_once() == 0
    assert len(receiver.requests()) == 1


async def test_a_redirect_is_not_followed(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(307, headers={"Location": "/elsewhere"}))
    receiver.script("/elsewhere", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    await env.worker().run_once()
    assert (await env.box.get("a1")).status is Status.DEAD
    assert [r.path for r in receiver.requests()] == ["/hook"]


# -- 410 Gone -------------------------------------------------------------------------------


async def test_a_410_dead_letters_and_disables_the_destination(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(410))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    worker = env.worker()
    await worker.run_once()

    intent = await env.box.get("a1")
    assert intent.status is Status.DEAD and intent.last_error == "rejected: receiver answered 410"
    destination = await env.box.get_destination("hook")
    assert destination.disabled and destination_json(destination)["disabled"] is True
    assert len(receiver.requests()) == 1

    await env.enqueue("a2")
    assert await worker.run_once() == 1
    parked = await env.box.get("a2")
    assert parked.status is Status.PENDING and parked.attempts == 0
    assert parked.next_attempt_at == env.clock.now() + timedelta(seconds=60)
    history = await env.box.history("a2")
    assert history.attempts == []
    assert kinds(history)[-1] == "released"
    assert last(history, "released").reason == "destination 'hook' is disabled"
    env.clock.advance(61)  # looked at again later: still disabled, still nothing sent
    assert await env.worker().run_once() == 1
    assert (await env.box.get("a2")).status is Status.PENDING
    assert len(receiver.requests()) == 1


# -- connection refused or timed out ----------------------------------------------------------


@pytest.mark.parametrize(("port", "error"), [
    ("closed_port", "ClientConnectorError"),  # refused
    ("unanswered_port", "ConnectionTimeoutError"),  # the handshake never completes
])
async def test_a_connection_never_made_is_not_submitted_and_retried(
        env: SenderEnv, request: pytest.FixtureRequest, port: str, error: str):
    """Refused or timed out while connecting, not a byte of the request can have been written:
    'not submitted' and retried, unlike a timeout after the request was sent ("answered too late" below), which
    is 'maybe submitted'."""
    await env.destination(f"http://127.0.0.1:{request.getfixturevalue(port)}/hook", timeout_seconds=0.3)
    await env.enqueue("a1")
    await env.worker().run_once()

    intent = await env.box.get("a1")
    assert intent.status is Status.PENDING and intent.attempts == 1
    assert 0.5 <= await env.due_in("a1") <= 1.0
    [attempt] = (await env.box.history("a1")).attempts
    assert (attempt.submission, attempt.outcome) == (Submission.NOT_SUBMITTED, Outcome.RETRYABLE)
    assert attempt.status_code is None and attempt.reply is None
    assert attempt.error is not None and attempt.error.startswith(error)
    assert intent.last_error is not None and intent.last_error.startswith(f"retryable: {error}")


# -- answered too late: maybe submitted, outcome unknown ----------------------------------------


@pytest.mark.parametrize(("idempotent", "on_unknown", "expected"), [
    (True, "declared", Status.PENDING),
    (False, "declared", Status.UNKNOWN),
    (True, "never", Status.UNKNOWN),
    (False, "always", Status.PENDING),
])
async def test_a_timeout_is_maybe_submitted_and_the_policy_decides(
        env: SenderEnv, receiver: Receiver, idempotent: bool, on_unknown: str, expected: Status):
    receiver.script("/hook", Reply(200, delay=1.0))
    await env.destination(f"{receiver.url}/hook", timeout_seconds=0.3, idempotent=idempotent,
                          on_unknown=on_unknown)
    await env.enqueue("a1")
    await env.worker().run_once()

    assert len(receiver.requests("/hook")) == 1  # it did arrive
    history = await env.box.history("a1")
    [attempt] = history.attempts
    assert (attempt.submission, attempt.outcome) == (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)
    assert attempt.status_code is None and "Timeout" in attempt.error
    intent = await env.box.get("a1")
    assert intent.status is expected
    if expected is Status.PENDING:
        assert kinds(history)[-1] == "scheduled_retry"
        assert 0.5 <= await env.due_in("a1") <= 1.0
    else:
        assert kinds(history)[-1] == "unknown"
        why = "does not declare idempotency" if on_unknown == "declared" else "on_unknown=never"
        assert why in intent.last_error
        waited = await env.box.wait("a1", timeout=5)  # a harness gets it back as unknown, at once
        assert waited.status is Status.UNKNOWN
        env.clock.advance(3600)  # and no blind retry, ever
        assert await env.worker().run_once() == 0
        assert len(receiver.requests("/hook")) == 1


async def test_unknown_outcomes_are_retried_only_inside_the_declared_retention(
        env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200, delay=1.0))
    # retention 600 s minus the 300 s margin: blind retries only in the first 300 s
    await env.destination(f"{receiver.url}/hook", timeout_seconds=0.3, retention_seconds=600)
    await env.enqueue("a1")
    worker = env.worker()
    await worker.run_once()
    assert (await env.box.get("a1")).status is Status.PENDING

    env.clock.advance(400)
    assert await worker.run_once() == 1
    intent = await env.box.get("a1")
    assert intent.status is Status.UNKNOWN and intent.attempts == 2
    assert "older than the receiver's declared retention (600s)" in intent.last_error
    assert len(receiver.requests("/hook")) == 2


# -- the backoff schedule and dead letters ------------------------------------------------------


def test_backoff_bounds():
    backoff = Backoff(1.0, 3600.0)
    for failed in range(1, 20):
        # half fixed, half random, each half capped at half the cap
        low, high = min(0.5 * 2 ** (failed - 1), 1800.0), min(2 ** (failed - 1), 3600.0)
        for _ in range(50):
            assert low <= backoff.delay(failed) <= high, failed
    assert backoff.delay(1, retry_after=30) == 30
    assert backoff.delay(1, retry_after=10 ** 6) == 3600
    assert 0.5 <= backoff.delay(1, retry_after=0) <= 1.0  # a smaller Retry-After never shortens it


async def test_always_500_dead_letters_after_max_attempts(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(500, body="boom"))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1", max_attempts=3)
    worker = env.worker()

    for failed in (1, 2):
        assert await worker.run_once() == 1
        assert (await env.box.get("a1")).status is Status.PENDING
        delay = await env.due_in("a1")
        assert 0.5 * 2 ** (failed - 1) <= delay <= 2 ** (failed - 1)
        env.clock.advance(delay)
    assert await worker.run_once() == 1

    intent = await env.box.get("a1")
    assert intent.status is Status.DEAD and intent.attempts == 3
    history = await env.box.history("a1")
    assert [(a.number, a.status_code, a.outcome) for a in history.attempts] == [
        (n, 500, Outcome.RETRYABLE) for n in (1, 2, 3)]
    assert kinds(history)[-1] == "dead_lettered"
    assert history.events[-1].reason.startswith("attempts exhausted (3 of 3)")
    assert intent.last_error == history.events[-1].reason
    assert len(receiver.requests("/hook")) == 3
    env.clock.advance(7200)
    assert await worker.run_once() == 0
    assert len(receiver.requests("/hook")) == 3


async def test_an_intent_that_would_expire_before_its_retry_is_dead_lettered(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(503, headers={"Retry-After": "600"}))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1", expires_at=env.clock.now() + timedelta(seconds=300))
    await env.worker().run_once()
    intent = await env.box.get("a1")
    assert intent.status is Status.DEAD and intent.last_error.startswith("expired: its expires_at (")
    assert len(receiver.requests()) == 1


# -- the SSRF guard --------------------------------------------------------------------------


async def assert_refused(env: SenderEnv, action_id: str, *words: str) -> None:
    """One attempt, never sent, rejected: the intent is dead and says why (an operator must see
    it was the guard, not the receiver)."""
    intent = await env.box.get(action_id)
    assert intent.status is Status.DEAD and intent.attempts == 1
    [attempt] = (await env.box.history(action_id)).attempts
    assert (attempt.submission, attempt.outcome) == (Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert attempt.status_code is None and attempt.reply is None
    for word in words:
        assert word in intent.last_error and word in attempt.error, (word, attempt.error)


NOT_PUBLIC = ("is not a public address", "does not allow the private network")


@pytest.mark.parametrize("host", [
    "127.0.0.1",
    "[::ffff:127.0.0.1]",
    "[::ffff:0:7f00:1]",  # SIIT's IPv4-translated form, outside IPv6's global unicast space
    "１２７.０.０.１",  # full-width digits: the client maps them (IDNA/UTS-46) to 127.0.0.1
    "127。0。0。1",  # ideographic full stops, likewise
    "127．0．0．1",  # full-width full stops
])
async def test_a_stored_url_naming_a_loopback_address_is_refused_without_a_connection(
        env: SenderEnv, listener: Listener, host: str):
    """Registration refuses these now; a row stored before is judged by the host the client
    would connect to, not by its text."""
    await env.legacy_destination(f"http://{host}:{listener.port}/hook")
    await env.enqueue("a1")
    await env.worker().run_once()

    assert listener.connections == 0
    await assert_refused(env, "a1", *NOT_PUBLIC)


@pytest.mark.parametrize(("host", "allow_private_network", "words"), [
    ("2130706433", False, "looks like an IPv4 address"),
    ("127.1", False, "looks like an IPv4 address"),
    ("0177.0.0.1", False, "looks like an IPv4 address"),
    ("0x7f000001", False, "looks like an IPv4 address"),
    ("0", False, "looks like an IPv4 address"),
    ("127.0.0.1.", False, "empty label"),
    # Allowed the private network, these still cannot be sent as written (0x7f000001 would be).
    ("127.1", True, "looks like an IPv4 address"),
    ("0x7f000001", True, "looks like an IPv4 address"),
])
async def test_a_stored_url_whose_host_is_no_canonical_address_is_refused_not_maybe_sent(
        env: SenderEnv, listener: Listener, host: str, allow_private_network: bool, words: str):
    """aiohttp refuses most of these itself (InvalidUrlClientError, before connecting), which
    used to be recorded as maybe_submitted; the C resolver reads 0x7f000001 as 127.0.0.1."""
    await env.legacy_destination(f"http://{host}:{listener.port}/hook", allow_private_network=allow_private_network)
    await env.enqueue("a1")
    await env.worker().run_once()

    assert listener.connections == 0
    await assert_refused(env, "a1", "cannot be used", words)


@pytest.mark.parametrize(("url", "words"), [
    ("ftp://127.0.0.1:{port}/hook", "NonHttpUrlClientError"),  # aiohttp's InvalidURL, raised before connecting
    ("http://127.0.0.1:99999/hook", "Port out of range"),  # yarl cannot parse it
])
async def test_a_stored_url_the_client_refuses_is_not_submitted(
        env: SenderEnv, listener: Listener, url: str, words: str):
    await env.legacy_destination(url.format(port=listener.port), allow_private_network=True)
    await env.enqueue("a1")
    await env.worker().run_once()

    assert listener.connections == 0
    await assert_refused(env, "a1", "refused", words)


@pytest.mark.parametrize(("settings", "words", "target"), [
    ("{}", "has no url to send to: its stored settings hold none", "webhook"),
    ('{"url": 5}', "has no url to send to: its stored settings hold int 5", "5"),
])
@pytest.mark.parametrize("traced", [False, True])
async def test_stored_settings_without_a_url_are_refused_not_maybe_sent(
        env: SenderEnv, listener: Listener, settings: str, words: str, target: str, traced: bool,
        request: pytest.FixtureRequest):
    """Settings written into the database by hand. Without a url, the start failed on it (and,
    before, the whole cycle with it); a url that is not text raised in the send, and so did the
    attempt's span (when traces are recorded) reading either, which was recorded as maybe sent
    (unknown, for a destination that does not declare idempotency)."""
    if traced:
        request.getfixturevalue("spans")
    await env.destination(f"http://127.0.0.1:{listener.port}/hook", idempotent=False)
    assert env.path is not None
    with sqlite3.connect(env.path, timeout=10) as conn:
        conn.execute("UPDATE destinations SET settings = ? WHERE id = 'hook'", (settings,))
    conn.close()
    await env.enqueue("a1")
    await env.worker().run_once()

    assert listener.connections == 0
    await assert_refused(env, "a1", "refused: destination 'hook'", words)
    [started] = [e for e in (await env.box.history("a1")).events if e.kind.value == "attempt_started"]
    assert started.data["target"] == target  # without a url, where is said in the channel's name


async def test_a_name_resolving_to_loopback_is_refused_without_a_connection(env: SenderEnv, listener: Listener):
    """A name is registered as it is; the resolver drops its non-public addresses when it is sent."""
    await env.destination(f"http://localhost:{listener.port}/hook", allow_private_network=False)
    await env.enqueue("a1")
    await env.worker().run_once()

    assert listener.connections == 0
    await assert_refused(env, "a1", "localhost resolves only to non-public addresses",
                         "does not allow the private network")


async def test_the_address_connected_to_is_checked_even_if_the_resolver_let_it_through(
        env: SenderEnv, listener: Listener, monkeypatch: pytest.MonkeyPatch):
    """With the resolver's filter gone (a rebinding answer, or a path that skips the resolver,
    as aiohttp does for IP literals), the socket for the connect itself is refused."""
    monkeypatch.setattr(webhook, "GuardedResolver", aiohttp.ThreadedResolver)
    await env.destination(f"http://localhost:{listener.port}/hook", allow_private_network=False)
    await env.enqueue("a1")
    await env.worker().run_once()

    assert listener.connections == 0
    await assert_refused(env, "a1", "the address to connect to is not public", "does not allow the private network")


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.0.0.1", "169.254.169.254", "0.0.0.0", "::1", "::ffff:127.0.0.1", "fe80::1%lo",
    "::ffff:0:7f00:1", "192.0.0.9", "198.18.0.1", "3fff::1", "5f00::1", "100:0:0:1::1",
])
def test_the_socket_factory_refuses_a_non_public_address(address: str):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with pytest.raises(webhook.PrivateAddressRefused):
        webhook.guarded_socket((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, 80)))


def test_the_socket_factory_gives_a_public_address_a_socket_and_does_not_connect():
    sock = webhook.guarded_socket((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("8.8.8.8", 443)))
    try:
        assert (sock.family, sock.type) == (socket.AF_INET, socket.SOCK_STREAM)
        with pytest.raises(OSError):
            sock.getpeername()  # not connected
    finally:
        sock.close()


async def test_the_probe_is_refused_like_a_send(env: SenderEnv, listener: Listener):
    """The reconcile probe goes to the same URL: a stored loopback host in disguise is refused
    there too, before any connection."""
    registered = await env.destination(f"http://127.0.0.1:{listener.port}/hook", reconcile=True)
    stored = replace(registered, settings={"url": f"http://１２７.０.０.１:{listener.port}/hook"},
                     allow_private_network=False)
    intent = await env.enqueue("a1")
    channel = webhook.WebhookChannel()
    try:
        answer = await channel.probe(intent, stored, fence=2)
    finally:
        await channel.aclose()

    assert answer.state is None and answer.error is not None
    assert all(word in answer.error for word in NOT_PUBLIC), answer.error
    assert listener.connections == 0


async def test_a_header_that_cannot_be_sent_is_refused_before_connecting(env: SenderEnv, listener: Listener):
    """aiohttp connects first and then refuses the header (ValueError): nothing is written, but
    it used to leave the attempt maybe_submitted. An action id stored before ids were checked
    could hold a line break."""
    destination = await env.destination(f"http://127.0.0.1:{listener.port}/hook")
    intent = replace(await env.enqueue("a1"), action_id="a1\r\nX-Injected: 1")
    channel = webhook.WebhookChannel()
    try:
        result = await channel.send(intent, destination, attempt_id="attempt-1", fence=1)
    finally:
        await channel.aclose()

    assert (result.submission, result.outcome) == (Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert result.error is not None and "control character" in result.error
    assert listener.connections == 0


async def test_private_network_allowed_per_destination(env: SenderEnv, receiver: Receiver):
    """Two destinations on the same receiver, one allowed loopback, one not: only it is sent."""
    receiver.script("/open", Reply(200))
    receiver.script("/guarded", Reply(200))
    await env.destination(f"{receiver.url}/open", "open")
    await env.destination(f"http://localhost:{receiver.port}/guarded", "guarded", allow_private_network=False)
    await env.enqueue("a-open", destination="open")
    await env.enqueue("a-guarded", destination="guarded")
    await env.worker().run_once()
    assert (await env.box.get("a-open")).status is Status.DELIVERED
    assert (await env.box.get("a-guarded")).status is Status.DEAD
    assert [r.path for r in receiver.requests()] == ["/open"]


# -- evidence the sender receives must not be thrown away -----------------------------------------


async def test_a_200_whose_body_is_slow_is_still_delivered(env: SenderEnv, receiver: Receiver):
    """The receiver answers 200 at once, but its (informational) body comes after the read
    timeout. The status line is the receiver's acknowledgement: the attempt was submitted and
    answered 200, so it must not be recorded as 'maybe submitted / unknown'."""
    receiver.script("/hook", Reply(200, headers={"Content-Type": "application/json"},
                                   chunks=(b"", b'{"external_id": "E-2"}'), chunk_pause=1.0))
    await env.destination(f"{receiver.url}/hook", timeout_seconds=0.3, idempotent=False)
    await env.enqueue("a1")
    await env.worker().run_once()

    [attempt] = (await env.box.history("a1")).attempts
    assert attempt.status_code == 200
    assert attempt.submission is Submission.SUBMITTED
    assert (await env.box.get("a1")).status is Status.DELIVERED
    assert len(receiver.requests()) == 1


async def test_a_final_attempt_that_may_have_been_delivered_is_not_reported_dead(
        env: SenderEnv, receiver: Receiver):
    """max_attempts=1 and the only attempt timed out after the receiver got the request: the
    effect may have happened, so the intent is 'unknown' (README: an attempt may have taken
    effect), not 'dead' (which a harness reads as: it did not happen)."""
    receiver.script("/hook", Reply(200, delay=1.0))
    await env.destination(f"{receiver.url}/hook", timeout_seconds=0.3)  # idempotent, declared
    await env.enqueue("a1", max_attempts=1)
    await env.worker().run_once()

    [attempt] = (await env.box.history("a1")).attempts
    assert (attempt.submission, attempt.outcome) == (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)
    assert len(receiver.requests()) == 1
    assert (await env.box.wait("a1", timeout=5)).status is Status.UNKNOWN


async def test_what_on_call_is_asked_about_gets_a_log_line_naming_the_intent(env: SenderEnv, caplog):
    """The README's list of what the worker logs, beyond deliveries, retries and dead letters
    (those are checked against a real `outbox worker` process in the acceptance tests)."""
    caplog.set_level(logging.INFO, logger="outbox.sender")
    now = env.clock.now()
    await env.destination("http://127.0.0.1:9/hook", "off")
    await env.box.store.disable_destination("off", now)
    await env.enqueue("parked", destination="off")
    await env.destination("http://127.0.0.1:9/hook", "approve", requires_approval=True)
    held = await env.enqueue("lapsed", destination="approve")
    await operations.approve(env.box, "lapsed", operations.Actor("ops", "checked"),
                             payload_digest=held.payload_digest, valid_seconds=1)
    await env.destination("http://127.0.0.1:9/hook", "hook")
    await env.enqueue("rogue", scope="globex")  # the env's grant covers scope acme only
    env.clock.advance(2)  # past the approval
    assert await env.worker(worker_id="w1").run_once() == 3
    await env.enqueue("undecided")
    unavailable = CallableAuthority(lambda request: 1 / 0)  # a broken policy cannot decide
    assert await env.worker(worker_id="w2", authority=unavailable).run_once() == 1
    await env.enqueue("lost")
    [claimed] = await env.box.store.claim("vanished", now=env.clock.now(),
                                          lease_until=env.clock.now() + timedelta(seconds=30), limit=5)
    assert claimed.action_id == "lost"
    env.clock.advance(31)
    assert await env.worker(worker_id="w3").sweep() == 1

    lines = {(r.__dict__.get("action_id"), r.levelname): r.getMessage() for r in caplog.records}
    assert lines[("parked", "INFO")] == "not sent: destination is disabled; parked for 60s"
    assert lines[("lapsed", "INFO")] == "held: the approval expired before the send; approve it again"
    assert lines[("rogue", "WARNING")] == "revoked: no live grant lets scope 'globex' reach destination 'hook'"
    assert lines[("undecided", "WARNING")].startswith("not sent: authority unavailable (policy function raised")
    assert lines[("lost", "WARNING")] == "recovered an expired lease of vanished"
    for record in caplog.records:
        if record.__dict__.get("action_id"):
            assert record.__dict__["worker"] in ("w1", "w2", "w3") and record.__dict__["fence"] >= 1


# -- the end of the range of times ------------------------------------------------------------


async def test_at_the_latest_time_a_client_may_give_the_sender_still_computes_everything(open_env, receiver):
    """A clock at ``LATEST`` with every duration the sender adds at its maximum: a lease of a
    day, backoff and Retry-After capped at 30 days, an approval of 30 days, a receiver's
    retention of 90 days on an unknown outcome. Each is written and read back (a time past
    what a datetime holds would fail the write, or every later read)."""
    month = 30 * 86_400.0
    env: SenderEnv = await open_env(lease_seconds=86_400, backoff_initial_seconds=month, backoff_cap_seconds=month)
    env.clock.advance((LATEST - env.clock.now()).total_seconds())
    now = env.clock.now()  # (LATEST, to the float's precision)
    assert abs(now - LATEST) < timedelta(milliseconds=1)
    receiver.script("/busy", Reply(503, headers={"Retry-After": "999999999"}))
    receiver.script("/slow", Reply(200, delay=2))
    await env.destination(f"{receiver.url}/busy", "busy")
    await env.destination(f"{receiver.url}/slow", "slow", retention_seconds=90 * 86_400)
    await env.destination(f"{receiver.url}/busy", "approved", requires_approval=True)
    await env.enqueue("retried", destination="busy", not_before=LATEST, max_attempts=2)
    await env.enqueue("unknown", destination="slow", not_before=LATEST)
    held = await env.enqueue("held", destination="approved", not_before=LATEST)
    worker = env.worker()
    assert await worker.run_once() == 2  # (held waits for its approval)
    retried = await env.box.get("retried")
    assert retried.status is Status.PENDING and retried.next_attempt_at == now + timedelta(seconds=month)
    unknown = await env.box.get("unknown")  # (timed out: retried within the receiver's retention, jittered)
    assert unknown.status is Status.PENDING and now < unknown.next_attempt_at <= now + timedelta(seconds=month)
    approved = await operations.approve(env.box, "held", operations.Actor("ops", "checked"),
                                        payload_digest=held.payload_digest, valid_seconds=month)
    assert approved.approval_expires_at == now + timedelta(seconds=month)
    assert await worker.run_once() == 1
    env.clock.advance(month)
    assert await worker.run_once() == 3
    assert (await env.box.get("retried")).status is Status.DEAD  # out of attempts
    assert (await env.box.get("unknown")).next_attempt_at > now + timedelta(seconds=month)
    assert (await env.box.get("held")).status is Status.HELD  # its approval ran out
    listed = await env.box.list_intents(IntentQuery())
    assert [i.unreadable for i in listed.intents] == [None] * 3
