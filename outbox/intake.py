"""What a producer hands over, validated and digested before any store sees it: the same checks
for the library's ``Outbox``, the API, and an application enqueuing on its own connection
(``outbox.producer``), so an intent refused by one is refused by all, with the same error.

Nothing here reads or writes a database: an ``Intake`` needs only the settings (the payload
limit, the default attempts) and a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Required, TypedDict

from . import timestamps, tracing
from .digest import canonical_json, digest_of
from .errors import InvalidInput, PayloadTooLarge
from .events import NewEvent
from .ids import ACTION_ID, DESTINATION_ID, MAX_KEY_LENGTH, ORDERING_KEY, SCOPE, check, intent_key, uuid7
from .model import Event, EventKind, NewIntent
from .settings import Settings
from .topics import EVENT_ID, action_id_for, checked_topic

#: The longest destination id (``ids.DESTINATION_ID``): every event's intents' keys must fit with it.
LONGEST_DESTINATION = "d" * 64
#: The longest ``scope`` and ``event_id`` may be together, so every derived key fits ``MAX_KEY_LENGTH``.
MAX_EVENT_KEY = MAX_KEY_LENGTH - len(intent_key("", action_id_for("", LONGEST_DESTINATION)))


class IntentFields(TypedDict, total=False):
    """An enqueue's keywords: where the intent goes, on whose authority, and what; the rest is
    optional."""

    destination: Required[str]
    scope: Required[str]
    payload: Required[Any]
    action_id: str | None  # generated (UUIDv7) when None
    not_before: datetime | None
    expires_at: datetime | None
    max_attempts: int | None  # the settings' default_max_attempts when None
    ordering_key: str | None
    actor: str  # who the enqueued event names: "library" unless said
    #: The producer's W3C headers (``traceparent``, ``tracestate``); None: the current context.
    trace_context: Mapping[str, str] | None


class EventFields(TypedDict, total=False):
    """A publish's keywords: what happened, in which scope; the rest is optional and given to
    each of the event's intents."""

    scope: Required[str]
    topic: Required[str]
    payload: Required[Any]
    event_id: str | None  # generated (UUIDv7) when None
    not_before: datetime | None
    expires_at: datetime | None
    max_attempts: int | None
    ordering_key: str | None
    actor: str  # who the intents' first events name: "library" unless said
    #: The producer's W3C headers (``traceparent``, ``tracestate``); None: the current context.
    trace_context: Mapping[str, str] | None


@dataclass(frozen=True, slots=True)
class Intake:
    """Validates and digests intents and events, with ``settings``' limits and ``now``'s time."""

    settings: Settings
    now: Callable[[], datetime]

    @property
    def granted_only(self) -> bool:
        """Whether a fan-out reaches only the destinations the scope holds a grant for: with the
        built-in grants table as the authority. Other providers (an HTTP policy, a callable) cannot be
        asked inside the commit, so every subscriber gets an intent and the send-time check decides
        (a denied one becomes ``revoked``, nothing sent)."""
        return self.settings.authority == "grants"

    def intent(
        self,
        *,
        destination: str,
        scope: str,
        payload: Any,
        action_id: str | None = None,
        not_before: datetime | None = None,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
        ordering_key: str | None = None,
        actor: str = "library",
        trace_context: Mapping[str, str] | None = None,
        traced: bool = True,
    ) -> tuple[NewIntent, Event]:
        """An intent and its first event, validated and digested, not written. Raises InvalidInput.

        Once valid, its ``create`` span is recorded, child of ``trace_context`` (the producer's
        headers; None: the current context), and the intent keeps that span's context (not
        ``traced``: none, for a caller that makes the span itself)."""
        check(DESTINATION_ID, destination, "destination")
        check(SCOPE, scope, "scope")
        if ordering_key is not None:
            check(ORDERING_KEY, ordering_key, "ordering_key")
        action_id = check(ACTION_ID, action_id, "action_id") if action_id is not None else uuid7()
        if len(intent_key(scope, action_id)) > MAX_KEY_LENGTH:
            raise InvalidInput(
                f"scope and action_id together are {len(scope) + len(action_id)} characters; receivers get "
                f"them as one key, scope/action_id, of at most {MAX_KEY_LENGTH}: shorten one of them")
        canonical = canonical_json(payload)
        if len(canonical) > self.settings.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {len(canonical)} bytes of canonical JSON; "
                f"the limit is {self.settings.max_payload_bytes}"
            )
        if not_before is not None:
            not_before = timestamps.checked(not_before, "not_before")
        if expires_at is not None:
            expires_at = timestamps.checked(expires_at, "expires_at")
        if not_before and expires_at and expires_at <= not_before:
            raise InvalidInput("expires_at must be later than not_before")
        if max_attempts is not None and (type(max_attempts) is not int or not 1 <= max_attempts <= 1000):
            raise InvalidInput(f"max_attempts must be an integer between 1 and 1000, not {max_attempts!r}")
        now = self.now()
        new = NewIntent(
            action_id=action_id,
            scope=scope,
            destination=destination,
            payload_json=canonical.decode(),
            payload_digest=digest_of(canonical),
            max_attempts=max_attempts or self.settings.default_max_attempts,
            next_attempt_at=max(now, not_before) if not_before else now,
            not_before=not_before,
            expires_at=expires_at,
            created_at=now,
            ordering_key=ordering_key,
            trace_context=tracing.created(destination, action_id, trace_context) if traced else None,
        )
        return new, Event(kind=EventKind.ENQUEUED, at=now, actor=actor)

    def event(self, *, scope: str, topic: str, payload: Any, event_id: str | None = None,
              not_before: datetime | None = None, expires_at: datetime | None = None,
              max_attempts: int | None = None, ordering_key: str | None = None,
              actor: str = "library", trace_context: Mapping[str, str] | None = None) -> NewEvent:
        """An event, validated and digested, not written (its intents' fields are checked as an
        enqueue checks them). Raises InvalidInput. Its ``create`` span (``tracing.created``, on
        the topic) is the parent of every intent's attempts."""
        check(SCOPE, scope, "scope")
        checked_topic(topic)
        event_id = check(EVENT_ID, event_id, "event_id") if event_id is not None else uuid7()
        if len(scope) + len(event_id) > MAX_EVENT_KEY:
            raise InvalidInput(
                f"scope and event_id together are {len(scope) + len(event_id)} characters; each of the event's "
                f"intents is known to receivers as scope/evt~event_id~destination, of at most {MAX_KEY_LENGTH}: "
                f"keep them to {MAX_EVENT_KEY}")
        # the intents' own checks (payload, times, attempts, ordering key), as for the intent of the
        # longest destination id: what passes here passes for every subscriber
        new, _ = self.intent(destination=LONGEST_DESTINATION, scope=scope, payload=payload,
                             action_id=action_id_for(event_id, LONGEST_DESTINATION), not_before=not_before,
                             expires_at=expires_at, max_attempts=max_attempts, ordering_key=ordering_key,
                             traced=False)
        return NewEvent(event_id=event_id, scope=scope, topic=topic, payload_json=new.payload_json,
                        payload_digest=new.payload_digest, max_attempts=new.max_attempts,
                        next_attempt_at=new.next_attempt_at, not_before=new.not_before, expires_at=new.expires_at,
                        created_at=new.created_at, ordering_key=ordering_key, actor=actor,
                        trace_context=tracing.created(topic, event_id, trace_context))
