"""A client for producers on other hosts: the outbox's HTTP API through httpx, blocking
(``Client``) or async (``AsyncClient``), with the same methods and arguments.

    with Client("http://outbox.internal:8080") as outbox:      # token from OUTBOX_TOKEN
        sent = outbox.enqueue("billing", {"invoice": 42}, scope="acme", action_id="invoice-42")
        settled = outbox.wait(sent.intent.action_id, scope="acme", timeout=30)

Every call but an operator's approval or refusal is safe to repeat, so connection errors, 429
and 503 are retried (tenacity, honouring ``Retry-After`` up to a cap): an enqueue's action id is
fixed before its first try (a UUIDv7 made here when the caller gives none), so a retried
enqueue finds its own intent (200) rather than making a second one. ``approve`` and ``reject``
are retried only when no connection was made. Problem+json answers are raised as typed errors, which are also the
library's (``outbox.errors``) of the same meaning. Answers have the shapes ``outbox.shapes``
defines (an ``Intent``'s ``data`` is a ``shapes.Intent``, with ``shapes.IntentDetail``'s
attempts and events from ``get`` and ``wait``). Only httpx, tenacity and those shapes are
imported here: a producer host needs neither the store nor the server. (About 650 lines: two
clients, blocking and async, with the same methods over the shared request helpers.)
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Self
from urllib.parse import quote

import httpx
import tenacity

from . import errors, timestamps, tracing
from .ids import uuid7
from .shapes import MAX_BATCH, PROBLEM_TYPE_PREFIX, SETTLED_STATUSES

#: A batch request's body is kept under this many bytes (the server's default limit is 64 MiB).
BATCH_BYTES = 16 * 1024 * 1024
#: The longest one long-poll request asks the server to hold (the server allows 60 s).
LONG_POLL_SECONDS = 30.0


# -- what the API answers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    """An intent as the API shows it; ``get`` and ``wait`` add its attempts and events (the
    evidence of what may have happened, for an ``unknown`` one). ``data`` is the whole answer.
    ``enqueue_many``'s intents carry no payload (None): the caller sent it; the digest is here."""

    action_id: str
    scope: str
    destination: str
    status: str
    payload: Any
    payload_digest: str
    data: dict[str, Any] = field(repr=False)
    attempts: tuple[dict[str, Any], ...] = field(default=(), repr=False)
    events: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    @property
    def settled(self) -> bool:
        """Delivered, dead, revoked, cancelled or unknown: nothing more happens by itself."""
        return self.status in SETTLED_STATUSES

    @classmethod
    def of(cls, data: dict[str, Any]) -> Intent:
        return cls(data["action_id"], data["scope"], data["destination"], data["status"], data.get("payload"),
                   data["payload_digest"], data, tuple(data.get("attempts", ())), tuple(data.get("events", ())))


@dataclass(frozen=True)
class Enqueued:
    """An enqueue's answer: the intent, and whether this call created it (False: it already
    existed with the same destination, payload and ordering key: a retry or a repeat)."""

    intent: Intent
    created: bool


@dataclass(frozen=True)
class Event:
    """An event as the API shows it, with its fan-out: per destination its intent's
    ``action_id`` and ``status``, or why it was ``skipped`` (``shapes.PublishedEvent``)."""

    event_id: str
    scope: str
    topic: str
    fanout: tuple[dict[str, Any], ...]
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Event:
        return cls(data["event_id"], data["scope"], data["topic"], tuple(data["fanout"]), data)


@dataclass(frozen=True)
class Published:
    """A publish's answer: the event, and whether this call recorded it (False: a repeat)."""

    event: Event
    created: bool


# -- errors ---------------------------------------------------------------------------------------


class OutboxError(errors.OutboxError):
    """The outbox answered with a problem (RFC 9457): its ``type``, ``status``, ``title``,
    ``detail`` and every other field of it (``problem``; ``errors`` for invalid input)."""

    def __init__(self, problem: Mapping[str, Any]) -> None:
        self.problem = dict(problem)
        self.type: str = str(problem.get("type", ""))
        self.status: int = int(problem.get("status", 0))
        self.title: str = str(problem.get("title", ""))
        self.detail: str = str(problem.get("detail", ""))
        super().__init__(f"{self.status} {self.kind}: {self.detail}")

    @property
    def kind(self) -> str:
        """The type's last part (``intent-conflict``), as the README's Errors table names it."""
        return self.type.removeprefix(PROBLEM_TYPE_PREFIX)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """For invalid input: each refused field (``field``, ``message``)."""
        return list(self.problem.get("errors", []))


class InvalidInput(OutboxError, errors.InvalidInput):
    """400, 415, 422: the request or a field of it is malformed (``errors`` names the fields)."""


class PayloadTooLarge(InvalidInput, errors.PayloadTooLarge):
    """413: the payload or the body is over the server's limit."""


class FanoutTooLarge(InvalidInput, errors.FanoutTooLarge):
    """422 ``fanout-too-large``: the event would fan out to more destinations (``fanout``) than the
    server's ``max_fanout`` allows."""

    def __init__(self, problem: Mapping[str, Any]) -> None:
        super().__init__(problem)
        self.fanout = int(problem.get("fanout", 0))
        self.max_fanout = int(problem.get("max_fanout", 0))


class UnknownDestination(OutboxError, errors.UnknownDestination):
    """422: the destination named is not registered."""


class Conflict(OutboxError):
    """409: the request conflicts with what is recorded."""


class IntentConflict(Conflict, errors.IntentConflict):
    """409: the action id is already used in its scope for another destination, payload or key."""


class AmbiguousActionId(Conflict, errors.AmbiguousActionId):
    """409: the action id is used in several scopes the token reads; name the scope."""


class NotFound(OutboxError, errors.NotFound):
    """404: no such intent (or not in the token's scopes)."""


class Unauthorized(OutboxError):
    """401: no token, or an unknown or revoked one."""


class Forbidden(OutboxError):
    """403: the token's role or scopes do not allow it."""


class Unavailable(OutboxError):
    """429 or 503: the outbox asks to be called later (after ``retry_after`` seconds, if it said);
    raised once the retries are spent."""

    retry_after: float | None = None


class WaitTimeout(OutboxError, TimeoutError):
    """``wait`` ran out of time before the intent settled; ``intent`` is how it stood last."""

    def __init__(self, intent: Intent, timeout: float) -> None:
        self.intent = intent
        super().__init__({"type": PROBLEM_TYPE_PREFIX + "wait-timeout", "title": "Not settled in time", "status": 0,
                          "detail": f"intent {intent.action_id!r} is still {intent.status} after {timeout:g} s"})


_BY_TYPE: dict[str, type[OutboxError]] = {
    "payload-too-large": PayloadTooLarge,
    "fanout-too-large": FanoutTooLarge,
    "unknown-destination": UnknownDestination,
    "intent-conflict": IntentConflict,
    "ambiguous-action-id": AmbiguousActionId,
}
_BY_STATUS: dict[int, type[OutboxError]] = {
    400: InvalidInput, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: PayloadTooLarge,
    415: InvalidInput, 422: InvalidInput, 429: Unavailable, 503: Unavailable,
}


def problem_error(problem: Mapping[str, Any], retry_after: float | None = None) -> OutboxError:
    """The typed error a problem stands for: by its type, else by its status."""
    kind = str(problem.get("type", "")).removeprefix(PROBLEM_TYPE_PREFIX)
    cls = _BY_TYPE.get(kind) or _BY_STATUS.get(int(problem.get("status", 0)), OutboxError)
    error = cls(problem)
    if isinstance(error, Unavailable):
        error.retry_after = retry_after
    return error


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), if it has one."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _answer(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer; otherwise raises the problem's typed error."""
    if response.is_success:
        return response.json()
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):  # not problem+json (a proxy's page): still typed by status
        problem = {"type": "about:blank", "status": response.status_code, "title": response.reason_phrase,
                   "detail": response.text[:500]}
    raise problem_error(problem, _retry_after(response.headers.get("retry-after")))


# -- retries --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How calls are retried: connection errors, 429 and 503, up to ``attempts`` tries in all,
    pausing exponentially from ``initial_seconds`` with full jitter, or as ``Retry-After`` says,
    never longer than ``max_seconds`` at a time. Other answers (4xx) are never retried."""

    attempts: int = 5
    initial_seconds: float = 0.2
    max_seconds: float = 10.0

    def pause(self, state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, Unavailable) and error.retry_after is not None:
            return min(error.retry_after, self.max_seconds)
        return random.uniform(0, min(self.max_seconds, self.initial_seconds * 2 ** (state.attempt_number - 1)))

    def arguments(self, *, repeatable: bool = True) -> dict[str, Any]:
        """tenacity's arguments, for its blocking and its async retrier alike. A call that is not
        ``repeatable`` (an approval: a second one finds the intent no longer held) is retried
        only when it cannot have been acted on: no connection made (a 503 may come from a proxy
        that forwarded it)."""
        return {"retry": tenacity.retry_if_exception(_retryable if repeatable else _unsent), "wait": self.pause,
                "stop": tenacity.stop_after_attempt(self.attempts), "reraise": True}


NO_RETRY = RetryPolicy(attempts=1)


def _retryable(error: BaseException) -> bool:
    return isinstance(error, httpx.TransportError | Unavailable)


def _unsent(error: BaseException) -> bool:
    return isinstance(error, httpx.ConnectError)


# -- requests, shared by both clients -------------------------------------------------------------


def _token(token: str | None) -> str:
    found = token or os.environ.get("OUTBOX_TOKEN")
    if not found:
        raise ValueError("no token: pass token=... or set OUTBOX_TOKEN (see `outbox tokens create`)")
    return found


def _intent_body(destination: str, payload: Any, scope: str, action_id: str | None, not_before: datetime | None,
                 expires_at: datetime | None, max_attempts: int | None, ordering_key: str | None) -> dict[str, Any]:
    """An intent as POST /v1/intents takes it, its action id fixed now (before any try)."""
    return {"action_id": action_id or uuid7(), "scope": scope, "destination": destination, "payload": payload,
            **_optional(not_before=not_before, expires_at=expires_at, max_attempts=max_attempts,
                        ordering_key=ordering_key)}


def _optional(*, not_before: datetime | None = None, expires_at: datetime | None = None,
              max_attempts: int | None = None, ordering_key: str | None = None) -> dict[str, Any]:
    """An intent's (or an event's) optional fields that are given, as the API takes them."""
    body: dict[str, Any] = {}
    for name, when in (("not_before", not_before), ("expires_at", expires_at)):
        if when is not None:
            body[name] = timestamps.text(when, name)
    for name, value in (("max_attempts", max_attempts), ("ordering_key", ordering_key)):
        if value is not None:
            body[name] = value
    return body


def _event_body(scope: str, topic: str, payload: Any, event_id: str | None = None, **options: Any) -> dict[str, Any]:
    """An event as POST /v1/events takes it, its id fixed now (before any try); ``options`` are
    the optional intent fields (``_optional``'s)."""
    try:
        optional = _optional(**options)
    except TypeError:
        raise TypeError(f"publish got unexpected fields among {sorted(options)}") from None
    return {"event_id": event_id or uuid7(), "scope": scope, "topic": topic, "payload": payload, **optional}


def _intent_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """One of ``enqueue_many``'s items as POST /v1/intents takes it."""
    fields = dict(item)
    body = _intent_body(
        fields.pop("destination"), fields.pop("payload"), fields.pop("scope"), fields.pop("action_id", None),
        *(fields.pop(name, None) for name in ("not_before", "expires_at", "max_attempts", "ordering_key")))
    if fields:
        raise TypeError(f"enqueue_many got unexpected fields {sorted(fields)}")
    return body


def _batches(items: Iterable[Mapping[str, Any]],
             body: Callable[[Mapping[str, Any]], dict[str, Any]] = _intent_item) -> Iterator[builtins.list[bytes]]:
    """A batch call's items as encoded bodies (``body`` of each: each id fixed now), in batches
    of at most MAX_BATCH and about BATCH_BYTES."""
    batch: builtins.list[bytes] = []
    size = 0
    for item in items:
        encoded = _encoded(body(item))
        if batch and (len(batch) == MAX_BATCH or size + len(encoded) > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(encoded)
        size += len(encoded) + 1
    if batch:
        yield batch


def _batch_request(batch: Sequence[bytes], name: bytes = b"intents") -> bytes:
    return b'{"' + name + b'":[' + b",".join(batch) + b"]}"


def _event_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """One of ``publish_many``'s items as POST /v1/events takes it."""
    return _event_body(**item)


def _published(answer: Mapping[str, Any]) -> builtins.list[Published | OutboxError]:
    return [Published(Event.of(item["event"]), item["status"] == 201) if "event" in item
            else problem_error(item["problem"]) for item in answer["results"]]


def _event_path(event_id: str) -> str:
    return f"/v1/events/{quote(event_id, safe='')}"


def _batch_results(answer: Mapping[str, Any]) -> builtins.list[Enqueued | OutboxError]:
    return [Enqueued(Intent.of(item["intent"]), item["status"] == 201) if "intent" in item
            else problem_error(item["problem"]) for item in answer["results"]]


def _tenant_path(destination_id: str) -> str:
    return "/v1/tenant/destinations/" + quote(destination_id, safe="")


def _portal_links_path(scope: str) -> str:
    return f"/v1/tenants/{quote(scope, safe='')}/portal-links"


def _portal_link_body(session_seconds: float | None, read_only: bool) -> bytes:
    given = {} if session_seconds is None else {"session_seconds": session_seconds}
    return _encoded({"read_only": read_only, **given})


def _intent_path(action_id: str) -> str:
    return f"/v1/intents/{quote(action_id, safe='')}"


def _list_params(status: Sequence[str] | str | None, scope: Sequence[str] | str | None, destination: str | None,
                 channel: str | None, created_after: datetime | None, created_before: datetime | None,
                 page_size: int) -> builtins.list[tuple[str, str]]:
    params: builtins.list[tuple[str, str]] = [("limit", str(page_size))]
    for name, values in (("status", status), ("scope", scope)):
        params += [(name, v) for v in ([values] if isinstance(values, str) else values or [])]
    for name, value in (("destination", destination), ("channel", channel)):
        if value is not None:
            params.append((name, value))
    for name, when in (("created_after", created_after), ("created_before", created_before)):
        if when is not None:
            params.append((name, timestamps.text(when, name)))
    return params


def _approval(payload_digest: str, reason: str, valid_seconds: float | None) -> bytes:
    """An approval as POST /v1/intents/{id}/approve takes it."""
    body: dict[str, Any] = {"payload_digest": payload_digest, "reason": reason}
    if valid_seconds is not None:
        body["valid_seconds"] = valid_seconds
    return _encoded(body)


def _headers(body: bytes | None) -> dict[str, str]:
    """A request's headers: its media type, and the caller's current trace context (W3C
    ``traceparent``), which an enqueue keeps as its intent's parent."""
    headers = tracing.carrier()
    if body is not None:
        headers["Content-Type"] = "application/json"
    return headers


def _encoded(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _scoped(scope: str | None, wait: float | None = None) -> dict[str, str]:
    """The query naming an intent's scope (if given) and how long to long-poll (if at all)."""
    return {**({"scope": scope} if scope else {}), **({"wait": f"{wait:.3f}"} if wait else {})}


def _paged(params: builtins.list[tuple[str, str]], cursor: str | None) -> builtins.list[tuple[str, str]]:
    return params + ([("cursor", cursor)] if cursor else [])


def _early(asked: float, hold: float) -> float:
    """How long to pause after a long poll answered unsettled: nothing if the server held it as
    asked, else up to 0.2 s, so a server answering at once (shutting down) is not spun on."""
    return max(0.0, min(0.2, hold) - (time.monotonic() - asked))


def _waited(intent: Intent, deadline: float, timeout: float) -> float | None:
    """How long the next long poll may ask for; None once the intent is settled. Raises
    WaitTimeout once the deadline has passed."""
    if intent.settled:
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise WaitTimeout(intent, timeout)
    return min(remaining, LONG_POLL_SECONDS)


# -- the clients ----------------------------------------------------------------------------------


class Client:
    """The outbox's HTTP API, blocking. Close it (or use it as a context manager) when done."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 10.0,
                 retry: RetryPolicy = RetryPolicy()) -> None:
        self.timeout = timeout
        self.retry = retry
        self._http = httpx.Client(base_url=base_url, timeout=timeout,
                                  headers={"Authorization": f"Bearer {_token(token)}"})

    def _call(self, method: str, path: str, *, params: Any = None, body: bytes | None = None,
              timeout: float | None = None, repeatable: bool = True) -> tuple[int, Any]:
        """The answer's status and JSON, after the retries the policy allows."""
        for attempt in tenacity.Retrying(**self.retry.arguments(repeatable=repeatable)):
            with attempt:
                response = self._http.request(method, path, params=params, content=body, headers=_headers(body),
                                              timeout=timeout or self.timeout)
                return response.status_code, _answer(response)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def enqueue(self, destination: str, payload: Any, *, scope: str, action_id: str | None = None,
                not_before: datetime | None = None, expires_at: datetime | None = None,
                max_attempts: int | None = None, ordering_key: str | None = None) -> Enqueued:
        """Enqueue one intent; retried safely (see the module's docstring). Raises InvalidInput,
        UnknownDestination, IntentConflict, Forbidden, ..."""
        status, data = self._call("POST", "/v1/intents", body=_encoded(_intent_body(
            destination, payload, scope, action_id, not_before, expires_at, max_attempts, ordering_key)))
        return Enqueued(Intent.of(data), status == 201)

    def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> builtins.list[Enqueued | OutboxError]:
        """Enqueue intents (each a mapping of ``enqueue``'s arguments) through the batch endpoint,
        MAX_BATCH at a time: a result per item, in order, an item's error in its place (not
        raised). A batch refused as a whole raises."""
        results: builtins.list[Enqueued | OutboxError] = []
        for batch in _batches(items):
            results += _batch_results(self._call("POST", "/v1/intents:batch", body=_batch_request(batch))[1])
        return results

    def get(self, action_id: str, *, scope: str | None = None) -> Intent:
        """An intent with its attempts and events. Raises NotFound, AmbiguousActionId."""
        return Intent.of(self._call("GET", _intent_path(action_id), params=_scoped(scope))[1])

    def publish(self, topic: str, payload: Any, *, scope: str, event_id: str | None = None,
                **options: Any) -> Published:
        """Publish an event (one intent per subscribed destination); its id is fixed before the
        first try, so a retry finds it (200). ``options``: ``not_before``, ``expires_at``,
        ``max_attempts``, ``ordering_key``. Raises InvalidInput, IntentConflict, Forbidden, ..."""
        status, data = self._call("POST", "/v1/events", body=_encoded(_event_body(
            scope, topic, payload, event_id, **options)))
        return Published(Event.of(data), status == 201)

    def publish_many(self, items: Iterable[Mapping[str, Any]]) -> builtins.list[Published | OutboxError]:
        """Publish events (each a mapping of ``publish``'s arguments) through the batch endpoint,
        as ``enqueue_many`` enqueues: a result per item, in order, an item's error in its place."""
        results: builtins.list[Published | OutboxError] = []
        for batch in _batches(items, _event_item):
            results += _published(self._call("POST", "/v1/events:batch", body=_batch_request(batch, b"events"))[1])
        return results

    def get_event(self, event_id: str, *, scope: str | None = None) -> Event:
        """An event with its fan-out. Raises NotFound, AmbiguousActionId."""
        return Event.of(self._call("GET", _event_path(event_id), params=_scoped(scope))[1])

    def wait(self, action_id: str, *, timeout: float, scope: str | None = None) -> Intent:
        """The intent once settled (delivered, dead, revoked, cancelled, or unknown with its
        attempts as evidence), long-polling the server. Raises WaitTimeout, NotFound."""
        deadline = time.monotonic() + timeout
        intent = self.get(action_id, scope=scope)
        while (hold := _waited(intent, deadline, timeout)) is not None:
            asked = time.monotonic()
            intent = Intent.of(self._call("GET", _intent_path(action_id), params=_scoped(scope, hold),
                                          timeout=hold + self.timeout)[1])
            time.sleep(_early(asked, hold))
        return intent

    def list(self, *, status: Sequence[str] | str | None = None, scope: Sequence[str] | str | None = None,
             destination: str | None = None, channel: str | None = None, created_after: datetime | None = None,
             created_before: datetime | None = None, page_size: int = 100) -> Iterator[Intent]:
        """Intents matching the filters, newest first, fetched a page at a time."""
        params = _list_params(status, scope, destination, channel, created_after, created_before, page_size)
        cursor: str | None = None
        while True:
            page = self._call("GET", "/v1/intents", params=_paged(params, cursor))[1]
            yield from (Intent.of(item) for item in page["items"])
            if not (cursor := page["next_cursor"]):
                return

    def approve(self, action_id: str, *, payload_digest: str, reason: str, scope: str | None = None,
                valid_seconds: float | None = None) -> Intent:
        """Approve a held intent for exactly ``payload_digest`` (an operator's token), for
        ``valid_seconds`` (the server's default: an hour). Not repeatable, so retried only when
        it cannot have been acted on. Raises InvalidInput (another digest), Conflict (not held), NotFound."""
        return Intent.of(self._call("POST", _intent_path(action_id) + "/approve", params=_scoped(scope),
                                    body=_approval(payload_digest, reason, valid_seconds), repeatable=False)[1])

    def reject(self, action_id: str, *, reason: str, scope: str | None = None) -> Intent:
        """Refuse a held intent (an operator's token): cancelled, never sent. As ``approve``."""
        return Intent.of(self._call("POST", _intent_path(action_id) + "/reject", params=_scoped(scope),
                                    body=_encoded({"reason": reason}), repeatable=False)[1])

    # -- a link into the tenant portal (an admin's token, or a producer's of the scope) ------

    def portal_link(self, scope: str, *, session_seconds: float | None = None,
                    read_only: bool = False) -> dict[str, Any]:
        """A single-use link into the tenant portal for one of ``scope``'s users: its ``url``
        (relative to the service: prefix its public origin, and send the user's browser there),
        shown in this answer only, and until when it opens (``expires_at``). Not repeatable (each
        call makes one). Raises InvalidInput (a session longer than the server allows), Forbidden."""
        return self._call("POST", _portal_links_path(scope), body=_portal_link_body(session_seconds, read_only),
                          repeatable=False)[1]

    # -- a tenant's own (a token of role tenant: the /v1/tenant routes) ----------------------

    def create_destination(self, url: str, **spec: Any) -> dict[str, Any]:
        """Register an endpoint of the tenant's own (``spec``: the destination's other fields,
        such as ``subscriptions``); its ``id`` is made by the server, and its ``secret`` too unless
        given, shown in this answer only. Not repeatable (each call makes one). Raises InvalidInput,
        Forbidden (a setting an admin decides), Conflict (the tenant's limit)."""
        return self._call("POST", "/v1/tenant/destinations", body=_encoded({"url": url, **spec}),
                          repeatable=False)[1]

    def own_destinations(self) -> builtins.list[dict[str, Any]]:
        """The tenant's own destinations (never their secrets)."""
        return self._call("GET", "/v1/tenant/destinations")[1]["items"]

    def rotate_secret(self, destination_id: str, *, window_seconds: float | None = None) -> dict[str, Any]:
        """A new signing secret for one of the tenant's destinations (its ``secret``, shown here
        only); the previous one signs beside it for ``window_seconds`` (the server's default: 24 h)."""
        return self._call("POST", _tenant_path(destination_id) + "/rotate-secret",
                          body=_encoded({"window_seconds": window_seconds}), repeatable=False)[1]

    def send_test(self, destination_id: str, payload: Any = None) -> Intent:
        """Send a test intent to one of the tenant's destinations; read it back with ``own_intent``."""
        return Intent.of(self._call("POST", _tenant_path(destination_id) + "/test",
                                    body=_encoded({"payload": payload}), repeatable=False)[1])

    def own_intent(self, action_id: str) -> Intent:
        """One of the tenant's intents, with its attempts and events. Raises NotFound."""
        return Intent.of(self._call("GET", "/v1/tenant/intents/" + quote(action_id, safe=""))[1])

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """The outbox's HTTP API for asyncio: ``Client``'s methods, awaited (``list`` is iterated
    with ``async for``). Close it (or use it as an async context manager) when done."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 10.0,
                 retry: RetryPolicy = RetryPolicy()) -> None:
        self.timeout = timeout
        self.retry = retry
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout,
                                       headers={"Authorization": f"Bearer {_token(token)}"})

    async def _call(self, method: str, path: str, *, params: Any = None, body: bytes | None = None,
                    timeout: float | None = None, repeatable: bool = True) -> tuple[int, Any]:
        """The answer's status and JSON, after the retries the policy allows."""
        async for attempt in tenacity.AsyncRetrying(**self.retry.arguments(repeatable=repeatable)):
            with attempt:
                response = await self._http.request(method, path, params=params, content=body,
                                                     headers=_headers(body), timeout=timeout or self.timeout)
                return response.status_code, _answer(response)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def enqueue(self, destination: str, payload: Any, *, scope: str, action_id: str | None = None,
                      not_before: datetime | None = None, expires_at: datetime | None = None,
                      max_attempts: int | None = None, ordering_key: str | None = None) -> Enqueued:
        """As ``Client.enqueue``."""
        status, data = await self._call("POST", "/v1/intents", body=_encoded(_intent_body(
            destination, payload, scope, action_id, not_before, expires_at, max_attempts, ordering_key)))
        return Enqueued(Intent.of(data), status == 201)

    async def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> builtins.list[Enqueued | OutboxError]:
        """As ``Client.enqueue_many``."""
        results: builtins.list[Enqueued | OutboxError] = []
        for batch in _batches(items):
            results += _batch_results((await self._call("POST", "/v1/intents:batch",
                                                        body=_batch_request(batch)))[1])
        return results

    async def get(self, action_id: str, *, scope: str | None = None) -> Intent:
        """As ``Client.get``."""
        return Intent.of((await self._call("GET", _intent_path(action_id), params=_scoped(scope)))[1])

    async def publish(self, topic: str, payload: Any, *, scope: str, event_id: str | None = None,
                      **options: Any) -> Published:
        """As ``Client.publish``."""
        status, data = await self._call("POST", "/v1/events", body=_encoded(_event_body(
            scope, topic, payload, event_id, **options)))
        return Published(Event.of(data), status == 201)

    async def publish_many(self, items: Iterable[Mapping[str, Any]]) -> builtins.list[Published | OutboxError]:
        """As ``Client.publish_many``."""
        results: builtins.list[Published | OutboxError] = []
        for batch in _batches(items, _event_item):
            results += _published((await self._call("POST", "/v1/events:batch",
                                                    body=_batch_request(batch, b"events")))[1])
        return results

    async def get_event(self, event_id: str, *, scope: str | None = None) -> Event:
        """As ``Client.get_event``."""
        return Event.of((await self._call("GET", _event_path(event_id), params=_scoped(scope)))[1])

    async def wait(self, action_id: str, *, timeout: float, scope: str | None = None) -> Intent:
        """As ``Client.wait``."""
        deadline = time.monotonic() + timeout
        intent = await self.get(action_id, scope=scope)
        while (hold := _waited(intent, deadline, timeout)) is not None:
            asked = time.monotonic()
            intent = Intent.of((await self._call("GET", _intent_path(action_id), params=_scoped(scope, hold),
                                                 timeout=hold + self.timeout))[1])
            await asyncio.sleep(_early(asked, hold))
        return intent

    async def list(self, *, status: Sequence[str] | str | None = None, scope: Sequence[str] | str | None = None,
                   destination: str | None = None, channel: str | None = None,
                   created_after: datetime | None = None, created_before: datetime | None = None,
                   page_size: int = 100) -> AsyncIterator[Intent]:
        """As ``Client.list``."""
        params = _list_params(status, scope, destination, channel, created_after, created_before, page_size)
        cursor: str | None = None
        while True:
            page = (await self._call("GET", "/v1/intents", params=_paged(params, cursor)))[1]
            for item in page["items"]:
                yield Intent.of(item)
            if not (cursor := page["next_cursor"]):
                return

    async def approve(self, action_id: str, *, payload_digest: str, reason: str, scope: str | None = None,
                      valid_seconds: float | None = None) -> Intent:
        """As ``Client.approve``."""
        return Intent.of((await self._call("POST", _intent_path(action_id) + "/approve", params=_scoped(scope),
                                           body=_approval(payload_digest, reason, valid_seconds),
                                           repeatable=False))[1])

    async def reject(self, action_id: str, *, reason: str, scope: str | None = None) -> Intent:
        """As ``Client.reject``."""
        return Intent.of((await self._call("POST", _intent_path(action_id) + "/reject", params=_scoped(scope),
                                           body=_encoded({"reason": reason}), repeatable=False))[1])

    async def portal_link(self, scope: str, *, session_seconds: float | None = None,
                          read_only: bool = False) -> dict[str, Any]:
        """As ``Client.portal_link``."""
        return (await self._call("POST", _portal_links_path(scope), body=_portal_link_body(session_seconds, read_only),
                                 repeatable=False))[1]

    async def create_destination(self, url: str, **spec: Any) -> dict[str, Any]:
        """As ``Client.create_destination``."""
        return (await self._call("POST", "/v1/tenant/destinations", body=_encoded({"url": url, **spec}),
                                 repeatable=False))[1]

    async def own_destinations(self) -> builtins.list[dict[str, Any]]:
        """As ``Client.own_destinations``."""
        return (await self._call("GET", "/v1/tenant/destinations"))[1]["items"]

    async def rotate_secret(self, destination_id: str, *, window_seconds: float | None = None) -> dict[str, Any]:
        """As ``Client.rotate_secret``."""
        return (await self._call("POST", _tenant_path(destination_id) + "/rotate-secret",
                                 body=_encoded({"window_seconds": window_seconds}), repeatable=False))[1]

    async def send_test(self, destination_id: str, payload: Any = None) -> Intent:
        """As ``Client.send_test``."""
        return Intent.of((await self._call("POST", _tenant_path(destination_id) + "/test",
                                           body=_encoded({"payload": payload}), repeatable=False))[1])

    async def own_intent(self, action_id: str) -> Intent:
        """As ``Client.own_intent``."""
        return Intent.of((await self._call("GET", "/v1/tenant/intents/" + quote(action_id, safe="")))[1])

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
