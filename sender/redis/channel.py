"""The Redis Streams channel's sending: a destination's entries added by one pipeline of script
calls over one connection, each reply its own result (see the package's docstring for what
decides an outcome)."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Sequence
from typing import Any, cast

from pydantic import ValidationError
from redis.asyncio import Connection
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from outbox import Destination, Intent, Outcome, Submission
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point

from .. import envelope, guard
from ..channel import REPLY_BYTES, ProbeAnswer, Send, SendResult, by_destination, describe, invalid_settings
from .connections import Client, Clients

#: Adds one entry unless the dedupe key says an earlier attempt did, atomically on the server.
#: KEYS: the stream, the dedupe key. ARGV: the dedupe TTL in seconds, MAXLEN (or ""), then the
#: entry's fields and values. Answers {1, id} for an entry added, {0, id} for one found, or an
#: error reply, and then nothing was written: a script's writes are not undone when it fails, so
#: the dedupe key is written first (a refusal of it, NOPERM say, comes before the entry) and
#: removed again when XADD is refused.
SCRIPT = """\
local found = redis.call('GET', KEYS[2])
if found then return {0, found} end
redis.call('SET', KEYS[2], '', 'EX', ARGV[1])
local id
if ARGV[2] == '' then
  id = redis.pcall('XADD', KEYS[1], '*', unpack(ARGV, 3))
else
  id = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
end
if type(id) == 'table' and id.err then
  redis.call('DEL', KEYS[2])
  return id
end
redis.call('SET', KEYS[2], id, 'EX', ARGV[1])
return {1, id}
"""
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()
#: The entry's field holding the payload (the other fields are ``envelope.headers``).
PAYLOAD = "payload"
#: Error replies that say the entry was not added, and may be on a later try: the server is out of
#: memory, a read-only replica (a failover under way), loading its data, busy with a script, unable
#: to persist, or its cluster or primary is down; or it lacks the script (left so when the
#: connection was lost before the script itself could be sent).
RETRYABLE_ERRORS = (OutOfMemoryError, ReadOnlyError, BusyLoadingError, TryAgainError, ClusterDownError, NoScriptError)
RETRYABLE_CODES = frozenset({"BUSY", "MISCONF", "NOREPLICAS"})
#: Where an answer never came: the connection was lost or the timeout passed after the pipeline was written.
LOST = object()


def dedupe_key(stream: str, key: str) -> str:
    """The key recording which entry an idempotency key was added as: hash-tagged with the
    stream's name, so it lives in the stream's cluster slot (a script may touch only one)."""
    return f"{{{stream}}}:outbox-dedupe:{key}"


class RedisChannel:
    """Adds intents to Redis streams, one pool of connections per destination."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()  # what an entry's webhook-timestamp says
        self._clients = Clients(tls_context=tls_context)

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        return (await self._add(destination, [Send(intent, destination, attempt_id, fence)]))[0]

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        """Each destination's entries in one pipeline (one round trip), the destinations side by side."""
        return await by_destination(sends, self._add)

    async def _add(self, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        """The results of one destination's entries, each in its place."""
        try:
            client = await self._clients.client(destination)
        except ValidationError as exc:  # registered before today's rules: it can never be written
            return [invalid_settings(exc)] * len(sends)
        try:
            return await self._added(client, destination, sends)
        finally:
            await self._clients.release(client)

    async def _added(self, client: Client, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        spec = client.spec
        if client.password is not None and not spec.tls and not spec.allow_insecure:
            return [refused("connect", Outcome.REJECTED, "refused: the destination holds a password and has no tls; "
                            "set tls, or allow_insecure")] * len(sends)
        try:
            conn = await client.pool.get_connection()
        except (RedisError, OSError) as exc:  # nothing of this attempt was written
            return [not_connected(exc)] * len(sends)
        try:
            return await self._pipeline(conn, client, destination, sends)
        finally:
            await client.pool.release(conn)

    async def _pipeline(self, conn: Connection, client: Client, destination: Destination,
                        sends: Sequence[Send]) -> list[SendResult]:
        spec = client.spec
        timestamp = int(self._clock.now().timestamp())
        calls = [script_args(send, spec.stream, client.signing, timestamp, spec.dedupe_ttl_seconds, spec.max_len)
                 for send in sends]
        waiting = [("WAIT", spec.wait_replicas, spec.wait_timeout_ms)] if spec.wait_replicas is not None else []
        timeout = destination.timeout_seconds + (spec.wait_timeout_ms / 1000 if waiting else 0)
        answers: list[Any] = [LOST] * (len(sends) + len(waiting))
        lost: BaseException | None = None
        try:
            async with asyncio.timeout(timeout):
                lost = await exchange(conn, [("EVALSHA", SCRIPT_SHA, *call) for call in calls] + waiting, answers,
                                      range(len(answers)))
                unloaded = [i for i in range(len(sends)) if isinstance(answers[i], NoScriptError)]
                if unloaded and lost is None:  # the server's script cache was emptied (a restart): those did nothing
                    again = [*unloaded, *range(len(sends), len(answers))]
                    for place in again:  # sent again: from here only the new replies say what happened
                        answers[place] = LOST
                    lost = await exchange(conn, [("EVAL", SCRIPT, *calls[i]) for i in unloaded] + waiting, answers,
                                          again)
        except TimeoutError as exc:
            lost = exc
        if lost is not None:
            await conn.disconnect(nowait=True)
        replicas = answers[-1] if waiting else None
        return [answer(answers[i], spec.stream, client.signing, spec.wait_replicas, replicas, lost)
                for i in range(len(sends))]

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="the Redis channel does not ask the server what became of an entry")

    async def aclose(self) -> None:
        await self._clients.aclose()


async def exchange(conn: Connection, commands: list[tuple[Any, ...]], answers: list[Any],
                   places: Sequence[int]) -> BaseException | None:
    """Write ``commands`` as one pipeline and read their replies into ``answers`` at ``places``;
    the error that lost the rest (their places stay ``LOST``), or None."""
    try:
        await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
    except (RedisError, OSError) as exc:  # part of it may have been written
        return exc
    # From here the pipeline may have reached the server: only its replies can say what it did.
    crash_point("after_request")
    for place in places:
        try:
            answers[place] = await conn.read_response()
        except ResponseError as exc:  # the server's error reply to this command
            answers[place] = exc
        except (AuthenticationError, BusyLoadingError) as exc:  # a reply, after which redis-py drops the connection
            answers[place] = exc
            return exc
        except (RedisError, OSError) as exc:
            return exc
    return None


def script_args(send: Send, stream: str, signing: tuple[str, ...], timestamp: int, ttl: int,
                max_len: int | None) -> tuple[Any, ...]:
    """The script's keys and arguments for one entry: its fields are ``envelope.headers`` (its
    identity, its attempt's span, its signature) and the payload's canonical JSON."""
    body = envelope.payload(send)
    fields = [item for pair in envelope.headers(send, signing, timestamp, body) for item in pair]
    return (2, stream, dedupe_key(stream, send.intent.key), ttl, "" if max_len is None else max_len, *fields,
            PAYLOAD, body)


def answer(reply: Any, stream: str, signing: tuple[str, ...], wanted: int | None, replicas: Any,
           lost: BaseException | None) -> SendResult:
    """What one entry came to, from the server's reply to its script call (and to WAIT)."""
    if reply is LOST:
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="add",
                          error=f"no reply to the script call: {describe(lost or TimeoutError())}")
    if isinstance(reply, BaseException):
        return server_refused(reply)
    added, entry = int(reply[0]), reply[1].decode()
    said = (f"added {entry} to {stream}" if added else
            f"found {entry}, added to {stream} by an earlier attempt: not added again")
    said += "" if signing else ", unsigned: the destination holds no signing secret"
    if wanted is not None and not (isinstance(replicas, int) and replicas >= wanted):
        heard = f"{replicas} of {wanted} replicas acknowledged it" if isinstance(replicas, int) else \
            f"WAIT answered {describe(replicas)}" if isinstance(replicas, BaseException) else \
            f"no reply to WAIT ({describe(lost or TimeoutError())})"
        return SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, stage="wait", answered=True, external_id=entry,
                          reply=said[:REPLY_BYTES], error=f"{said}, but {heard} in time: sent again, the server "
                                                          "answers the same entry")
    return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, stage="done", answered=True, external_id=entry,
                      reply=said[:REPLY_BYTES])


def server_refused(exc: BaseException) -> SendResult:
    """The server answered the script call with an error: the script added nothing (``SCRIPT``)."""
    code = str(exc).split(" ", 1)[0]
    outcome = Outcome.RETRYABLE if isinstance(exc, RETRYABLE_ERRORS) or code in RETRYABLE_CODES \
        else Outcome.REJECTED
    return SendResult(Submission.SUBMITTED, outcome, stage="add", answered=True, reply=describe(exc)[:REPLY_BYTES],
                      error=f"the server did not add the entry: {describe(exc)}")


def not_connected(exc: BaseException) -> SendResult:
    """No connection could be made ready (connected, TLS, AUTH, SELECT): nothing was written."""
    refusal = cause(exc, guard.PrivateAddressRefused)
    if refusal is not None:
        return refused("connect", Outcome.REJECTED, cast(guard.PrivateAddressRefused, refusal).explain())
    if cause(exc, ssl.SSLError) is not None:
        return refused("tls", Outcome.RETRYABLE, describe(exc))
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return refused("auth", Outcome.REJECTED, f"the server refused the credentials: {describe(exc)}")
    if isinstance(exc, ResponseError):  # SELECT of a database the server does not have
        return refused("select", Outcome.REJECTED, f"the server refused the connection's setup: {describe(exc)}")
    return refused("connect", Outcome.RETRYABLE, describe(exc))


def refused(stage: str, outcome: Outcome, error: str) -> SendResult:
    return SendResult(Submission.NOT_SUBMITTED, outcome, stage=stage, error=error)


def cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first of its causes that is a ``kind`` (redis-py wraps what a connect raised)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
