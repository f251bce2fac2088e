"""JetStream's acknowledgements of one connection's publishes, and what each one says.

Every publish names a reply subject of its own under one inbox the connection subscribes to
once, so a batch's acknowledgements are awaited together, as futures, with no timer per message;
a connection that closes fails the ones still expected at once, rather than at the timeout.
(nats-py's ``publish_async`` does the same, but an error answer raises inside its reply handler
and leaves the future pending: a refusal would read as a lost acknowledgement.)
"""

from __future__ import annotations

import asyncio
import json
from itertools import count

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import PubAck

from outbox import Outcome, Submission

from ..channel import SendResult, describe

#: The status header of a server's own answer, and the one that says nothing subscribes.
STATUS, NO_RESPONDERS = "Status", "503"


class NoResponders(Exception):
    """The server answered that nothing subscribes to the subject: no stream stored the message."""


class Acks:
    """The acknowledgements expected on one connection, by reply subject."""

    def __init__(self) -> None:
        self._prefix = ""
        self._numbers = count()
        self._waiting: dict[str, asyncio.Future[PubAck]] = {}

    async def start(self, client: Client) -> None:
        """Subscribe to the connection's acknowledgement inbox (before the first publish)."""
        self._prefix = f"{client.new_inbox()}."
        await client.subscribe(self._prefix + "*", cb=self._answered)

    async def closed(self) -> None:
        """The connection closed (its ``closed_cb``): no acknowledgement still expected can come."""
        for future in list(self._waiting.values()):
            if not future.done():
                future.set_exception(nats.errors.ConnectionClosedError())

    def expect(self) -> tuple[str, asyncio.Future[PubAck]]:
        """A reply subject for one publish, and the future its acknowledgement resolves."""
        reply = f"{self._prefix}{next(self._numbers)}"
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._waiting[reply] = future
        future.add_done_callback(lambda _: self._waiting.pop(reply, None))
        return reply, future

    async def _answered(self, msg: Msg) -> None:
        future = self._waiting.get(msg.subject)
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get(STATUS) == NO_RESPONDERS:
            future.set_exception(NoResponders())
            return
        try:
            found = json.loads(msg.data)
            if "error" in found:
                future.set_exception(nats.js.errors.APIError(**found["error"]))
            else:
                future.set_result(PubAck.from_response(found))
        except (ValueError, TypeError, KeyError) as exc:  # an answer that is no PubAck: not proof of anything
            future.set_exception(exc)


def answer(future: asyncio.Future[PubAck], signing: tuple[str, ...], *, closed: bool) -> SendResult:
    """What JetStream answered for a published message (no answer in time, or the connection
    closed first: the future is still pending, and cancelled)."""
    if not future.done() or future.cancelled():
        future.cancel()
        why = "the connection closed" if closed else "TimeoutError: the destination's timeout passed"
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="publish",
                          error=f"no acknowledgement of the publish: {why}")
    exc = future.exception()
    if isinstance(exc, NoResponders):
        # nothing subscribes to the subject, so no stream can have stored it; a stream may be made
        # (or come back) for it, so it is tried again, and dead once the attempts run out
        return SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, stage="publish", answered=True, status_code=503,
                          error="no stream stores the subject: the server answered no responders (503), nothing "
                                "was stored")
    if isinstance(exc, nats.js.errors.APIError):
        # a 5xx is the server's state (JetStream unavailable, a stream full): tried again; a 4xx says the
        # message itself is refused (another stream than expected_stream takes it, too large for the stream)
        outcome = Outcome.RETRYABLE if (exc.code or 0) >= 500 else Outcome.REJECTED
        return SendResult(Submission.SUBMITTED, outcome, stage="publish", answered=True, status_code=exc.code,
                          error=f"JetStream did not store the message: {exc.description} (code {exc.code}, "
                                f"err_code {exc.err_code})")
    if isinstance(exc, nats.errors.ConnectionClosedError):
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="publish",
                          error="no acknowledgement of the publish: the connection closed")
    if exc is not None:
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="publish", answered=True,
                          error=f"an acknowledgement that says nothing: {describe(exc)}")
    ack = future.result()
    where = f"{ack.stream}/{ack.seq}"
    reply = (f"already stored in {ack.stream} at {ack.seq}: JetStream dropped this resend as a duplicate (an "
             "earlier attempt landed)" if ack.duplicate else f"stored in {ack.stream} at {ack.seq}")
    return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, stage="done", answered=True, external_id=where,
                      reply=reply + ("" if signing else ", unsigned: the destination holds no signing secret"))
