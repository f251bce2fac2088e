"""The email channel against a real SMTP server (aiosmtpd on loopback): each stage's failure is
recorded as what it is, held against what the server really received."""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from outbox import Attempt, Intent, Outcome, Status, Submission, operations
from sender.email import EmailChannel, EmailSpec, message_id
from tests.conftest import eventually
from tests.smtp import SmtpServer

from ..mta import Postfix
from ..problems import assert_problem
from .conftest import Api, SenderEnv
from .test_mta import require_postfix

FROM = "Billing <billing@example.com>"
MAIL = {"to": ["Ann <ann@example.org>"], "subject": "Your receipt", "text": "Thank you."}


@pytest.fixture
def servers() -> Iterator[list[SmtpServer]]:
    started: list[SmtpServer] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def smtp(servers: list[SmtpServer]) -> SmtpServer:
    """A plain server (tls none); tests needing TLS or AUTH start their own."""
    server = SmtpServer().start()
    servers.append(server)
    return server


@pytest.fixture
def mail_env(env: SenderEnv) -> SenderEnv:
    return env


def register(env: SenderEnv, server: SmtpServer, destination_id: str = "mail", **spec: Any) -> Any:
    options: dict[str, Any] = {"channel": "email", "host": "127.0.0.1", "port": server.port, "from": FROM,
                               "allow_private_network": True, "timeout_seconds": 1.0, "data_timeout_seconds": 1.0,
                               "tls": server.tls, "allow_insecure": server.tls == "none", **spec}
    return env.box.put_destination(destination_id, EmailSpec.model_validate(options))


async def deliver(env: SenderEnv, action_id: str, payload: dict[str, Any] | None = None,
                  destination: str = "mail", attempts: int = 1, enqueue: bool = True) -> tuple[Intent, Attempt]:
    """Enqueue (unless it is there already), run a worker until ``attempts`` attempts have
    finished; the intent and its last."""
    if enqueue:
        await env.enqueue(action_id, MAIL if payload is None else payload, destination=destination)
    channel = EmailChannel(tls_context=SmtpServer.client_context())

    async def finished() -> bool:
        history = await env.box.history(action_id)
        return len(history.attempts) >= attempts and history.attempts[-1].finished_at is not None

    async with env.running(channels={"email": channel}):
        assert await eventually(finished, timeout=10)
    history = await env.box.history(action_id)
    await channel.aclose()
    return await env.box.get(action_id), history.attempts[-1]


def facts(attempt: Attempt) -> tuple[str | None, Submission | None, Outcome | None]:
    return attempt.stage, attempt.submission, attempt.outcome


async def test_a_message_over_starttls_and_auth_is_delivered_with_its_identity(mail_env: SenderEnv, servers):
    server = SmtpServer(tls="starttls", auth=("mailer", "s3cret")).start()
    servers.append(server)
    await register(mail_env, server, username="mailer", secret="s3cret", headers={"X-Campaign": "receipts"})
    attachment = base64.b64encode(b"%PDF-1.4 receipt").decode()
    intent, attempt = await deliver(mail_env, "receipt-1", {
        **MAIL, "cc": ["cfo@example.org"], "bcc": ["audit@example.net"], "html": "<p>Thank you.</p>",
        "headers": {"X-Order": "42"},
        "attachments": [{"filename": "receipt.pdf", "content_type": "application/pdf", "content": attachment}]})
    assert intent.status is Status.DELIVERED
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
    assert attempt.external_id == "Q1" and attempt.reply.startswith("250")
    [got] = server.received
    assert got.sender == "billing@example.com"
    assert got.recipients == ["ann@example.org", "cfo@example.org", "audit@example.net"]
    message = got.message
    assert message["Message-ID"] == message_id("acme/receipt-1", FROM) == "<acme/receipt-1@example.com>"
    assert (message["Idempotency-Key"], message["Outbox-Fence"], message["Outbox-Attempt-Id"]) == (
        "acme/receipt-1", "1", attempt.attempt_id)
    assert message["Payload-Digest"] == intent.payload_digest
    assert (message["From"], message["To"], message["Cc"], message["Bcc"]) == (
        FROM, "Ann <ann@example.org>", "cfo@example.org", None)
    assert (message["Subject"], message["X-Campaign"], message["X-Order"]) == ("Your receipt", "receipts", "42")
    assert message.get_body(("plain",)).get_content().strip() == "Thank you."
    assert message.get_body(("html",)).get_content().strip() == "<p>Thank you.</p>"
    [pdf] = message.iter_attachments()
    assert (pdf.get_filename(), pdf.get_content()) == ("receipt.pdf", b"%PDF-1.4 receipt")


async def test_messages_to_one_destination_share_a_connection(mail_env: SenderEnv, smtp: SmtpServer):
    await register(mail_env, smtp)
    for n in range(3):
        await mail_env.enqueue(f"m-{n}", MAIL, destination="mail")
    channel = EmailChannel()

    async def all_delivered() -> bool:
        return all([await mail_env.status_is(f"m-{n}", Status.DELIVERED) for n in range(3)])

    async with mail_env.running(channels={"email": channel}, concurrency=1):
        assert await eventually(all_delivered, timeout=10)
    await channel.aclose()
    assert len(smtp.received) == 3 and smtp.sessions == 1
    assert len({r.message["Message-ID"] for r in smtp.received}) == 3


async def test_a_refused_password_is_not_submitted_and_dead(mail_env: SenderEnv, servers):
    server = SmtpServer(tls="starttls", auth=("mailer", "s3cret")).start()
    servers.append(server)
    await register(mail_env, server, username="mailer", secret="wrong")
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("auth", Submission.NOT_SUBMITTED, Outcome.REJECTED) and attempt.status_code == 535
    assert intent.status is Status.DEAD and server.received == []


async def test_a_server_without_starttls_is_refused_before_anything_is_sent(mail_env: SenderEnv, smtp: SmtpServer):
    await register(mail_env, smtp, tls="starttls")
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("tls", Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert "STARTTLS" in attempt.error and intent.status is Status.DEAD and smtp.received == []


@pytest.mark.parametrize(("reply", "status", "outcome"), [
    ("550 5.1.1 no such user", Status.DEAD, Outcome.REJECTED),
    ("450 4.2.0 mailbox busy", Status.PENDING, Outcome.RETRYABLE),
])
async def test_every_recipient_refused_is_not_submitted(mail_env: SenderEnv, smtp: SmtpServer, reply, status,
                                                        outcome):
    smtp.rcpt["ann@example.org"] = reply
    await register(mail_env, smtp)
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("rcpt", Submission.NOT_SUBMITTED, outcome)
    assert intent.status is status and "ann@example.org" in attempt.reply and smtp.received == []


async def test_some_recipients_refused_is_delivered_to_the_others_with_the_refused_recorded(
        mail_env: SenderEnv, smtp: SmtpServer):
    smtp.rcpt["gone@example.org"] = "550 5.1.1 no such user"
    await register(mail_env, smtp)
    intent, attempt = await deliver(mail_env, "m-1", {**MAIL, "cc": ["gone@example.org"]})
    assert intent.status is Status.DELIVERED
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
    assert "refused: gone@example.org (550 5.1.1 no such user)" in attempt.reply
    [got] = smtp.received
    assert got.recipients == ["ann@example.org"]


async def test_a_refused_data_command_is_not_submitted(mail_env: SenderEnv, smtp: SmtpServer):
    smtp.data_command = "451 4.3.0 try again later"
    await register(mail_env, smtp)
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("data", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)
    assert intent.status is Status.PENDING and smtp.received == []


@pytest.mark.parametrize(("reply", "status", "outcome"), [
    ("554 5.7.1 looks like spam", Status.DEAD, Outcome.REJECTED),
    ("452 4.3.1 out of storage", Status.PENDING, Outcome.RETRYABLE),
])
async def test_a_refusal_of_the_message_itself_is_an_answer(mail_env: SenderEnv, smtp: SmtpServer, reply, status,
                                                            outcome):
    smtp.after_data = reply
    await register(mail_env, smtp)
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("done", Submission.SUBMITTED, outcome) and attempt.status_code == int(reply[:3])
    assert intent.status is status and len(smtp.received) == 1


@pytest.mark.parametrize("after_data", ["close", "hold"])
async def test_no_reply_to_the_message_is_unknown_and_waits_for_an_operator(mail_env: SenderEnv,
                                                                            smtp: SmtpServer, after_data):
    """The server holds the whole message and then drops the connection, or never answers: it
    may deliver it, so the attempt is maybe_submitted and (on_unknown: never) the intent unknown."""
    smtp.after_data = after_data
    await register(mail_env, smtp)
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("message", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)
    assert "no reply to the end of the message" in attempt.error
    assert intent.status is Status.UNKNOWN and len(smtp.received) == 1
    assert smtp.received[0].message["Message-ID"] == "<acme/m-1@example.com>"


async def test_a_connection_refused_is_not_submitted(mail_env: SenderEnv, smtp: SmtpServer, closed_port: int):
    await register(mail_env, smtp, port=closed_port)
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)
    assert intent.status is Status.PENDING


async def test_a_host_resolving_to_loopback_is_refused_by_the_guard(mail_env: SenderEnv, smtp: SmtpServer):
    await register(mail_env, smtp, host="localhost", allow_private_network=False, tls="none", allow_insecure=True)
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert "non-public" in attempt.error and intent.status is Status.DEAD and smtp.sessions == 0


async def test_a_stored_special_purpose_host_is_refused_without_a_connection(
        mail_env: SenderEnv, smtp: SmtpServer):
    """A row stored before registration refused it: ::ffff:0:7f00:1 (SIIT's form of 127.0.0.1,
    outside IPv6's global unicast space) is refused when the stored settings are read back to
    send, before any connection."""
    await register(mail_env, smtp, tls="none", allow_insecure=True)
    assert mail_env.path is not None
    with sqlite3.connect(mail_env.path, timeout=10) as conn:
        conn.execute("UPDATE destinations SET settings = json_set(settings, '$.host', '::ffff:0:7f00:1'), "
                     "allow_private_network = 0 WHERE id = 'mail'")
    conn.close()
    intent, attempt = await deliver(mail_env, "m-1")
    assert facts(attempt) == ("build", Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert "is not a public address" in attempt.error and intent.status is Status.DEAD and smtp.sessions == 0


async def test_the_api_registers_email_destinations_and_refuses_bad_mail_naming_the_field(api: Api):
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        registered = await admin.put("/v1/destinations/receipts", json={
            "channel": "email", "host": "smtp.example.com", "port": 465, "tls": "implicit", "from": FROM,
            "username": "mailer", "secret": "hunter2-password"})
        assert registered.status_code == 201, registered.text
        shown = registered.json()
        assert (shown["channel"], shown["host"], shown["from"], shown["on_unknown"]) == (
            "email", "smtp.example.com", FROM, "never")
        assert "hunter2" not in registered.text and shown["signing_secrets"] == 0  # a password signs nothing
        assert (await admin.get("/v1/destinations/receipts")).json()["signing_secrets"] == 0
        insecure = await admin.put("/v1/destinations/plain", json={
            "channel": "email", "host": "smtp.example.com", "tls": "none", "from": FROM})
        assert_problem(insecure, 422, "invalid-input", "set allow_insecure")
        await admin.put("/v1/grants/acme-receipts", json={"scope": "acme", "destination": "receipts"})
        bad = await producer.post("/v1/intents", json={"scope": "acme", "destination": "receipts", "payload": {
            "to": ["ann@example.org", "not an address"], "text": "hi", "headers": {"Date": "yesterday"}}})
        assert_problem(bad, 422, "invalid-input", "the payload cannot be sent by the email channel: to.1: "
                                                  "'not an address' is not an email address")
        assert "headers: header 'Date' is set by the outbox" in bad.json()["detail"]
        good = await producer.post("/v1/intents", json={"scope": "acme", "destination": "receipts",
                                                        "action_id": "r-1", "payload": MAIL})
        assert good.status_code == 201 and good.json()["channel"] == "email"


async def test_a_message_goes_through_a_real_mta_with_its_identity(mail_env: SenderEnv, smtp: SmtpServer):
    """Through Debian's postfix (a private instance) to the sink: the queue id postfix named is
    the attempt's external id, and what arrives parses with its headers and body intact."""
    require_postfix()
    with Postfix("127.0.0.1", smtp.port) as mta:
        await register(mail_env, smtp, port=mta.port, tls="none", allow_insecure=True)
        intent, attempt = await deliver(mail_env, "relayed-1", {
            **MAIL, "html": "<p>Thank you.</p>", "headers": {"X-Order": "42"}})
        assert intent.status is Status.DELIVERED, attempt
        assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
        assert attempt.external_id and attempt.external_id in mta.maillog()
        assert await eventually(lambda: len(smtp.received) == 1, timeout=20), mta.maillog()
    [got] = smtp.received
    message = got.message
    assert got.recipients == ["ann@example.org"] and got.sender == "billing@example.com"
    assert message["Message-ID"] == "<acme/relayed-1@example.com>"
    assert (message["Idempotency-Key"], message["Payload-Digest"]) == ("acme/relayed-1", intent.payload_digest)
    assert (message["From"], message["To"], message["X-Order"]) == (FROM, "Ann <ann@example.org>", "42")
    assert "(Postfix)" in message["Received"]
    assert message.get_body(("plain",)).get_content().splitlines() == ["Thank you."]
    assert message.get_body(("html",)).get_content().splitlines() == ["<p>Thank you.</p>"]


async def test_implicit_tls_is_verified_against_the_host_name(mail_env: SenderEnv, servers):
    server = SmtpServer(tls="implicit").start()
    servers.append(server)
    await register(mail_env, server, host="localhost", tls="implicit")  # the certificate names localhost
    intent, attempt = await deliver(mail_env, "m-1")
    assert intent.status is Status.DELIVERED and len(server.received) == 1
    untrusted = EmailChannel()  # the system's CAs only: the test CA's certificate is refused
    await mail_env.enqueue("m-2", MAIL, destination="mail")
    async with mail_env.running(channels={"email": untrusted}):
        assert await eventually(lambda: _finished(mail_env, "m-2"), timeout=10)
    await untrusted.aclose()
    [attempt] = (await mail_env.box.history("m-2")).attempts
    assert facts(attempt) == ("tls", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)
    assert "CERTIFICATE_VERIFY_FAILED" in attempt.error and len(server.received) == 1


async def _finished(env: SenderEnv, action_id: str) -> bool:
    attempts = (await env.box.history(action_id)).attempts
    return bool(attempts) and attempts[-1].finished_at is not None


async def test_names_subjects_bodies_and_file_names_beyond_ascii_arrive_as_written(mail_env: SenderEnv,
                                                                                    smtp: SmtpServer):
    await register(mail_env, smtp, **{"from": "Bücherstube Köln <laden@example.com>"})
    intent, _ = await deliver(mail_env, "m-1", {
        "to": ["José Pérez <jose@example.org>", "\"Doe, Jane\" <jane@example.org>"], "subject": "Ihre Rechnung — 42 €",
        "text": "Grüße\n.a line that starts with a dot\n", "html": "<p>Grüße</p>", "headers": {"X-Note": "naïve"},
        "attachments": [{"filename": "Rechnung-ä.txt", "content_type": "text/plain",
                         "content": base64.b64encode("zwölf".encode()).decode()}]})
    assert intent.status is Status.DELIVERED
    message = smtp.received[0].message
    assert message["From"] == "Bücherstube Köln <laden@example.com>"
    assert [a.addr_spec for a in message["To"].addresses] == ["jose@example.org", "jane@example.org"]
    assert [a.display_name for a in message["To"].addresses] == ["José Pérez", "Doe, Jane"]
    assert (message["Subject"], message["X-Note"]) == ("Ihre Rechnung — 42 €", "naïve")
    assert message.get_body(("plain",)).get_content().splitlines() == ["Grüße", ".a line that starts with a dot"]
    assert message.get_body(("html",)).get_content().strip() == "<p>Grüße</p>"
    [file] = message.iter_attachments()
    assert (file.get_filename(), file.get_payload(decode=True)) == ("Rechnung-ä.txt", "zwölf".encode())


async def test_an_unknown_email_resolved_retry_is_sent_again_under_the_same_message_id(mail_env: SenderEnv,
                                                                                         smtp: SmtpServer):
    """What the README tells an operator: an unknown email settled with `retry` goes out again
    with the same Message-ID, so the recipient's system can tell it is the same message."""
    smtp.after_data = "close"
    await register(mail_env, smtp)
    intent, attempt = await deliver(mail_env, "m-1")
    assert intent.status is Status.UNKNOWN
    smtp.after_data = "250 2.0.0 Ok: queued as AGAIN"
    await operations.resolve(mail_env.box, "m-1", operations.Resolution.RETRY,
                             operations.Actor("operator", "not in the relay's log"))
    intent, attempt = await deliver(mail_env, "m-1", attempts=2, enqueue=False)
    assert intent.status is Status.DELIVERED and attempt.external_id == "AGAIN" and attempt.number == 2
    first, second = (r.message for r in smtp.received)
    assert first["Message-ID"] == second["Message-ID"] == "<acme/m-1@example.com>"
    assert (first["Outbox-Fence"], second["Outbox-Fence"]) == ("1", "2")
    assert first["Outbox-Attempt-Id"] != second["Outbox-Attempt-Id"]


async def test_a_reply_with_bytes_no_store_can_keep_still_records_the_delivery(mail_env: SenderEnv,
                                                                                smtp: SmtpServer):
    """A control character in the server's reply (a NUL, which PostgreSQL cannot store in text)
    is recorded as U+FFFD: the answered delivery stays delivered, its history readable."""
    smtp.after_data = "250 2.0.0 Ok: queued as Q\x00\x07{n}"
    await register(mail_env, smtp)
    intent, attempt = await deliver(mail_env, "m-1")
    assert intent.status is Status.DELIVERED
    assert attempt.reply == "250 2.0.0 Ok: queued as Q\ufffd\ufffd1"


async def test_a_body_whose_lines_smtp_cannot_carry_is_encoded_rather_than_sent_as_it_is(mail_env: SenderEnv,
                                                                                         smtp: SmtpServer):
    """Lines over SMTP's 998 characters (a form feed does not end a line for SMTP) go in base64."""
    await register(mail_env, smtp)
    text = ("c" * 900 + "\x0c") * 3
    intent, _ = await deliver(mail_env, "m-1", {**MAIL, "text": text})
    assert intent.status is Status.DELIVERED
    raw = smtp.received[0].content
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    assert smtp.received[0].message.get_body(("plain",)).get_content() == text


async def test_the_reply_to_the_end_of_a_message_may_take_longer_than_the_other_replies(mail_env: SenderEnv,
                                                                                         smtp: SmtpServer):
    """A server that scans a message before it queues it answers the final "." late (RFC 5321
    allows ten minutes): that wait is data_timeout_seconds, not timeout_seconds."""
    smtp.data_delay = 1.5
    await register(mail_env, smtp, timeout_seconds=0.5, data_timeout_seconds=10)
    intent, attempt = await deliver(mail_env, "m-1")
    assert intent.status is Status.DELIVERED and facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)


class Batches(EmailChannel):
    """The email channel, noting the attempts of each batch a worker hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def send_many(self, sends):
        self.batches.append(sorted(send.intent.action_id for send in sends))
        return await super().send_many(sends)


@pytest.fixture
async def batch_env(open_env) -> SenderEnv:
    """Authority allows all: a cycle starts its leases together, none waits on a read."""
    return await open_env(authority="allow-all")


async def batch(env: SenderEnv, payloads: dict[str, dict[str, Any]]) -> Batches:
    """Deliver a warm-up message (the destination is read and cached), then ``payloads`` (by
    action id) in one cycle of a worker."""
    channel = Batches()
    worker = env.worker(channels={"email": channel}, concurrency=8)
    await env.enqueue("warm", MAIL, destination="mail")
    assert await worker.run_once() == 1
    for action_id, payload in payloads.items():
        await env.enqueue(action_id, payload, destination="mail")
    assert await worker.run_once() == len(payloads)
    await worker.aclose()
    return channel


async def test_a_cycles_messages_go_out_at_once_on_the_pools_connections_each_answered_in_its_place(
        batch_env: SenderEnv, smtp: SmtpServer):
    smtp.rcpt["gone@example.org"] = "550 5.1.1 no such user"
    await register(batch_env, smtp, connections=2)
    channel = await batch(batch_env, {**{f"m-{n}": MAIL for n in range(4)},
                                      "nobody": {**MAIL, "to": ["gone@example.org"]}})
    assert channel.batches == [["m-0", "m-1", "m-2", "m-3", "nobody"]]
    assert smtp.sessions == 2  # the warm-up's connection, and one more lane
    for n in range(4):
        intent, attempt = await batch_env.box.get(f"m-{n}"), (await batch_env.box.history(f"m-{n}")).attempts[-1]
        assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
        assert intent.status is Status.DELIVERED
    attempt = (await batch_env.box.history("nobody")).attempts[-1]
    assert facts(attempt) == ("rcpt", Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert sorted(r.message["Message-ID"] for r in smtp.received) == [
        f"<acme/{name}@example.com>" for name in ("m-0", "m-1", "m-2", "m-3", "warm")]


async def test_a_cycles_messages_go_through_a_real_mta_each_with_its_queue_id(batch_env: SenderEnv,
                                                                               smtp: SmtpServer):
    require_postfix()
    with Postfix("127.0.0.1", smtp.port) as mta:
        await register(batch_env, smtp, port=mta.port, tls="none", allow_insecure=True, connections=2)
        channel = await batch(batch_env, {f"m-{n}": MAIL for n in range(3)})
        assert channel.batches == [["m-0", "m-1", "m-2"]]
        attempts = [(await batch_env.box.history(f"m-{n}")).attempts[-1] for n in range(3)]
        assert [facts(a) for a in attempts] == [("done", Submission.SUBMITTED, Outcome.DELIVERED)] * 3
        assert len({a.external_id for a in attempts}) == 3
        assert all(a.external_id and a.external_id in mta.maillog() for a in attempts)
        assert await eventually(lambda: len(smtp.received) == 4, timeout=20), mta.maillog()
