"""The receivers' idempotency contract (the README's "The contract"), independent of ASGI or WSGI.

A middleware describes the request, asks ``begin`` what to do — answer at once (a problem, a
replay, a probe's answer) or run the handler under a claim — and reports the handler's response
to ``finish``, which completes the record or, for a status in ``release_statuses`` (nothing
ran, or come back later) and for an exception, releases it so a retry runs the handler again.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from opentelemetry.trace import INVALID_SPAN, Span, TracerProvider

from . import tracing
from .keys import (
    MAX_JSON_DEPTH,
    InvalidJsonBody,
    MalformedFence,
    MalformedKey,
    fingerprint,
    identity,
    parse_fence,
    parse_key,
)
from .records import Busy, Claimed, Mismatch, ProbeResult, RecordStore, Replay, StaleFence, StoredResponse
from .wire import (
    BODY_OMITTED,
    FENCE,
    IDEMPOTENCY_KEY,
    RECONCILE,
    REPLAYED,
    WEBHOOK_ID,
    InvalidSignature,
    Problem,
    problem_type,
    verify_signature,
)

log = logging.getLogger("receivers.idempotency")

#: Never stored or replayed: credentials, cookies and hop-by-hop headers (and what the server sets).
UNSTORED = frozenset({
    "set-cookie", "authorization", "proxy-authorization", "proxy-authenticate", "connection",
    "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "content-length", "date", "server",
})

#: Answers that release the claim instead of completing it, so the next request runs the handler
#: again: 404 and 405 (what a router answers for a wrong URL or method: no handler ran, so a
#: sender's typo fixed later must not be answered from the record), 408, 425 and 429 (come back
#: later), and every 5xx. Every other status completes the record and is replayed.
RELEASE_STATUSES = frozenset({404, 405, 408, 425, 429, *range(500, 600)})

Headers = Sequence[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Request:
    """What the contract needs to know about a request (names lower-cased)."""

    method: str
    path: str
    query: str
    headers: Headers

    def values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    @property
    def media_type(self) -> str:
        found = self.values("content-type")
        return found[0].split(";")[0].strip().lower() if found else ""


class IdempotencyContext(NamedTuple):
    """What a handler can read to fence its own downstream effects (``epoch`` rises on takeover);
    a named tuple, as the records are: the Kafka consumer hands one to every record's handler."""

    scope: str
    key: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Answer:
    """Respond with this, without running the handler (``outcome`` and ``problem`` are what the
    request's span is told)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    outcome: str = tracing.Outcome.REFUSED.value
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """Run the handler under this claim."""

    identity: str
    context: IdempotencyContext


ScopeResolver = Callable[[Request], "str | Awaitable[str]"]


def problem(status: int, kind: str, title: str, detail: str, **headers: str) -> Answer:
    """An RFC 9457 problem answer (never stored)."""
    body = json.dumps({"type": problem_type(kind), "title": title, "status": status,
                       "detail": detail}).encode()
    extra = tuple((k.replace("_", "-").lower(), v) for k, v in headers.items())
    return Answer(status, (("content-type", "application/problem+json"), *extra), body,
                  tracing.outcome_of_problem(kind).value, kind)


def _default_scope(request: Request) -> str:
    return "default"


class Idempotency:
    """The contract, configured once and shared by the ASGI and WSGI middlewares."""

    def __init__(
        self,
        store: RecordStore,
        *,
        scope_resolver: ScopeResolver = _default_scope,
        methods: Sequence[str] = ("POST", "PATCH"),
        required: bool = True,
        retention_seconds: float = 86_400,
        lease_seconds: float = 60,
        max_body_bytes: int = 1024 * 1024,
        max_stored_bytes: int = 1024 * 1024,
        purge_seconds: float = 300,
        secrets: str | Sequence[str] | None = None,
        signature_tolerance_seconds: float = 300,
        max_json_depth: int = MAX_JSON_DEPTH,
        release_statuses: Collection[int] = RELEASE_STATUSES,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.store = store
        self.scope_resolver = scope_resolver
        self.methods = frozenset(m.upper() for m in methods)
        self.required = required
        self.retention = timedelta(seconds=retention_seconds)
        self.lease = timedelta(seconds=lease_seconds)
        self.max_body_bytes = max_body_bytes
        self.max_stored_bytes = max_stored_bytes
        self.purge_seconds = purge_seconds
        #: With secrets, Standard Webhooks signatures are checked before anything is claimed, so
        #: a forged request can never complete (and so poison) a real sender's key. Without them
        #: the reconcile probe is off: an unsigned probe could read or fence anyone's key.
        self.secrets = secrets
        self.signature_tolerance_seconds = signature_tolerance_seconds
        #: JSON bodies nested deeper are refused with 400 before anything is claimed.
        self.max_json_depth = max_json_depth
        #: A handler's answer with one of these statuses releases the key instead of completing it.
        self.release_statuses = frozenset(release_statuses)
        if not all(type(code) is int and 100 <= code <= 599 for code in self.release_statuses):
            raise ValueError(f"release_statuses must be HTTP status codes (integers 100-599), not "
                             f"{sorted(map(repr, self.release_statuses))}")
        if secrets is None:
            log.warning("idempotency middleware set up without secrets=: signatures are not checked and the "
                        "reconcile probe is off; pass the destination's whsec_ secret(s) as secrets= to turn "
                        "both on")
        self.clock = clock
        #: Where the middlewares' spans go (None: the global provider; none are made until an SDK is set).
        self.tracer_provider = tracer_provider
        self.tracer = tracing.tracer(tracer_provider)
        self._opening: asyncio.Lock | None = None
        self._purger: asyncio.Task[None] | None = None

    async def ready(self) -> None:
        """Open the store on first use and start purging expired records in the background."""
        if self._purger is not None:
            return
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._purger is None:
                await self.store.open()
                self._purger = asyncio.create_task(purge_forever(self.store, self.purge_seconds, self.clock))

    async def aclose(self) -> None:
        """Stop purging and close the store."""
        if self._purger is not None:
            self._purger.cancel()
            self._purger = None
        await self.store.close()

    def applies(self, request: Request) -> bool:
        """Whether the contract covers this request (a probe always is)."""
        return request.method.upper() in self.methods or bool(request.values(RECONCILE))

    def too_large(self, declared: int) -> Answer:
        return problem(413, Problem.PAYLOAD_TOO_LARGE, "Payload too large",
                       f"the body is {declared} bytes or more; the limit is {self.max_body_bytes}")

    async def begin(self, request: Request, body: bytes, span: Span = INVALID_SPAN) -> Answer | Run | None:
        """Decide before the handler: an answer to send, a claim to run under, or None when the
        contract does not apply (pass through). ``span``, the request's, is told the key, the fence
        and the outcome."""
        decision = await self._decide(request, body, span)
        if decision is None:
            tracing.decided(span, tracing.Outcome.PASSED.value)
        elif isinstance(decision, Run):
            tracing.decided(span, tracing.Outcome.CLAIMED.value, epoch=decision.context.epoch)
        else:
            tracing.decided(span, decision.outcome, problem=decision.problem)
        return decision

    async def _decide(self, request: Request, body: bytes, span: Span) -> Answer | Run | None:
        """Only a failing record store answers 503 (retry later). Everything decided from the request
        alone (key, fence, size, signature, a JSON body that cannot be fingerprinted) is a 4xx
        answered before anything is claimed, and never stored.
        """
        if request.values(RECONCILE):  # a probe never reaches the app, whatever else it carries
            return await self._probe(request, body, span)
        try:
            key = parse_key(request.values(IDEMPOTENCY_KEY))
        except MalformedKey as exc:
            return problem(400, Problem.MALFORMED_KEY, "Malformed Idempotency-Key", str(exc))
        fence = _fence(request)
        if isinstance(fence, Answer):
            return fence
        tracing.identify(span, key, fence)
        if key is None:
            if not self.required:
                return None
            return problem(400, Problem.MISSING_KEY, "Missing Idempotency-Key",
                           f"{request.method} {request.path} needs an Idempotency-Key header")
        if len(body) > self.max_body_bytes:
            return self.too_large(len(body))
        if (forged := self._check_signature(request, body)) is not None:
            return forged
        try:
            fp = fingerprint(request.method, request.path, request.query, request.media_type, body,
                                 max_json_depth=self.max_json_depth)
        except InvalidJsonBody as exc:
            return problem(400, Problem.INVALID_JSON_BODY, "Invalid JSON body",
                           f"{exc}; the same body can never be accepted, so do not retry it")
        if (unavailable := await self._open()) is not None:
            return unavailable
        scope = await self._scope(request)
        ident = identity(scope, key)
        now = self.clock()
        try:
            found = await self.store.claim(ident, fp, fence=fence, now=now, lease_until=now + self.lease,
                                           expires_at=now + self.retention)
        except Exception as exc:  # any store failure: refuse rather than run unprotected
            log.error("idempotency store unavailable: %r", exc)
            return _unavailable()
        if isinstance(found, Claimed):
            return Run(ident, IdempotencyContext(scope, key, found.epoch))
        if isinstance(found, Replay):
            stored = found.response
            headers = (*stored.headers, (REPLAYED.lower(), "true"))
            if stored.body is None:
                headers = (*headers, (BODY_OMITTED.lower(), "true"))
            return Answer(stored.status, headers, stored.body or b"", tracing.Outcome.REPLAYED.value)
        if isinstance(found, Mismatch):
            return problem(422, Problem.KEY_REUSED, "Idempotency-Key reused",
                           "this Idempotency-Key was used for a different request (method, route, "
                           "query, media type or body); use a new key for a new request")
        if isinstance(found, Busy):
            return problem(409, Problem.IN_PROGRESS, "Request in progress",
                           "a request with this Idempotency-Key is still being processed; retry later",
                           retry_after=str(int(found.retry_after)))
        assert isinstance(found, StaleFence)
        return problem(409, Problem.STALE_FENCE, "Stale fence",
                       f"Outbox-Fence {fence} is lower than {found.min_fence}, already seen for this key; "
                       "a newer attempt superseded this one")

    async def _probe(self, request: Request, body: bytes, span: Span) -> Answer:
        """Answer a reconcile probe: a signed ``POST`` whose body ``{"key": K, "fence": F}`` names
        the key it asks about (``webhook-id`` and ``Idempotency-Key`` K, ``Outbox-Fence`` F).

        It raises the key's minimum fence to F and tells the key's state, with the stored response
        when the request completed. That response is disclosed only to a caller that could have
        made the original request: the probe must verify against the same secrets as the
        deliveries, the signature binds it to this key and fence (a signed probe for one key cannot
        be replayed for another, nor with another fence), and the key is looked up in the scope
        the same ``scope_resolver`` gives the probe, so credentials for one scope never read
        another's records. Without secrets nothing could prove that, so the probe is refused.
        """
        if request.method.upper() != "POST":
            return problem(405, Problem.METHOD_NOT_ALLOWED, "Method not allowed",
                           f"a reconcile probe (Outbox-Reconcile) must be a POST, not {request.method}",
                           allow="POST")
        if self.secrets is None:
            return problem(403, Problem.PROBE_DISABLED, "Reconcile probe disabled",
                           "this receiver checks no webhook signatures, so it answers no reconcile probe "
                           "(an unsigned probe could read or fence any key); configure the middleware "
                           "with secrets= (the destination's whsec_ secrets) to turn the probe on")
        try:
            key = parse_key(request.values(IDEMPOTENCY_KEY))
        except MalformedKey as exc:
            return problem(400, Problem.MALFORMED_KEY, "Malformed Idempotency-Key", str(exc))
        if key is None:
            return problem(400, Problem.MISSING_KEY, "Missing Idempotency-Key",
                           "a reconcile probe must name its key in an Idempotency-Key header")
        fence = _fence(request)
        if isinstance(fence, Answer):
            return fence
        tracing.identify(span, key, fence)
        if fence is None:
            return problem(400, Problem.MISSING_FENCE, "Missing Outbox-Fence",
                           "a reconcile probe must carry the sender's new Outbox-Fence")
        if len(body) > self.max_body_bytes:
            return self.too_large(len(body))
        if (forged := self._check_signature(request, body)) is not None:
            return forged
        if (unbound := _unbound_probe(request, body, key, fence)) is not None:
            return problem(400, Problem.INVALID_PROBE, "Invalid reconcile probe",
                           f"{unbound}; a probe's signed body is {{\"key\": <Idempotency-Key>, \"fence\": "
                           "<Outbox-Fence>}, with webhook-id the same key")
        if (unavailable := await self._open()) is not None:
            return unavailable
        ident = identity(await self._scope(request), key)
        now = self.clock()
        try:
            result = await self.store.probe(ident, fence, now=now, expires_at=now + self.retention)
        except Exception as exc:
            log.error("idempotency store unavailable: %r", exc)
            return _unavailable()
        span.set_attribute(tracing.RECONCILE_STATE, result.state.value)
        return _probe_answer(key, result)

    def _check_signature(self, request: Request, body: bytes) -> Answer | None:
        """A 401 unless the request is signed with one of ``secrets`` (None when none are set)."""
        if self.secrets is None:
            return None
        try:
            verify_signature(self.secrets, dict(request.headers), body,
                             tolerance_seconds=self.signature_tolerance_seconds, now=self.clock().timestamp())
        except InvalidSignature as exc:
            return problem(401, Problem.INVALID_SIGNATURE, "Invalid signature", str(exc))
        return None

    async def _open(self) -> Answer | None:
        """A 503 if the record store cannot be opened (None when it is open)."""
        try:
            await self.ready()
        except Exception as exc:
            log.error("idempotency store unavailable: %r", exc)
            return _unavailable()
        return None

    async def _scope(self, request: Request) -> str:
        """The request's scope. The resolver is the application's code: what it raises is the
        application's error, never reported as an unavailable store."""
        scope = self.scope_resolver(request)
        if inspect.isawaitable(scope):
            scope = await scope
        if not isinstance(scope, str):
            raise TypeError(f"scope_resolver returned {type(scope).__name__}, not a str")
        return scope

    async def finish(self, run: Run, status: int | None, headers: Headers, body: bytes | None) -> None:
        """Complete the record with the response; release it for a status in
        ``release_statuses``, on an exception (``status`` None) or when no response was sent.
        ``body`` None: not stored (too large)."""
        try:
            if status is None or status in self.release_statuses:
                await self.store.release(run.identity, run.context.epoch)
                return
            kept = tuple((k, v) for k, v in headers if k.lower() not in UNSTORED)
            done = await self.store.complete(run.identity, run.context.epoch,
                                             StoredResponse(status, kept, body),
                                             expires_at=self.clock() + self.retention)
            if not done:
                log.warning("key %r was taken over (epoch %d is stale); its response was not stored",
                            run.context.key, run.context.epoch)
        except Exception:
            log.exception("could not record the outcome for key %r; it stays claimed until its lease "
                          "expires", run.context.key)


async def purge_forever(store: RecordStore, every_seconds: float, clock: Callable[[], datetime]) -> None:
    """Delete expired records every ``every_seconds``, for as long as it runs (a background task)."""
    while True:
        await asyncio.sleep(every_seconds)
        try:
            purged = await store.purge(clock())
        except Exception:
            log.exception("purging expired idempotency records failed; retrying later")
        else:
            if purged:
                log.info("purged %d expired idempotency records", purged)


def _fence(request: Request) -> int | Answer | None:
    """The request's Outbox-Fence (None when absent), or the 400 for a malformed one."""
    try:
        return parse_fence(request.values(FENCE))
    except MalformedFence as exc:
        return problem(400, Problem.MALFORMED_FENCE, "Malformed Outbox-Fence", str(exc))


def _unbound_probe(request: Request, body: bytes, key: str, fence: int) -> str | None:
    """Why a (signed) probe's body does not name the key and fence its headers ask about, or None."""
    try:
        asked = json.loads(body)
    except (ValueError, RecursionError):
        return "the body is not JSON"
    if not isinstance(asked, dict) or not isinstance(asked.get("key"), str) or type(asked.get("fence")) is not int:
        return 'the body is not a JSON object with a string "key" and an integer "fence"'
    if asked["key"] != key:
        return "the body's key is not the Idempotency-Key"
    if dict(request.headers).get(WEBHOOK_ID) != key:
        return "webhook-id is not the Idempotency-Key"
    if asked["fence"] != fence:
        return "the body's fence is not the Outbox-Fence"
    return None


def _unavailable() -> Answer:
    return problem(503, Problem.STORE_UNAVAILABLE, "Idempotency store unavailable",
                   "the idempotency record store cannot be reached; the request was not run",
                   retry_after="1")


def _probe_answer(key: str, result: ProbeResult) -> Answer:
    payload: dict[str, object] = {"state": result.state.value, "key": key, "fence": result.fence}
    if result.response is not None:
        payload["response"] = {
            "status": result.response.status,
            "headers": [list(pair) for pair in result.response.headers],
            "body": None if result.response.body is None else base64.b64encode(result.response.body).decode(),
        }
    return Answer(200, (("content-type", "application/json"),), json.dumps(payload).encode(),
                  tracing.Outcome.PROBE.value)
