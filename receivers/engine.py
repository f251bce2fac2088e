"""The receivers' idempotency contract (DESIGN.md section 6), independent of ASGI or WSGI.

A middleware describes the request, asks ``begin`` what to do — answer at once (a problem, a
replay, a probe's answer) or run the handler under a claim — and reports the handler's response
to ``finish``, which completes the record (2xx-4xx) or releases it (5xx, exception).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .keys import MalformedKey, fingerprint, identity, parse_key
from .records import Busy, Claimed, Mismatch, ProbeResult, RecordStore, Replay, StaleFence, StoredResponse
from .signature import InvalidSignature, verify_signature

log = logging.getLogger("receivers.idempotency")

PROBE_HEADER = "outbox-reconcile"
#: A fence is a non-negative integer that fits every store's 64-bit column.
_FENCE = re.compile(r"^[0-9]{1,18}$")
FENCE_HEADER = "outbox-fence"
#: Never stored or replayed: credentials, cookies and hop-by-hop headers (and what the server sets).
UNSTORED = frozenset({
    "set-cookie", "authorization", "proxy-authorization", "proxy-authenticate", "connection",
    "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "content-length", "date", "server",
})

Headers = Sequence[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Request:
    """What the contract needs to know about a request (names lower-cased)."""

    method: str
    path: str
    query: str
    headers: Headers

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]

    @property
    def media_type(self) -> str:
        found = self.values("content-type")
        return found[0].split(";")[0].strip().lower() if found else ""


@dataclass(frozen=True, slots=True)
class IdempotencyContext:
    """What a handler can read to fence its own downstream effects (``epoch`` rises on takeover)."""

    scope: str
    key: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Answer:
    """Respond with this, without running the handler."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class Run:
    """Run the handler under this claim."""

    identity: str
    context: IdempotencyContext


ScopeResolver = Callable[[Request], "str | Awaitable[str]"]


def problem(status: int, kind: str, title: str, detail: str, **headers: str) -> Answer:
    """An RFC 9457 problem answer (never stored)."""
    body = json.dumps({"type": f"urn:outbox:problem:{kind}", "title": title, "status": status,
                       "detail": detail}).encode()
    extra = tuple((k.replace("_", "-").lower(), v) for k, v in headers.items())
    return Answer(status, (("content-type", "application/problem+json"), *extra), body)


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
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
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
        #: a forged request can never complete (and so poison) a real sender's key.
        self.secrets = secrets
        self.signature_tolerance_seconds = signature_tolerance_seconds
        self.clock = clock
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
                self._purger = asyncio.create_task(self._purge_forever())

    async def aclose(self) -> None:
        """Stop purging and close the store."""
        if self._purger is not None:
            self._purger.cancel()
            self._purger = None
        await self.store.close()

    async def _purge_forever(self) -> None:
        while True:
            await asyncio.sleep(self.purge_seconds)
            try:
                purged = await self.store.purge(self.clock())
            except Exception:
                log.exception("purging expired idempotency records failed; retrying later")
            else:
                if purged:
                    log.info("purged %d expired idempotency records", purged)

    def applies(self, request: Request) -> bool:
        """Whether the contract covers this request (a probe always is)."""
        return request.method.upper() in self.methods or bool(request.values(PROBE_HEADER))

    def too_large(self, declared: int) -> Answer:
        return problem(413, "payload-too-large", "Payload too large",
                       f"the body is {declared} bytes or more; the limit is {self.max_body_bytes}")

    async def begin(self, request: Request, body: bytes) -> Answer | Run | None:
        """Decide before the handler: an answer to send, a claim to run under, or None when the
        contract does not apply (pass through)."""
        try:
            key = parse_key(request.values("idempotency-key"))
        except MalformedKey as exc:
            return problem(400, "malformed-idempotency-key", "Malformed Idempotency-Key", str(exc))
        fence_values = request.values(FENCE_HEADER)
        if fence_values and (len(fence_values) > 1 or not _FENCE.match(fence_values[0].strip())):
            return problem(400, "malformed-fence", "Malformed Outbox-Fence",
                           "Outbox-Fence must be one integer between 0 and 10**18")
        fence = int(fence_values[0].strip()) if fence_values else None
        if key is None:
            if not self.required and not request.values(PROBE_HEADER):  # a probe never reaches the app
                return None
            return problem(400, "missing-idempotency-key", "Missing Idempotency-Key",
                           f"{request.method} {request.path} needs an Idempotency-Key header")
        if len(body) > self.max_body_bytes:
            return self.too_large(len(body))
        if self.secrets is not None:
            try:
                verify_signature(self.secrets, dict(request.headers), body,
                                 tolerance_seconds=self.signature_tolerance_seconds,
                                 now=self.clock().timestamp())
            except InvalidSignature as exc:
                return problem(401, "invalid-signature", "Invalid signature", str(exc))
        try:
            await self.ready()
        except Exception as exc:
            log.error("idempotency store unavailable: %r", exc)
            return _unavailable()
        scope = self.scope_resolver(request)
        if inspect.isawaitable(scope):
            scope = await scope
        assert isinstance(scope, str)
        ident = identity(scope, key)
        now = self.clock()
        try:
            if request.values(PROBE_HEADER):
                if fence is None:
                    return problem(400, "missing-fence", "Missing Outbox-Fence",
                                   "a reconcile probe must carry the sender's new Outbox-Fence")
                return _probe_answer(key, await self.store.probe(ident, fence, now=now,
                                                                 expires_at=now + self.retention))
            found = await self.store.claim(
                ident, fingerprint(request.method, request.path, request.query, request.media_type, body),
                fence=fence, now=now, lease_until=now + self.lease, expires_at=now + self.retention)
        except Exception as exc:  # any store failure: refuse rather than run unprotected
            log.error("idempotency store unavailable: %r", exc)
            return _unavailable()
        if isinstance(found, Claimed):
            return Run(ident, IdempotencyContext(scope, key, found.epoch))
        if isinstance(found, Replay):
            stored = found.response
            headers = (*stored.headers, ("idempotent-replayed", "true"))
            if stored.body is None:
                headers = (*headers, ("idempotent-body-omitted", "true"))
            return Answer(stored.status, headers, stored.body or b"")
        if isinstance(found, Mismatch):
            return problem(422, "idempotency-key-reused", "Idempotency-Key reused",
                           "this Idempotency-Key was used for a different request (method, route, "
                           "query, media type or body); use a new key for a new request")
        if isinstance(found, Busy):
            return problem(409, "request-in-progress", "Request in progress",
                           "a request with this Idempotency-Key is still being processed; retry later",
                           retry_after=str(int(found.retry_after)))
        assert isinstance(found, StaleFence)
        return problem(409, "stale-fence", "Stale fence",
                       f"Outbox-Fence {fence} is lower than {found.min_fence}, already seen for this key; "
                       "a newer attempt superseded this one")

    async def finish(self, run: Run, status: int | None, headers: Headers, body: bytes | None) -> None:
        """Complete the record with a 2xx-4xx response; release it on 5xx, on an exception
        (``status`` None) or when no response was sent. ``body`` None: not stored (too large)."""
        try:
            if status is None or status >= 500:
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


def _unavailable() -> Answer:
    return problem(503, "store-unavailable", "Idempotency store unavailable",
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
    return Answer(200, (("content-type", "application/json"),), json.dumps(payload).encode())
