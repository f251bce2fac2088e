"""The SQS channel's sending: a cycle's messages put in ``SendMessageBatch`` requests per queue,
at most ten and 256 KiB a request, sent at once, each message's result its own (see the
package's docstring for what decides an outcome)."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import get_session
from pydantic import ValidationError

from outbox import Destination, Intent, Outcome, Submission
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point

from .. import credentials, envelope
from ..channel import ProbeAnswer, Send, SendResult, by_destination, invalid_settings
from ..webhook import GuardedResolver, guarded_socket
from .answers import entry_failed, refused
from .spec import MAX_MESSAGE, SqsSpec, key

#: The most messages one SendMessageBatch takes, and the most attributes one message carries.
BATCH = 10
MAX_ATTRIBUTES = 10
#: What SQS takes as a FIFO queue's MessageGroupId as it is; a longer key, or one with other characters, is
#: sent as its digest (the same key, the same group).
GROUP = re.compile(r"[\x21-\x7e]{1,128}")


@dataclass
class Client:
    """One destination's SQS client (as its settings read now), made by its first send."""

    spec: SqsSpec
    version: datetime  # the destination's updated_at it was made for
    client: Any  # aiobotocore's SQS client (its methods are made from the service's model at run time)
    signing: tuple[str, ...] = field(repr=False)
    #: Requests under way on it; a client retired (replaced) is closed once the last one ends, so
    #: that closing it cuts none short (which would make their outcomes unknown).
    in_flight: int = 0
    retired: bool = False
    closed: bool = False


class Unredirected(AIOHTTPSession):
    """aiobotocore's HTTP session, its requests sent with ``allow_redirects=False``: aiohttp would
    follow a 3xx (re-sending the signed request, its security token, to wherever it points, https
    to http too) and take that server's answer for the endpoint's. A 3xx is the endpoint's answer:
    an error, ``submitted`` and rejected (as a webhook's)."""

    async def _get_session(self, proxy_url: str | None) -> Any:
        return _NoRedirects(await super()._get_session(proxy_url))


class _NoRedirects:
    """An aiohttp session whose requests follow no redirect (the one method aiobotocore calls)."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def request(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.request(*args, allow_redirects=False, **kwargs)


class SqsChannel:
    """Sends intents to SQS queues, one client per destination."""

    def __init__(self, *, concurrency: int = 64, verify: str | None = None, clock: Clock | None = None) -> None:
        self._concurrency = concurrency  # the connections a client keeps
        self._verify = verify  # a CA bundle to trust instead of the system's (a private CA); None: the system's
        self._clock = clock or SystemClock()  # what a message's webhook-timestamp says
        self._clients: dict[str, Client] = {}
        self._session = get_session()
        self._making = asyncio.Lock()

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        return (await self.send_many([Send(intent, destination, attempt_id, fence)]))[0]

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        """Every destination's messages in SendMessageBatch requests of at most ``BATCH`` messages and
        ``MAX_MESSAGE`` bytes, in the order given, all sent at once."""
        return await by_destination(sends, self._send_to)

    async def _send_to(self, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        """One destination's messages in its requests, sent at once, each result in its place."""
        try:
            client = await self._client(destination)
        except ValidationError as exc:
            return [invalid_settings(exc)] * len(sends)
        except Refused as exc:
            return [SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="connect", error=exc.error)
                    ] * len(sends)
        timestamp = int(self._clock.now().timestamp())
        results: list[SendResult | None] = [None] * len(sends)
        requests: list[tuple[Client, Destination, list[tuple[int, dict[str, Any]]]]] = []
        batch: list[tuple[int, dict[str, Any]]] = []
        size = 0
        for i, send in enumerate(sends):
            made = message(send, client, timestamp)
            if isinstance(made, str):
                results[i] = SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="send", error=made)
                continue
            entry, length = made
            if len(batch) == BATCH or size + length > MAX_MESSAGE:
                requests.append(self._hold(client, destination, batch))
                batch, size = [], 0
            batch.append((i, entry))
            size += length
        if batch:
            requests.append(self._hold(client, destination, batch))
        if requests:
            # From here a request carrying the messages may leave: only SQS can say one did not.
            crash_point("after_request")
            answered = await asyncio.gather(*(self._batch(*request) for request in requests))
            for (_, _, request), answers in zip(requests, answered, strict=True):
                for (i, _), result in zip(request, answers, strict=True):
                    results[i] = result
        return cast(list[SendResult], results)

    @staticmethod
    def _hold(client: Client, destination: Destination, batch: list[tuple[int, dict[str, Any]]]
              ) -> tuple[Client, Destination, list[tuple[int, dict[str, Any]]]]:
        """A request to be sent on ``client``, counted under way from now (released by ``_batch``).
        Nothing awaits between fetching the client and this, so another send's failure, which may
        retire the client meanwhile, cannot close it before this request is sent."""
        client.in_flight += 1
        return client, destination, batch

    async def _batch(self, client: Client, destination: Destination,
                     batch: list[tuple[int, dict[str, Any]]]) -> list[SendResult]:
        """One SendMessageBatch (counted under way by ``_hold``), and what it came to for each of its messages."""
        entries = [{**entry, "Id": str(n)} for n, (_, entry) in enumerate(batch)]
        try:
            async with asyncio.timeout(destination.timeout_seconds * 2):  # aiohttp's bound each read, not the whole
                answer = await client.client.send_message_batch(QueueUrl=client.spec.url, Entries=entries)
        except Exception as exc:  # every failure of the request is classified, none raised
            result = refused(exc)
            if not result.answered:  # the connection failed: the next send makes a new client
                await self._retire(destination.id, client)
            return [result] * len(batch)
        finally:
            client.in_flight -= 1
            if client.retired and not client.in_flight:
                await close(client)
        results: list[SendResult] = [SendResult(
            Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, answered=True, stage="send",
            error="SQS's answer did not mention the message")] * len(batch)
        for done in answer.get("Successful", []):
            results[int(done["Id"])] = SendResult(
                Submission.SUBMITTED, Outcome.DELIVERED, answered=True, stage="done", external_id=done["MessageId"],
                reply=f"enqueued as {done['MessageId']}" + (
                    "" if client.signing else ", unsigned: the destination holds no signing secret"))
        for failure in answer.get("Failed", []):
            results[int(failure["Id"])] = entry_failed(failure)
        return results

    async def _client(self, destination: Destination) -> Client:
        """The destination's client; a change of the destination (its ``updated_at``) replaces it."""
        found = self._clients.get(destination.id)
        if found is not None and found.version == destination.updated_at:
            return found
        async with self._making:
            found = self._clients.get(destination.id)
            if found is not None and found.version == destination.updated_at:
                return found
            spec = SqsSpec.model_validate({**destination.settings, "channel": "sqs",
                                           "allow_private_network": destination.allow_private_network})
            held = key(destination.secrets)
            if held is None:
                raise Refused("refused: the destination holds no secret access key")
            guarded = {} if destination.allow_private_network else {
                "resolver": GuardedResolver(), "socket_factory": guarded_socket}
            config = AioConfig(
                retries={"total_max_attempts": 1, "mode": "standard"},  # one request per attempt: see the package
                connect_timeout=destination.timeout_seconds, read_timeout=destination.timeout_seconds,
                max_pool_connections=self._concurrency, connector_args=guarded,
                proxies={},  # not HTTP(S)_PROXY: a proxy would connect to the endpoint past the guard
                http_session_cls=Unredirected)
            made = await self._session.create_client(
                "sqs", region_name=spec.region, endpoint_url=spec.endpoint, aws_access_key_id=spec.access_key_id,
                aws_secret_access_key=held[0], aws_session_token=held[1], config=config,
                verify=self._verify).__aenter__()
            if found is not None:
                await self._retire(destination.id, found)
            self._clients[destination.id] = client = Client(spec, destination.updated_at, made,
                                                            credentials.split(destination.secrets)[0])
            return client

    async def _retire(self, destination_id: str, client: Client) -> None:
        """Replace ``client`` by a new one at the destination's next send; closed once idle."""
        if self._clients.get(destination_id) is client:
            del self._clients[destination_id]
        client.retired = True
        if not client.in_flight:
            await close(client)

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="an SQS queue cannot be asked whether a message was enqueued")

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await close(client)


class Refused(Exception):
    """The destination cannot be sent to as it is registered: nothing was submitted."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


async def close(client: Client) -> None:
    if client.closed:
        return
    client.closed = True
    try:
        await client.client.close()
    except Exception:  # a client that fails to close has nothing more to send
        pass


def message(send: Send, client: Client, timestamp: int) -> tuple[dict[str, Any], int] | str:
    """A SendMessageBatch entry for ``send`` and its size as SQS counts it (body and attributes),
    or why SQS would never take it."""
    body = envelope.payload(send)
    # (SQS refuses an empty String attribute: an empty header, a trace without tracestate, is left out)
    headers = [(name, value) for name, value in envelope.headers(send, client.signing, timestamp, body) if value]
    if len(headers) > MAX_ATTRIBUTES:
        return f"refused: the message would carry {len(headers)} attributes; SQS takes at most {MAX_ATTRIBUTES}"
    size = len(body) + sum(len(name.encode()) + len("String") + len(value.encode()) for name, value in headers)
    if size > MAX_MESSAGE:
        return f"refused: the message would be {size} bytes with its attributes; SQS takes at most {MAX_MESSAGE}"
    entry: dict[str, Any] = {"MessageBody": body.decode(), "MessageAttributes": {
        name: {"DataType": "String", "StringValue": value} for name, value in headers}}
    if client.spec.fifo:
        entry["MessageDeduplicationId"] = hashlib.sha256(send.intent.key.encode()).hexdigest()
        # the ordering key: its messages are received in order; else the action id: each intent its own
        # group, so none waits behind another
        entry["MessageGroupId"] = group(send.intent.ordering_key or send.intent.action_id)
    return entry, size


def group(name: str) -> str:
    """``name`` as a FIFO message's MessageGroupId: itself when SQS takes it, else its sha256 hex
    (the same name, the same group)."""
    return name if GROUP.fullmatch(name) else hashlib.sha256(name.encode()).hexdigest()
