"""The webhook channel: a signed JSON POST to a registered destination, classified honestly.

aiohttp carries the hot path: on this kind of machine httpx's shared async pool managed about a
fifteenth of aiohttp's request rate at the concurrency a sender runs, which would make the
HTTP client, not the receiver, the limit of delivery.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from yarl import URL

from outbox import Destination, DestinationSpec, Intent, Outcome, Submission, crash, tracing
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point
from receivers import wire
from receivers.wire import new_secret

from . import hosts
from .channel import REPLY_BYTES, ChannelModule, ProbeAnswer, SendResult
from .guard import PrivateAddressRefused

USER_AGENT = "outbox-delivery/0.1"
#: Prepared destinations kept (a destination's new URL or timeout is a new entry).
MAX_TARGETS = 1024
#: Response headers kept with an attempt (never cookies or credentials).
KEPT_HEADERS = ("content-type", "retry-after", wire.EXTERNAL_ID.lower(), wire.REPLAYED.lower(), "location")
#: What aiohttp refuses in a header name or value (RFC 9110 5.5: controls other than HTAB). It
#: raises ValueError once the connection is already taken, so such a request is refused first.
FORBIDDEN_IN_HEADERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class WebhookSpec(DestinationSpec):
    """A webhook destination: the URL its intents are POSTed to, signed with a whsec_ secret."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["webhook"] = "webhook"
    url: str = Field(max_length=2048, description="http(s) URL the webhook is POSTed to",
                     json_schema_extra={"pattern": "^[Hh][Tt][Tt][Pp][Ss]?://"})

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str, info: ValidationInfo) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url!r} must be an absolute http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("url must not carry credentials; put them in the secret")
        host = hosts.url_host(url)  # a HostRefused (ValueError) says what is wrong with the host
        # A literal address the sender would refuse is refused now; a name is judged by what it
        # resolves to when the request is made.
        address = hosts.ip_literal(host)
        if (address is not None and not hosts.is_public(str(address))
                and not info.data.get("allow_private_network", True)):
            raise ValueError(f"the url's host {parts.hostname} is not a public address (loopback, private, "
                             "link-local or reserved): set allow_private_network (--allow-private-network) to "
                             "send there")
        return url

    @field_validator("secret")
    @classmethod
    def _whsec(cls, secret: str | None) -> str | None:
        return None if secret is None else wire.check_secret(secret)


class GuardedResolver(AbstractResolver):
    """Resolves names and drops non-public addresses, so a name cannot smuggle a request inside
    (the SSRF guard); the addresses it returns are the ones connected to, and ``guarded_socket``
    checks each again as it is connected to."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        public = [r for r in await self._inner.resolve(host, port, family) if hosts.is_public(r["host"])]
        if not public:
            raise PrivateAddressRefused(f"{host} resolves only to non-public addresses")
        return public

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """The socket for one connect of a destination without the private network (aiohttp's
    ``TCPConnector(socket_factory=...)``), refused if the address it is for is not public.

    This is the check on the address actually connected to: aiohttp connects to an IP literal
    without asking the resolver, and whatever a resolver returned arrives here, so no host
    spelling and no change of DNS answer between a check and the connect gets past it. The
    message is the same for every address, so aiohttp (which merges the errors of several
    addresses tried in turn unless they read alike) still raises this exception, not a plain
    OSError.
    """
    family, kind, proto, _, sockaddr = addr_info
    if not hosts.is_public(sockaddr[0]):
        raise PrivateAddressRefused("the address to connect to is not public")
    return socket.socket(family, kind, proto)


def classify_status(status: int) -> Outcome:
    """What a receiver's status code means for the intent, as the README's "What a webhook
    receiver gets" tells receivers."""
    if 200 <= status < 300:
        return Outcome.DELIVERED
    if status in (408, 409, 429) or status >= 500:
        return Outcome.RETRYABLE  # 409: the receiver is still working on this key
    if status == 422:
        return Outcome.CONFLICT  # the key was used with another payload
    return Outcome.REJECTED  # other 4xx, 410 (and it disables the destination), 3xx not followed


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """A Retry-After header as seconds from now (delta-seconds, ASCII digits only, or an HTTP
    date); None for anything else. How much of it is honoured is ``backoff.honoured``'s to say."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # (str.isdigit alone takes "²", which float() refuses)
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, OverflowError):
        return None


def _external_id(headers: dict[str, str], body: bytes) -> str | None:
    if found := headers.get(wire.EXTERNAL_ID.lower()):
        return found[:255]
    if b"external_id" not in body:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    found = data.get("external_id") if isinstance(data, dict) else None
    return str(found)[:255] if found is not None else None


@dataclass(frozen=True, slots=True)
class _Target:
    """What a send to one destination reuses: its parsed URL, the per-request timeout, and why
    it is refused (a literal non-public address the destination does not allow), if it is."""

    url: URL
    timeout: aiohttp.ClientTimeout
    refusal: str | None


def _crash_traces() -> list[aiohttp.TraceConfig] | None:
    """Tests only (``outbox.crash``): with ``after_request`` armed, die once a request's body is
    handed to the socket. aiohttp announces a chunk just before it writes it, so the kill is
    scheduled for the loop's next turn, which comes after the write. Unarmed: no tracing at all."""
    if crash.armed != "after_request":
        return None

    async def written(session: aiohttp.ClientSession, context: Any, params: Any) -> None:
        asyncio.get_running_loop().call_soon(crash_point, "after_request")

    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(written)
    return [trace]


class WebhookChannel:
    """POSTs intents to webhook destinations over pooled aiohttp sessions."""

    def __init__(self, *, concurrency: int = 64, clock: Clock | None = None) -> None:
        self._concurrency = concurrency
        self._clock = clock or SystemClock()
        self._sessions: dict[bool, aiohttp.ClientSession] = {}
        self._targets: dict[tuple[str, str, bool, float], _Target] = {}

    def _session(self, allow_private: bool) -> aiohttp.ClientSession:
        session = self._sessions.get(allow_private)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._concurrency,
                resolver=None if allow_private else GuardedResolver(),
                socket_factory=None if allow_private else guarded_socket,
                ttl_dns_cache=60,
            )
            session = aiohttp.ClientSession(
                connector=connector, headers={"User-Agent": USER_AGENT}, auto_decompress=False,
                trace_configs=_crash_traces(),
            )
            self._sessions[allow_private] = session
        return session

    def _target(self, destination: Destination) -> _Target:
        key = (destination.id, str(destination.settings.get("url")), destination.allow_private_network,
               destination.timeout_seconds)
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) >= MAX_TARGETS:
                self._targets.clear()
            url, refusal = _judged(destination)
            limit = destination.timeout_seconds
            target = self._targets[key] = _Target(
                url, aiohttp.ClientTimeout(total=limit * 2, connect=limit, sock_read=limit), refusal)
        return target

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        target = self._target(destination)
        if target.refusal:
            return SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, error=target.refusal)
        body = intent.payload_json.encode()
        now = self._clock.now().timestamp()
        headers = self._signed(intent.key, destination, body, int(now))
        headers[wire.CONTENT_DIGEST] = wire.content_digest(body)
        headers[wire.ATTEMPT_ID] = attempt_id
        headers[wire.FENCE] = str(fence)
        headers |= tracing.carrier()  # the attempt's span (not signed: Standard Webhooks signs id.timestamp.body)
        if unsendable := _unsendable(headers):
            return SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, error=unsendable)
        session = self._session(destination.allow_private_network)
        note = None
        try:
            async with session.post(target.url, data=body, headers=headers,
                                    timeout=target.timeout, allow_redirects=False) as response:
                # The status line is the receiver's answer; a body that then fails to arrive
                # does not make that answer unknown.
                status = response.status
                kept = {k: response.headers[k] for k in KEPT_HEADERS if k in response.headers}
                try:
                    reply = await _read_up_to(response.content, REPLY_BYTES)
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    reply, note = b"", f"answered {status}, then the body failed: {_describe(exc)}"
        except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as exc:
            # The connection was never established: nothing of the request was written.
            outcome, error = _refusal(exc)
            return SendResult(Submission.NOT_SUBMITTED, outcome, error=error)
        except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as exc:
            # aiohttp refused the URL before connecting (no host, a numeric host that is not a
            # canonical IPv4 address, a scheme other than http(s)), as it always will.
            return SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, error=f"refused: {_describe(exc)}")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # Connected, so the request may have been written and acted on.
            return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, error=_describe(exc))
        outcome = classify_status(status)
        return SendResult(
            Submission.SUBMITTED,
            outcome,
            status_code=status,
            reply=json.dumps({"headers": kept, "body": reply.decode("utf-8", "replace")}),
            external_id=_external_id(kept, reply) if outcome is Outcome.DELIVERED else None,
            error=note if outcome is Outcome.DELIVERED else f"receiver answered {status}",
            retry_after=retry_after_seconds(kept.get("retry-after"), now),
            disable_destination=status == 410,
            answered=True,
        )

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        """POST the reconcile probe (``Outbox-Reconcile: probe``) to the destination's URL.

        Its body ``{"key": K, "fence": F}`` is signed like a delivery (``webhook-id`` K), so the
        receiver knows the probe comes from us and asks about this key with this fence.
        """
        key = intent.key  # the Idempotency-Key the deliveries carry
        body = json.dumps({"key": key, "fence": fence}).encode()
        headers = {**self._signed(key, destination, body, int(self._clock.now().timestamp())),
                   wire.RECONCILE: wire.PROBE, wire.FENCE: str(fence)}
        session = self._session(destination.allow_private_network)
        target = self._target(destination)
        if refused := target.refusal or _unsendable(headers):  # as a send would be
            return ProbeAnswer(None, error=f"probe not sent: {refused}")
        try:
            async with session.post(target.url, data=body, headers=headers,
                                    timeout=target.timeout, allow_redirects=False) as response:
                raw = await _read_up_to(response.content, REPLY_BYTES * 4)
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return ProbeAnswer(None, error=f"probe failed: {_describe(exc)}")
        try:
            answer = json.loads(raw)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict) or "state" not in answer:
            detail = answer.get("detail") if isinstance(answer, dict) else None  # a problem+json refusal
            return ProbeAnswer(None, error=f"probe answered {status} without a state"
                               + (f": {str(detail)[:300]}" if detail else ""))
        state = answer["state"]
        if status != 200 or state not in ("completed", "in_progress", "absent"):
            return ProbeAnswer(None, error=f"probe answered {status} with state {state!r}")
        stored = answer.get("response") or {}
        stored_headers = {k.lower(): v for k, v in stored.get("headers", [])}
        stored_body = base64.b64decode(stored["body"]) if stored.get("body") else b""
        return ProbeAnswer(
            state,
            status_code=stored.get("status"),
            reply=json.dumps({"headers": stored_headers, "body": stored_body[:REPLY_BYTES].decode("utf-8", "replace")})
            if stored else None,
            external_id=_external_id(stored_headers, stored_body) if stored else None,
        )

    def _signed(self, msg_id: str, destination: Destination, body: bytes, timestamp: int) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            wire.IDEMPOTENCY_KEY: msg_id,
            wire.WEBHOOK_ID: msg_id,
            wire.WEBHOOK_TIMESTAMP: str(timestamp),
            wire.WEBHOOK_SIGNATURE: wire.sign(destination.live_secrets(self._clock.now()), msg_id, timestamp, body),
        }

    async def aclose(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()


def _judged(destination: Destination) -> tuple[URL, str | None]:
    """The destination's URL as the client will use it, and why it is refused, if it is.

    Refused: a literal non-public address (after the client's normalisation, so full-width
    digits or ideographic full stops do not hide one) that the destination does not allow; a
    host that is neither an ordinary hostname nor a canonical IP address (rows stored before
    registration checked hosts); a URL the client cannot parse, or none (settings written into
    the database by hand). Each is permanent.
    """
    written_url = destination.settings.get("url")
    if not isinstance(written_url, str):
        held = "none" if written_url is None else f"{type(written_url).__name__} {written_url!r}"[:80]
        return URL(), f"refused: destination {destination.id!r} has no url to send to: its stored settings hold {held}"
    try:
        url = URL(written_url)
    except ValueError as exc:
        return URL(), f"refused: the url of destination {destination.id!r} cannot be used: {exc}"
    connected = url.raw_host or ""
    if (not destination.allow_private_network and hosts.ip_literal(connected) is not None
            and not hosts.is_public(connected)):
        written = urlsplit(written_url).hostname
        shown = connected if written == connected else f"{connected} (the url's host {written!r})"
        return url, (f"refused: {shown} is not a public address and destination {destination.id!r} "
                     "does not allow the private network")
    try:
        host = hosts.url_host(written_url)
    except hosts.HostRefused as exc:
        return url, f"refused: the url of destination {destination.id!r} cannot be used: {exc}"
    if host != connected:  # the rule and the client read the host differently: trust neither
        return url, (f"refused: the url of destination {destination.id!r} names {host!r}, but the client would "
                     f"connect to {connected!r}")
    return url, None


def _unsendable(headers: dict[str, str]) -> str | None:
    """Why these headers can never be sent (a control character, say from an action id stored
    before ids were checked), or None."""
    for name, value in headers.items():
        if FORBIDDEN_IN_HEADERS.search(name) or FORBIDDEN_IN_HEADERS.search(value):
            return f"refused: the {name} header would hold a control character, which HTTP cannot carry"
    return None


async def _read_up_to(content: aiohttp.StreamReader, limit: int) -> bytes:
    """Up to ``limit`` bytes of a body, however many pieces it arrives in."""
    chunks, size = [], 0
    while size < limit and not content.at_eof():
        chunk = await content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _refusal(exc: BaseException) -> tuple[Outcome, str]:
    """A connection that was never made: our own SSRF refusal (permanent), or the network's."""
    cause: Any = getattr(exc, "os_error", None) or exc.__cause__
    if isinstance(cause, PrivateAddressRefused):
        return Outcome.REJECTED, cause.explain()
    return Outcome.RETRYABLE, _describe(exc)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


CHANNEL = ChannelModule(
    name="webhook", spec=WebhookSpec, secret_form="a whsec_ secret", new_secret=new_secret, rotation_window=True,
    open=lambda concurrency: WebhookChannel(concurrency=concurrency), target=lambda settings: str(settings["url"]),
)
