"""The email channel's sends: one message per intent over a pooled connection, classified by
the stage it reached.

Mail servers do not deduplicate, so the one question that matters is whether the final ``.`` of
DATA may have reached the server. Until the message is written nothing can have been accepted
(``not_submitted``: a refusal at connect, TLS, EHLO, AUTH, MAIL, RCPT or the DATA command);
once it is written, only the server's reply to it says what happened, and without that reply
the attempt is ``maybe_submitted``. The message is written here after aiosmtplib has had the
DATA command accepted, so that boundary is ours to see rather than inside a library call.

A worker's cycle hands over its messages at once (``send_many``); they go out on the pool's
connections as lanes, one transaction at a time on each, as many at once as the destination
allows connections. SMTP's PIPELINING would let one connection carry the next transaction's
commands behind a message, but aiosmtplib reads one reply per command written (a second reply
arriving with the first is lost), so one lane is one connection.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Sequence

import aiosmtplib
from pydantic import ValidationError

from outbox import Destination, Intent, Outcome, Submission
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point

from ..channel import REPLY_BYTES, ProbeAnswer, Send, SendResult
from .connection import Refused, by_code, connect, describe
from .destination import EmailSpec
from .message import compose
from .payload import EmailPayload
from .pool import Pool, Pools

#: What a final reply may name as the server's id of the queued message (Postfix, Exim, others).
QUEUE_ID = re.compile(r"(?:queued as|id=)\s*([A-Za-z0-9._-]{1,64})", re.I)


class EmailChannel:
    """Hands intents to email destinations' SMTP servers over reused, guarded connections."""

    def __init__(self, *, clock: Clock | None = None, tls_context: ssl.SSLContext | None = None) -> None:
        self._clock = clock or SystemClock()
        self._tls = tls_context  # None until first needed: the system's trusted CAs, verified (made once)
        self._pools = Pools()

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        return await self._send(Send(intent, destination, attempt_id, fence))

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        """Each message on a connection of its destination's pool, as many at once as it has
        connections (its lanes); one message's failure, whatever it is, is its own result."""
        results = await asyncio.gather(*map(self._send, sends), return_exceptions=True)
        return [_lost(result) if isinstance(result, BaseException) else result for result in results]

    async def _send(self, send: Send) -> SendResult:
        intent, destination = send.intent, send.destination
        try:
            pool = self._pools.get(destination)
            payload = EmailPayload.model_validate_json(intent.payload_json)
        except ValidationError as exc:  # stored before today's rules: it can never be sent
            return SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="build",
                              error=f"refused: the message cannot be built: {exc.errors()[0]['msg']}")
        spec = pool.spec
        message = compose(intent, spec, payload, attempt_id=send.attempt_id, fence=send.fence,
                          date=self._clock.now(), context=send.context)
        async with pool.slots:
            for reused in pool.reusable():
                result = await self._transact(reused, spec, payload, message, pool, reused=True)
                if result is not None:
                    return result  # (None: the idle connection had gone; nothing was submitted)
            try:
                client = await connect(spec, destination, None if spec.tls == "none" else self._context())
            except Refused as stop:
                return SendResult(Submission.NOT_SUBMITTED, stop.outcome, status_code=stop.code,
                                  reply=stop.reply, error=stop.error, stage=stop.stage,
                                  answered=stop.code is not None)
            result = await self._transact(client, spec, payload, message, pool, reused=False)
            assert result is not None
            return result

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()  # it takes milliseconds: once per channel
        return self._tls

    async def _transact(self, client: aiosmtplib.SMTP, spec: EmailSpec, payload: EmailPayload, message: bytes,
                        pool: Pool, *, reused: bool) -> SendResult | None:
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
                raise Refused(stage, by_code(answer.code), f"MAIL FROM refused: {answer.code} {answer.message}",
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
                raise Refused(stage, Outcome.RETRYABLE if temporary else Outcome.REJECTED,
                               "every recipient was refused: " + _listed(refused),
                               next(iter(refused.values()))[0], _listed(refused))
            stage = "data"
            started = await client.execute_command(b"DATA")
            if started.code != 354:
                raise Refused(stage, by_code(started.code), f"DATA refused: {started.code} {started.message}",
                               started.code, f"{started.code} {started.message}")
        except Refused as stop:
            if stage != "rcpt":
                client.close()
            return SendResult(Submission.NOT_SUBMITTED, stop.outcome, status_code=stop.code,
                              reply=stop.reply, error=stop.error, stage=stop.stage, answered=True)
        except (aiosmtplib.SMTPException, OSError) as exc:
            client.close()
            return SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage=stage, error=describe(exc))
        protocol = client.protocol
        try:
            if protocol is None:
                raise aiosmtplib.SMTPServerDisconnected("the connection closed after DATA was accepted")
            protocol.write(re.sub(rb"(?m)^\.", b"..", message) + b".\r\n")  # refuses a closing connection
        except aiosmtplib.SMTPServerDisconnected as exc:
            client.close()
            return SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="data", error=describe(exc))
        # From here the message may reach the server: only its reply can say it did not.
        crash_point("after_request")
        try:
            reply = await protocol.read_response(timeout=spec.data_timeout_seconds)
        except (aiosmtplib.SMTPException, OSError) as exc:
            client.close()
            return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="message",
                              error=f"no reply to the end of the message: {describe(exc)}")
        text = f"{reply.code} {reply.message}"[:REPLY_BYTES]
        if refused:
            text = f"{text}; refused: {_listed(refused)}"[:REPLY_BYTES]
        if reply.code == 250:
            pool.keep(client)
            queue_id = QUEUE_ID.search(reply.message)
            return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, status_code=250, reply=text,
                              external_id=queue_id[1] if queue_id else None, stage="done", answered=True)
        client.close()
        return SendResult(Submission.SUBMITTED, by_code(reply.code), status_code=reply.code, reply=text,
                          error=f"the message was refused: {reply.code} {reply.message}"[:500], stage="done",
                          answered=True)

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="an SMTP server cannot be asked what became of a message")

    async def aclose(self) -> None:
        self._pools.close()


def _lost(exc: BaseException) -> SendResult:
    """A message whose send failed on an error of our own (not the server's answer): handed over,
    it may have been written, so ``maybe_submitted``. Anything but an Exception is raised again."""
    if not isinstance(exc, Exception):
        raise exc
    return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, error=describe(exc))


def _path(prefix: bytes, address: str) -> bytes:
    """MAIL's or RCPT's argument: an address ``mailbox`` accepted is a dot-atom of ASCII, which
    SMTP takes as it is (aiosmtplib's mail and rcpt parse it again, per message, to quote it)."""
    return prefix + b"<" + address.encode("ascii") + b">"


async def _reset(client: aiosmtplib.SMTP, pool: Pool) -> None:
    """End a transaction that will not be sent, keeping the connection if the server agrees."""
    try:
        await client.rset()
    except (aiosmtplib.SMTPException, OSError):
        client.close()
    else:
        pool.keep(client)


def _listed(refused: dict[str, tuple[int, str]]) -> str:
    return ", ".join(f"{address} ({code} {text})" for address, (code, text) in refused.items())[:REPLY_BYTES]
