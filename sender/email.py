"""The email channel: one message per intent over SMTP, classified by the stage it reached.

Mail servers do not deduplicate, so the one question that matters is whether the final ``.`` of
DATA may have reached the server. Until the message is written nothing can have been accepted
(``not_submitted``: a refusal at connect, TLS, EHLO, AUTH, MAIL, RCPT or the DATA command);
once it is written, only the server's reply to it says what happened, and without that reply
the attempt is ``maybe_submitted``. The message is written by this module after aiosmtplib has
had the DATA command accepted, so that boundary is ours to see rather than inside a library call.

The socket is connected by ``sender.guard``, to an address the SSRF guard allowed, and handed to
aiosmtplib with the host's name for TLS verification. Connections are reused per destination
(at most its ``connections`` at once) and dropped after any failure.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import policy
from email.header import Header
from email.message import Message
from email.mime.base import MIMEBase
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import format_datetime, formataddr
from functools import cached_property
from typing import Annotated, Any, Literal

import aiosmtplib
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from outbox import Destination, DestinationSpec, Intent, OnUnknown, Outcome, Submission, hosts
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point
from receivers import wire

from . import guard
from .channel import REPLY_BYTES, ChannelModule, ProbeAnswer, SendResult

#: Recipients of one message (to, cc and bcc together).
MAX_RECIPIENTS = 50
MAX_ATTACHMENTS = 10
#: How long an idle connection is kept (servers drop idle sessions after a few minutes).
IDLE_SECONDS = 30.0
#: A dot-atom address (RFC 5322 addr-spec without quoted local parts or domain literals), ASCII.
ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
ADDR_SPEC = re.compile(
    rf"{ATEXT}+(?:\.{ATEXT}+)*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?\.)+[A-Za-z][A-Za-z0-9-]{{0,62}}")
#: ``Display Name <addr-spec>``: the name plain (no controls, quotes or angle brackets) or quoted
#: (``"Doe, Jane"``, with backslash escapes).
MAILBOX = re.compile(r'(?:"(?P<quoted>(?:[^"\\\x00-\x1f\x7f]|\\[^\x00-\x1f\x7f]){0,200})"'
                     rf"|(?P<name>[^\x00-\x1f\x7f<>\"]{{0,200}}?))\s*<(?P<addr>{ADDR_SPEC.pattern})>")
#: Where SMTP sees a line end (str.splitlines also splits at form feeds and the like, which SMTP
#: does not).
LINE_BREAK = re.compile(r"\r\n|\r|\n")
#: An RFC 5322 field name: printable ASCII but the colon.
HEADER_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]{1,76}")
#: Header values: no line breaks (header injection) or other controls but the tab.
HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]{0,900}")  # with its name, within a 998-character line
#: Headers the message sets itself: neither a payload nor a destination may set them.
OURS = frozenset(name.lower() for name in (
    "From", "Sender", "To", "Cc", "Bcc", "Subject", "Reply-To", "Message-ID", "Date", "MIME-Version",
    "Content-Type", "Content-Transfer-Encoding", "Return-Path", "Received",
    wire.IDEMPOTENCY_KEY, wire.ATTEMPT_ID, wire.FENCE, wire.PAYLOAD_DIGEST,
    # what mail systems read as who sent a message or what checked it: never a tenant's to say
    "Authentication-Results", "Received-SPF", "Delivered-To", "Return-Receipt-To"))
#: Families of headers that are likewise the message's or a mail system's own.
OURS_PREFIXES = ("resent-", "arc-", "dkim-", "content-", "list-id")
#: How messages are written: CRLF, and header lines up to RFC 5322's limit, so an identity
#: header (a digest, a long key) is never folded. The message is built with the email package's
#: compat32 classes, which take header values as written: the newer EmailMessage API parses and
#: refolds every header, about 0.9 ms a message here, six times the whole build this way.
WIRE = policy.compat32.clone(linesep="\r\n", max_line_length=998)
MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}")
#: What a final reply may name as the server's id of the queued message (Postfix, Exim, others).
QUEUE_ID = re.compile(r"(?:queued as|id=)\s*([A-Za-z0-9._-]{1,64})", re.I)


def mailbox(value: str) -> tuple[str, str]:
    """``a@example.com`` or ``Name <a@example.com>`` as (display name, address); ValueError
    otherwise."""
    if ADDR_SPEC.fullmatch(value) and len(value) <= 254:
        return "", value
    found = MAILBOX.fullmatch(value)
    if found is None or len(found["addr"]) > 254:
        raise ValueError(f"{value!r} is not an email address (a@example.com or Name <a@example.com>)")
    quoted = found["quoted"]
    name = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else found["name"].strip()
    return name, found["addr"]


def _written(value: str) -> str:
    """An address as a header holds it: the name quoted if it must be, RFC 2047 if not ASCII."""
    return formataddr(mailbox(value), charset="utf-8")


def _field(name: str, value: str) -> bytes:
    """One header line as the message holds it: ASCII that fits a line as it is (as the email
    package would write it, without its folding machinery, most of a message's build), anything
    else RFC 2047-encoded or folded by the email package."""
    if value.isascii() and len(name) + len(value) <= 996:  # "name: value" within 998 characters
        return f"{name}: {value}\r\n".encode("ascii")
    return WIRE.fold_binary(name, value if value.isascii() else Header(value, "utf-8", maxlinelen=998))  # type: ignore[arg-type]


def _mailbox(value: str) -> str:
    mailbox(value)
    return value


#: A field holding one address, checked as ``mailbox`` reads it.
Mailbox = Annotated[str, AfterValidator(_mailbox)]


def _headers(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        if not HEADER_NAME.fullmatch(name):
            raise ValueError(f"header name {name!r} is not a header field name")
        if name.lower() in OURS or name.lower().startswith(OURS_PREFIXES):
            raise ValueError(f"header {name!r} is set by the outbox or by mail systems and cannot be given")
        if not HEADER_VALUE.fullmatch(value):
            raise ValueError(f"header {name!r} holds a line break or control character, or is over 900 characters")
    return headers


class Attachment(BaseModel):
    """A small file sent with the message; its base64 counts against the payload limit."""

    model_config = ConfigDict(extra="forbid")

    filename: str = Field(pattern=r"^[^\x00-\x1f\x7f/\\]{1,200}$")
    content_type: str = "application/octet-stream"
    content: str = Field(description="the file's bytes, base64")

    @field_validator("content_type")
    @classmethod
    def _media_type(cls, value: str) -> str:
        if not MEDIA_TYPE.fullmatch(value):
            raise ValueError(f"content_type {value!r} is not a media type (type/subtype)")
        return value

    @field_validator("content")
    @classmethod
    def _base64(cls, value: str) -> str:
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError("content must be base64") from None
        return value


class EmailPayload(BaseModel):
    """What an intent for an email destination carries: checked at enqueue (a 422 naming the
    field), so a message that could never be built is never queued."""

    model_config = ConfigDict(extra="forbid")

    to: list[Mailbox] = Field(min_length=1, max_length=MAX_RECIPIENTS)
    cc: list[Mailbox] = Field(default_factory=list, max_length=MAX_RECIPIENTS)
    bcc: list[Mailbox] = Field(default_factory=list, max_length=MAX_RECIPIENTS)
    subject: str = Field(default="", pattern=r"^[^\x00-\x08\x0a-\x1f\x7f]{0,900}$")
    text: str | None = None
    html: str | None = None
    attachments: list[Attachment] = Field(default_factory=list, max_length=MAX_ATTACHMENTS)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _extra_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return _headers(headers)

    @model_validator(mode="after")
    def _whole(self) -> EmailPayload:
        if self.text is None and self.html is None:
            raise ValueError("give text or html (or both)")
        if len(self.recipients()) > MAX_RECIPIENTS:
            raise ValueError(f"at most {MAX_RECIPIENTS} recipients in to, cc and bcc together")
        return self

    def recipients(self) -> list[str]:
        """Every envelope recipient once, in order."""
        return list(dict.fromkeys(mailbox(v)[1] for v in (*self.to, *self.cc, *self.bcc)))


def check_payload(payload: Any) -> None:
    """The enqueue check: ValueError naming each refused field."""
    try:
        EmailPayload.model_validate(payload)
    except ValidationError as exc:
        raise ValueError("; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'payload'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors())) from None


class EmailSpec(DestinationSpec):
    """An email destination: the SMTP server its messages are handed to, and who sends them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    channel: Literal["email"]
    host: str = Field(max_length=253, description="the SMTP server (a relay or the recipients' MX)")
    port: StrictInt = Field(default=587, ge=1, le=65535)
    tls: Literal["starttls", "implicit", "none"] = Field(
        default="starttls", description="starttls (required, not opportunistic), implicit (port 465) or none")
    allow_insecure: StrictBool = Field(default=False, description="allow tls: none (the message and any password "
                                                                     "cross the network in the clear)")
    username: str | None = Field(default=None, max_length=256, description="AUTH user; the secret is its password")
    from_: Mailbox = Field(alias="from", description="the sender: a@example.com or Name <a@example.com>; its domain "
                                                 "names the Message-ID")
    reply_to: Mailbox | None = None
    headers: dict[str, str] = Field(default_factory=dict, description="added to every message")
    data_timeout_seconds: StrictFloat = Field(
        default=600.0, gt=0, le=3600, description="how long the reply to the end of a message may take (RFC 5321 "
                                                  "allows 10 minutes: servers scan before they queue); other "
                                                  "replies wait timeout_seconds")
    connections: StrictInt = Field(default=4, ge=1, le=256, description="connections to the server at most at once; "
                                                                  "each is reused for the next message")
    on_unknown: OnUnknown = Field(default=OnUnknown.NEVER, description="mail servers do not deduplicate: an "
                                                                       "unknown outcome waits for an operator")

    @cached_property
    def envelope_sender(self) -> str:
        """The address MAIL FROM names (read once per destination, not per message)."""
        return mailbox(self.from_)[1]

    @cached_property
    def from_header(self) -> str:
        """The From header as written."""
        return _written(self.from_)

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        return hosts.check_host(host)

    @field_validator("headers")
    @classmethod
    def _default_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return _headers(headers)

    @field_validator("secret")
    @classmethod
    def _password(cls, secret: str | None) -> str | None:
        if secret is not None and not 1 <= len(secret) <= 1024:
            raise ValueError("the secret (the AUTH password) must hold 1 to 1024 characters")
        return secret

    @model_validator(mode="after")
    def _consistent(self) -> EmailSpec:
        if self.tls == "none" and not self.allow_insecure:
            raise ValueError("tls: none sends in the clear; set allow_insecure to allow it")
        if self.reconcile:
            raise ValueError("an SMTP server cannot answer the reconcile probe; leave reconcile off")
        address = hosts.ip_literal(self.host)
        if address is not None and not hosts.is_public(str(address)) and not self.allow_private_network:
            raise ValueError(f"host {self.host} is not a public address (loopback, private, link-local or "
                             "reserved): set allow_private_network to send there")
        return self


def message_id(key: str, sender: str) -> str:
    """``<key@domain-of-sender>``, the same on every attempt: the intent key as a dot-atom (each
    character outside it, and a dot that would end it or double it, as ``=XX``)."""
    left = re.sub(r"[^A-Za-z0-9!#$%&'*+/?^_`{|}~.-]|\.(?=\.|$)|^\.",
                  lambda m: f"={ord(m.group()):02X}", key)
    return f"<{left}@{mailbox(sender)[1].rpartition('@')[2]}>"


# -- sending ---------------------------------------------------------------------------------


class _Refused(Exception):
    """An attempt that ended before the message was written: nothing was submitted."""

    def __init__(self, stage: str, outcome: Outcome, error: str, code: int | None = None,
                 reply: str | None = None) -> None:
        super().__init__(error)
        self.stage, self.outcome, self.error, self.code, self.reply = stage, outcome, error, code, reply


def _by_code(code: int) -> Outcome:
    """A reply refusing a command: 4xx is worth trying again, 5xx is permanent."""
    return Outcome.RETRYABLE if 400 <= code < 500 else Outcome.REJECTED


@dataclass
class _Pool:
    """One destination (as its settings read now): its spec, read once, and its open
    connections: idle ones, newest last, and the slots for all."""

    spec: EmailSpec
    slots: asyncio.Semaphore
    idle: list[tuple[aiosmtplib.SMTP, float]] = field(default_factory=list)
    current: bool = True  # False once the destination's settings changed

    def keep(self, client: aiosmtplib.SMTP) -> None:
        """Take a connection back for the next message, unless this pool is gone."""
        if self.current:
            self.idle.append((client, time.monotonic()))
        else:
            client.close()


class EmailChannel:
    """Hands intents to email destinations' SMTP servers over reused, guarded connections."""

    def __init__(self, *, clock: Clock | None = None, tls_context: ssl.SSLContext | None = None) -> None:
        self._clock = clock or SystemClock()
        self._tls = tls_context  # None until first needed: the system's trusted CAs, verified (made once)
        self._pools: dict[tuple[str, str, bool, float], _Pool] = {}

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        key = (destination.id, repr(sorted(destination.settings.items())), destination.allow_private_network,
               destination.timeout_seconds)  # (a connection keeps the timeout it was opened with)
        try:
            pool = self._pools.get(key) or self._replace_pool(key, destination)
            payload = EmailPayload.model_validate_json(intent.payload_json)
        except ValidationError as exc:  # stored before today's rules: it can never be sent
            return SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="build",
                              error=f"refused: the message cannot be built: {exc.errors()[0]['msg']}")
        spec = pool.spec
        message = self._message(intent, spec, payload, attempt_id, fence)
        async with pool.slots:
            for reused in self._idle(pool):
                result = await self._transact(reused, spec, payload, message, pool, reused=True)
                if result is not None:
                    return result  # (None: the idle connection had gone; nothing was submitted)
            try:
                client = await self._connect(spec, destination)
            except _Refused as stop:
                return SendResult(Submission.NOT_SUBMITTED, stop.outcome, status_code=stop.code,
                                  reply=stop.reply, error=stop.error, stage=stop.stage,
                                  answered=stop.code is not None)
            result = await self._transact(client, spec, payload, message, pool, reused=False)
            assert result is not None
            return result

    def _replace_pool(self, key: tuple[str, str, bool, float], destination: Destination) -> _Pool:
        """The pool for a destination's current settings; its pools for earlier ones are closed."""
        pool = _pool(destination)
        for stale in [k for k in self._pools if k[0] == destination.id]:
            old = self._pools.pop(stale)
            old.current = False  # its connections still in use are closed when they come back
            for client, _ in old.idle:
                client.close()
        self._pools[key] = pool
        return pool

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()  # it takes milliseconds: once per channel
        return self._tls

    def _idle(self, pool: _Pool) -> Iterator[aiosmtplib.SMTP]:
        """The pool's idle connections, newest first; those idle too long are closed."""
        while pool.idle:
            client, since = pool.idle.pop()
            if time.monotonic() - since < IDLE_SECONDS and client.is_connected:
                yield client
            else:
                client.close()

    async def _transact(self, client: aiosmtplib.SMTP, spec: EmailSpec, payload: EmailPayload, message: bytes,
                        pool: _Pool, *, reused: bool) -> SendResult | None:
        """MAIL, RCPT, DATA and the message on an open connection; None when a reused connection
        turned out closed before MAIL was answered (nothing was submitted: try a fresh one)."""
        stage = "mail"
        try:
            try:
                answer = await client.execute_command(b"MAIL", _path(b"FROM:", spec.envelope_sender))
            except (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPTimeoutError):
                if reused:
                    client.close()
                    return None
                raise
            if answer.code != 250:
                raise _Refused(stage, _by_code(answer.code), f"MAIL FROM refused: {answer.code} {answer.message}",
                               answer.code, f"{answer.code} {answer.message}")
            stage = "rcpt"
            accepted, refused = [], {}
            for recipient in payload.recipients():
                answer = await client.execute_command(b"RCPT", _path(b"TO:", recipient))
                if answer.code in (250, 251):
                    accepted.append(recipient)
                else:
                    refused[recipient] = (answer.code, answer.message)
            if not accepted:
                temporary = any(400 <= code < 500 for code, _ in refused.values())
                await _reset(client, pool)
                raise _Refused(stage, Outcome.RETRYABLE if temporary else Outcome.REJECTED,
                               "every recipient was refused: " + _listed(refused),
                               next(iter(refused.values()))[0], _listed(refused))
            stage = "data"
            started = await client.execute_command(b"DATA")
            if started.code != 354:
                raise _Refused(stage, _by_code(started.code), f"DATA refused: {started.code} {started.message}",
                               started.code, f"{started.code} {started.message}")
        except _Refused as stop:
            if stage != "rcpt":
                client.close()
            return SendResult(Submission.NOT_SUBMITTED, stop.outcome, status_code=stop.code,
                              reply=stop.reply, error=stop.error, stage=stop.stage, answered=True)
        except (aiosmtplib.SMTPException, OSError) as exc:
            client.close()
            return SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage=stage, error=_describe(exc))
        protocol = client.protocol
        try:
            if protocol is None:
                raise aiosmtplib.SMTPServerDisconnected("the connection closed after DATA was accepted")
            protocol.write(re.sub(rb"(?m)^\.", b"..", message) + b".\r\n")  # refuses a closing connection
        except aiosmtplib.SMTPServerDisconnected as exc:
            client.close()
            return SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="data", error=_describe(exc))
        # From here the message may reach the server: only its reply can say it did not.
        crash_point("after_request")
        try:
            reply = await protocol.read_response(timeout=spec.data_timeout_seconds)
        except (aiosmtplib.SMTPException, OSError) as exc:
            client.close()
            return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="message",
                              error=f"no reply to the end of the message: {_describe(exc)}")
        text = f"{reply.code} {reply.message}"[:REPLY_BYTES]
        if refused:
            text = f"{text}; refused: {_listed(refused)}"[:REPLY_BYTES]
        if reply.code == 250:
            pool.keep(client)
            queue_id = QUEUE_ID.search(reply.message)
            return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, status_code=250, reply=text,
                              external_id=queue_id[1] if queue_id else None, stage="done", answered=True)
        client.close()
        return SendResult(Submission.SUBMITTED, _by_code(reply.code), status_code=reply.code, reply=text,
                          error=f"the message was refused: {reply.code} {reply.message}"[:500], stage="done",
                          answered=True)

    async def _connect(self, spec: EmailSpec, destination: Destination) -> aiosmtplib.SMTP:
        """A connection through greeting, TLS, EHLO and AUTH. Raises _Refused."""
        timeout = destination.timeout_seconds
        stage = "connect"
        try:
            sock = await guard.connect(spec.host, spec.port, allow_private=destination.allow_private_network,
                                       timeout=timeout)
        except guard.PrivateAddressRefused as exc:
            raise _Refused(stage, Outcome.REJECTED, exc.explain()) from None
        except OSError as exc:
            raise _Refused(stage, Outcome.RETRYABLE, _describe(exc)) from None
        context = None if spec.tls == "none" else self._context()
        client = aiosmtplib.SMTP(hostname=spec.host, sock=sock, timeout=timeout,
                                 use_tls=spec.tls == "implicit", start_tls=False, tls_context=context)
        try:
            stage = "tls" if spec.tls == "implicit" else "connect"
            await client.connect()
            stage = "ehlo"
            await client.ehlo()
            if spec.tls == "starttls":
                stage = "tls"
                if not client.supports_extension("starttls"):
                    raise _Refused(stage, Outcome.REJECTED, "the server does not offer STARTTLS, which this "
                                   "destination requires (tls: starttls)")
                await client.starttls(tls_context=context)
                stage = "ehlo"
                await client.ehlo()
            if spec.username is not None:
                stage = "auth"
                if not destination.secrets:
                    raise _Refused(stage, Outcome.REJECTED, "the destination names a username but holds no password")
                await client.login(spec.username, destination.secrets[0])
            return client
        except _Refused:
            client.close()
            raise
        except aiosmtplib.SMTPResponseException as exc:
            client.close()
            raise _Refused(stage, _by_code(exc.code), f"{stage} refused: {exc.code} {exc.message}", exc.code,
                           f"{exc.code} {exc.message}"[:REPLY_BYTES]) from None
        except (aiosmtplib.SMTPException, OSError) as exc:
            client.close()
            raise _Refused(stage, Outcome.RETRYABLE, _describe(exc)) from None

    def _message(self, intent: Intent, spec: EmailSpec, payload: EmailPayload, attempt_id: str,
                 fence: int) -> bytes:
        fields = [("From", spec.from_header), ("To", ", ".join(map(_written, payload.to)))]
        if payload.cc:
            fields.append(("Cc", ", ".join(map(_written, payload.cc))))
        if spec.reply_to:
            fields.append(("Reply-To", _written(spec.reply_to)))
        fields += [("Subject", payload.subject), ("Date", format_datetime(self._clock.now())),
                   ("Message-ID", message_id(intent.key, spec.from_)), (wire.IDEMPOTENCY_KEY, intent.key),
                   (wire.PAYLOAD_DIGEST, intent.payload_digest), (wire.ATTEMPT_ID, attempt_id),
                   (wire.FENCE, str(fence)), *{**spec.headers, **payload.headers}.items()]
        body = _single(payload)
        written = b"".join(_field(name, value) for name, value in fields) + (
            _body(payload).as_bytes(policy=WIRE) if body is None else body)
        return written if written.endswith(b"\r\n") else written + b"\r\n"  # the final "." needs a line of its own

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="an SMTP server cannot be asked what became of a message")

    async def aclose(self) -> None:
        for pool in self._pools.values():
            for client, _ in pool.idle:
                client.close()
        self._pools.clear()


def _plain(text: str) -> bool:
    """Whether a body is ASCII in lines SMTP carries as they are (sent 7bit, else UTF-8 in base64)."""
    return text.isascii() and all(len(line) <= 998 for line in LINE_BREAK.split(text))


def _part(text: str, subtype: str) -> MIMEText:
    """One body, 7bit when it is plain, else UTF-8 in base64."""
    return MIMEText(text, subtype, "us-ascii" if _plain(text) else "utf-8")


def _single(payload: EmailPayload) -> bytes | None:
    """The MIME part of a message that is one plain body (text or html, no attachments), written
    as ``_body`` and the email package write it (a test holds the two equal) without building
    its MIME objects, which took most of such a message's build; None for any other message."""
    bodies = [(body, subtype) for body, subtype in ((payload.text, "plain"), (payload.html, "html"))
              if body is not None]
    if len(bodies) != 1 or payload.attachments or not _plain(bodies[0][0]):
        return None
    text, subtype = bodies[0]
    return (f'Content-Type: text/{subtype}; charset="us-ascii"\r\nMIME-Version: 1.0\r\n'
            "Content-Transfer-Encoding: 7bit\r\n\r\n" + "\r\n".join(LINE_BREAK.split(text))).encode("ascii")


def _body(payload: EmailPayload) -> Message:
    """The MIME tree: text or html, both as multipart/alternative, attachments beside it in
    multipart/mixed (their base64 is sent as given, in 76-character lines)."""
    parts = [_part(body, subtype) for body, subtype in ((payload.text, "plain"), (payload.html, "html"))
             if body is not None]
    body: Message = parts[0] if len(parts) == 1 else MIMEMultipart("alternative", _subparts=parts)
    if not payload.attachments:
        return body
    files: list[Message] = []
    for attachment in payload.attachments:
        file = MIMEBase(*attachment.content_type.split("/", 1))
        file.set_payload("\r\n".join(attachment.content[i:i + 76] for i in range(0, len(attachment.content), 76)))
        file["Content-Transfer-Encoding"] = "base64"
        name = attachment.filename
        file.add_header("Content-Disposition", "attachment", filename=name if name.isascii() else ("utf-8", "", name))
        files.append(file)
    return MIMEMultipart("mixed", _subparts=[body, *files])


def _pool(destination: Destination) -> _Pool:
    """A destination's pool, its settings checked by today's rules (raises ValidationError)."""
    spec = EmailSpec.model_validate({**destination.settings, "channel": "email",
                                     "allow_private_network": destination.allow_private_network})
    return _Pool(spec, asyncio.Semaphore(spec.connections))


def _path(prefix: bytes, address: str) -> bytes:
    """MAIL's or RCPT's argument: an address ``mailbox`` accepted is a dot-atom of ASCII, which
    SMTP takes as it is (aiosmtplib's mail and rcpt parse it again, per message, to quote it)."""
    return prefix + b"<" + address.encode("ascii") + b">"


async def _reset(client: aiosmtplib.SMTP, pool: _Pool) -> None:
    """End a transaction that will not be sent, keeping the connection if the server agrees."""
    try:
        await client.rset()
    except (aiosmtplib.SMTPException, OSError):
        client.close()
    else:
        pool.keep(client)


def _listed(refused: dict[str, tuple[int, str]]) -> str:
    return ", ".join(f"{address} ({code} {text})" for address, (code, text) in refused.items())[:REPLY_BYTES]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


CHANNEL = ChannelModule(
    name="email", spec=EmailSpec, needs_secret=False, check_payload=check_payload,
    open=lambda concurrency: EmailChannel(),
)
