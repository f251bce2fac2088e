"""The API's wire shapes, defined once: every request body and every answer, as pydantic models.

The routes declare them, so FastAPI validates the bodies and generates ``/openapi.json`` from
them; the presenters at the end turn the outbox's records into answers (the API's and the CLI's
JSON); ``outbox.client`` reads answers with them. So that a producer host can import it, this
module imports no FastAPI, store or sender code.

The ids' rules are types (``ActionId``, ``Scope``, ...) from ``outbox.fields``, which the
records' specs are built from too.

It is longer than most modules (about 660 lines: intents, events, destinations and their traces) because it is the whole
wire in one place: split, a shape would again be spelled out where another one is read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from json import loads as json_loads
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    WithJsonSchema,
)
from pydantic.json_schema import SkipJsonSchema

from receivers.wire import PROBLEM_TYPE_PREFIX

from . import tracing
from .channels import signing_secrets
from .clock import iso
from .fields import (
    MAX_ROTATION_SECONDS,
    ActionId,
    DestinationName,
    EventId,
    OrderingKey,
    Scope,
    Subscription,
    Topic,
)
from .flow import RateLimit
from .model import (
    MAX_APPROVAL_SECONDS,
    SETTLED,
    OnDead,
    OnUnknown,
    Ordering,
    Outcome,
    Resolution,
    Role,
    Status,
    Submission,
)
from .portal import link_path
from .timestamps import Timestamp

if TYPE_CHECKING:
    from .destinations import Destination as DestinationRecord
    from .events import StoredEvent
    from .grants import Grant as GrantRecord
    from .model import Attempt as AttemptRecord
    from .model import Event as EventRecord
    from .model import Intent as IntentRecord
    from .outbox import Behind as BehindRecord
    from .portal import PortalLink as PortalLinkRecord
    from .tokens import TokenInfo

#: The most items (intents, events) one batch may carry.
MAX_BATCH = 500
#: Where an intent's status is settled: a long poll need not ask again.
SETTLED_STATUSES = frozenset(status.value for status in SETTLED)

# -- what the API takes --------------------------------------------------------------------


class IntentIn(BaseModel):
    """An intent as a producer sends it."""

    model_config = ConfigDict(extra="forbid")

    action_id: ActionId | None = Field(
        default=None, description="your operation id; generated (UUIDv7) when omitted"
    )
    scope: Scope = Field(description="tenant/account on whose authority the effect is made")
    destination: DestinationName = Field(description="id of a registered destination")
    payload: JsonValue = Field(description="the JSON the destination receives")
    not_before: Timestamp | None = Field(default=None, description="not sent before this")
    expires_at: Timestamp | None = Field(default=None, description="dead-lettered if not sent by this")
    max_attempts: StrictInt | None = Field(default=None, ge=1, le=1000)
    ordering_key: OrderingKey | None = Field(
        default=None, description="intents of a destination with ordering 'key' and the same ordering_key are "
                                  "delivered one at a time, in enqueue order (a Kafka record's key)")
    # (no rule: a malformed traceparent is ignored, never refused)
    traceparent: str | None = Field(default=None, description=(
        "the producer's W3C trace context for this intent (a batch item's own); otherwise the request's "
        "traceparent header is taken; a malformed one is ignored"))
    tracestate: str | None = Field(default=None, description=(
        "the W3C tracestate that goes with traceparent; a malformed one is dropped (the traceparent still counts)"))


class Batch(BaseModel):
    """A batch route's body: 1 to MAX_BATCH items, each read and decided alone as the single route
    reads one. Every route whose body is a Batch has the same limits (``routes.bodies``: up to
    ``max_batch_bytes`` as a whole, each item's payload held to the single route's limits)."""

    model_config = ConfigDict(extra="forbid")


class BatchIn(Batch):
    """Intents to enqueue together: each is decided on its own, all in one durable commit."""

    # each item is checked as IntentIn on its own, so that one bad item is its own answer
    intents: Annotated[list[Any], WithJsonSchema({
        "type": "array", "items": {"$ref": "#/components/schemas/IntentIn"}, "minItems": 1, "maxItems": MAX_BATCH,
    })] = Field(min_length=1, max_length=MAX_BATCH)




class EventIn(BaseModel):
    """An event as a producer publishes it: one intent per subscribed destination."""

    model_config = ConfigDict(extra="forbid")

    event_id: EventId | None = Field(default=None, description="your event's id; generated (UUIDv7) when omitted")
    scope: Scope = Field(description="tenant/account on whose authority the effects are made")
    topic: Topic = Field(description="what happened, as dot-separated segments (invoice.paid)")
    payload: JsonValue = Field(description="the JSON every subscribed destination receives")
    not_before: Timestamp | None = Field(default=None, description="not sent before this")
    expires_at: Timestamp | None = Field(default=None, description="dead-lettered if not sent by this")
    max_attempts: StrictInt | None = Field(default=None, ge=1, le=1000)
    ordering_key: OrderingKey | None = Field(default=None, description="each intent's ordering_key")


class EventBatchIn(Batch):
    """Events to publish together: each is decided on its own, all in one durable commit."""

    # each item is checked as EventIn on its own, so that one bad item is its own answer
    events: Annotated[list[Any], WithJsonSchema({
        "type": "array", "items": {"$ref": "#/components/schemas/EventIn"}, "minItems": 1, "maxItems": MAX_BATCH,
    })] = Field(min_length=1, max_length=MAX_BATCH)


class DeliverIn(BaseModel):
    """An operator's delivery of an existing event to one destination (subscribed or not)."""

    model_config = ConfigDict(extra="forbid")
    destination: DestinationName
    reason: str | None = Field(default=None, min_length=1, max_length=1000)


class ReasonIn(BaseModel):
    """Why an operator acts (recorded with the action)."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=1000)


class ReplayIn(ReasonIn):
    """A replay; duplicates must be accepted explicitly where the destination does not dedupe."""

    accept_duplicate_risk: StrictBool = False


class ResolveIn(ReasonIn):
    """An unknown intent's resolution, with the operator's evidence."""

    resolution: Resolution
    external_id: str | None = Field(default=None, max_length=255)




class ApproveIn(ReasonIn):
    """An approval of the exact payload digest the operator looked at."""

    payload_digest: str
    valid_seconds: StrictFloat = Field(default=3600, gt=0, le=MAX_APPROVAL_SECONDS)


class ReplayFilter(BaseModel):
    """Which intents a bulk replay takes (dead, revoked and unknown when no status is named)."""

    model_config = ConfigDict(extra="forbid")
    status: list[Status] | None = None
    scope: list[Scope] | None = None
    destination: DestinationName | None = None
    channel: str | None = Field(default=None, description="an installed channel's name")
    created_after: Timestamp | None = None
    created_before: Timestamp | None = None


class BulkReplayIn(ReplayIn):
    """A bulk replay."""

    filter: ReplayFilter = Field(default_factory=ReplayFilter)
    dry_run: StrictBool = True


# -- what the API answers ------------------------------------------------------------------


class TraceContext(BaseModel):
    """The W3C Trace Context an intent keeps (``outbox.tracing``)."""

    traceparent: str
    tracestate: str | None = None


class Intent(BaseModel):
    """An intent as the API shows it."""

    action_id: str
    scope: str
    idempotency_key: str = Field(description="what receivers deduplicate on: scope/action_id")
    destination: str
    channel: str
    ordering_key: str | None = Field(description="what the intent is ordered by at its destination, if anything")
    status: Status
    payload: JsonValue = Field(description="the JSON the destination receives")
    payload_digest: str = Field(description="sha256: over the RFC 8785 canonical payload")
    attempt_count: int
    max_attempts: int
    next_attempt_at: AwareDatetime | None
    not_before: AwareDatetime | None
    expires_at: AwareDatetime | None
    lease_owner: str | None
    lease_expires_at: AwareDatetime | None
    fence: int
    created_at: AwareDatetime
    updated_at: AwareDatetime
    last_error: str | None
    unreadable: str | None = Field(description=(
        "null, unless some of its stored times are beyond what can be read (years 1 to 9999 UTC; a row written "
        "by hand): which, each shown as the nearest time that can be read; the sender sets it aside, dead"))
    event_id: str | None = Field(default=None, description="the event (in its scope) this intent delivers, if any")
    trace: TraceContext | None = Field(default=None, description=(
        "the W3C trace context of the intent's create span (a child of the producer's), the parent of every "
        "attempt's span; null when there is none"))


class BatchIntent(Intent):
    """An intent as a batch answers it: all but the payload, which the caller sent (its digest
    is here)."""

    payload: SkipJsonSchema[JsonValue] = Field(default=None, exclude=True)


class Attempt(BaseModel):
    """One try at submitting an intent, with what the sender could establish."""

    attempt_id: str
    number: int
    fence: int
    worker: str
    started_at: AwareDatetime
    finished_at: AwareDatetime | None
    submission: Submission | None = Field(description="null while the attempt is in flight")
    outcome: Outcome | None = Field(description="null while the attempt is in flight")
    status_code: int | None
    reply: str | None
    external_id: str | None
    error: str | None
    duration_ms: float | None
    stage: str | None = Field(description="how far the attempt got, for channels with stages (email: connect, "
                                          "tls, ehlo, auth, mail, rcpt, data, message, done)")


class Event(BaseModel):
    """One entry of an intent's append-only history."""

    kind: str
    at: AwareDatetime
    actor: str
    reason: str | None
    data: dict[str, JsonValue]


class IntentHistory(Intent):
    """An intent with its attempts and events, as an operator's action left it."""

    attempts: list[Attempt]
    events: list[Event]


class WaitingBehind(BaseModel):
    """The earliest intent of the same destination and ordering key in the way of a pending intent
    (the destination delivers each key in enqueue order); its fields are null when it is in a scope
    the token cannot read."""

    action_id: str | None
    scope: str | None
    status: Status | None


class IntentDetail(Intent):
    """An intent with its attempts and events."""

    settled: bool = Field(
        description="delivered, dead, revoked, unknown or cancelled: a long poll need not ask again")
    waiting_behind: WaitingBehind | None = Field(
        description="what a pending intent of an ordered destination waits for; null when it waits for nothing")
    attempts: list[Attempt]
    events: list[Event]


class IntentPage(BaseModel):
    """A page of intents, newest first."""

    items: list[Intent]
    next_cursor: str | None = Field(description="pass back as `cursor` for the next page; null on the last")


class Destination(BaseModel):
    """A destination as the API shows it: everything but its secrets, the channel's own
    settings (a webhook's ``url``) beside the shared fields."""

    model_config = ConfigDict(extra="allow")

    id: str
    channel: str
    signing_secrets: int = Field(description=(
        "how many signing secrets it has (whsec_, for a rotation several; an SMTP or SASL password is not one), "
        "never the secrets"))
    idempotent: bool
    retention_seconds: int
    on_unknown: OnUnknown
    timeout_seconds: float
    requires_approval: bool
    allow_private_network: bool
    disabled: bool
    reconcile: bool
    ordering: Ordering
    ordering_on_dead: OnDead
    retry_schedule: list[int | float] | None = Field(
        description="seconds before retry 1, 2, ...; null: exponential backoff")
    max_age_seconds: int | None = Field(
        description="how long after its enqueue an intent may be attempted; null: no limit")
    created_at: AwareDatetime
    updated_at: AwareDatetime
    subscriptions: list[Subscription] = Field(description="the topics whose events it receives")
    rate_limit: RateLimit | None
    max_in_flight: int | None
    paused_until: AwareDatetime | None = Field(
        description="until when a receiver's 429 or 503 with Retry-After paused sending to it (null: not paused)")
    unusable: str | None = Field(default=None, description=(
        "null, unless some of its stored settings are ones the API refuses (a row written by hand, or kept from a "
        "release that took them): which, each shown as the nearest value it takes; the sender sends it nothing "
        "(its intents wait, pending) until it is put again"))
    owner: str | None = Field(default=None, description=(
        "the one scope whose intents and events reach it, which manages it (a tenant's own destination); "
        "null: shared, reached by grants"))
    previous_secrets_until: AwareDatetime | None = Field(default=None, description=(
        "until when the secrets before the newest still sign beside it (a rotation's window); null: no window"))


class DestinationList(BaseModel):
    """Every destination."""

    items: list[Destination]


class NewSecretDestination(Destination):
    """A destination with the signing secret the outbox just made for it: shown in this answer only."""

    secret: str | None = Field(description="the new whsec_ secret (null when the request gave its own); keep it")


class RotateIn(BaseModel):
    """A rotation of a destination's signing secret."""

    model_config = ConfigDict(extra="forbid")
    window_seconds: StrictInt | StrictFloat | None = Field(
        default=None, ge=0, le=MAX_ROTATION_SECONDS,
        description="how long the previous secret still signs beside the new one (default: the setting "
                    "secret_rotation_seconds, 24 h)")


class TestIn(BaseModel):
    """A test delivery to a tenant's own endpoint."""

    model_config = ConfigDict(extra="forbid")
    payload: JsonValue | None = Field(
        default=None, description="what to send (default: {\"type\": \"outbox.test\", ...} naming the test)")


class PortalLinkIn(BaseModel):
    """A portal link to mint for one of the scope's users."""

    model_config = ConfigDict(extra="forbid")
    session_seconds: StrictInt | StrictFloat | None = Field(
        default=None, ge=60, le=7 * 86_400,
        description="how long the session it opens lasts (default and most: the setting portal_session_seconds)")
    read_only: StrictBool = Field(default=False, description="a session that may look but change nothing")


class MintedPortalLink(BaseModel):
    """A minted portal link: open ``url`` once, before ``expires_at``, in the user's browser."""

    scope: str
    url: str = Field(description="the portal's address with the link's token, shown here only (relative to this "
                                 "service: prefix its public origin)")
    expires_at: AwareDatetime = Field(description="the link opens until then")
    session_seconds: int = Field(description="how long the session it opens lasts")
    read_only: bool


def minted_portal_link_json(link_token: str, link: PortalLinkRecord) -> dict[str, Any]:
    """A link just minted as the API and CLI show it: the only time its URL is shown."""
    return MintedPortalLink(scope=link.scope, url=link_path(link_token), expires_at=link.expires_at,
                            session_seconds=link.session_seconds, read_only=link.read_only).model_dump(mode="json")


class TenantAccount(BaseModel):
    """What a tenant token acts as, and what it may have."""

    scope: str = Field(description="the one scope the token acts in")
    channels: list[str] = Field(description="the channels its destinations may use")
    max_destinations: int
    max_subscriptions: int = Field(description="the most subscriptions its destinations hold in all")
    private_network: bool = Field(description="whether its destinations may reach private addresses")
    destinations: int = Field(description="how many destinations it owns now")


class Grant(BaseModel):
    """A grant: scope may have effects made at destination ('*': any) until expires_at."""

    id: str
    scope: str
    destination: str
    revision: int
    expires_at: AwareDatetime | None
    note: str | None
    created_at: AwareDatetime
    updated_at: AwareDatetime


class GrantList(BaseModel):
    """Every grant."""

    items: list[Grant]


class Token(BaseModel):
    """An API token as the API shows it: never its text, which only its creator saw."""

    id: str = Field(description="the token's public id (its text starts obx_<id>_)")
    role: Role
    scopes: list[str] = Field(description="a producer's scopes ('*': all); empty for operators and admins")
    label: str | None
    created_at: AwareDatetime
    revoked_at: AwareDatetime | None


class NewToken(Token):
    """A new token, with its text: shown in this answer only (only its hash is stored)."""

    token: str = Field(description="the bearer token; keep it secret")


class TokenList(BaseModel):
    """Every token, active and revoked."""

    items: list[Token]


class BulkReplayResult(BaseModel):
    """What a bulk replay matched and did."""

    dry_run: bool
    matched: int
    action_ids: list[str] = Field(description="the intents matched")
    replayed: int
    refused: dict[str, str] = Field(description="action_id: why it was not replayed")


class Delivery(BaseModel):
    """One destination's part of an event's fan-out: its intent (read it at
    /v1/intents/{action_id}), or why the event made none."""

    destination: str
    action_id: str = Field(description="evt~<event_id>~<destination>")
    status: Status | None = Field(description="the intent's current status; null when skipped")
    skipped: str | None = Field(description="why no intent was made (its channel refuses the payload); else null")


class PublishedEvent(BaseModel):
    """An event and its fan-out, by destination."""

    event_id: str
    scope: str
    topic: str
    payload: JsonValue
    payload_digest: str
    ordering_key: str | None
    created_at: AwareDatetime
    fanout: list[Delivery]


class BatchEvent(PublishedEvent):
    """An event as a batch answers it: all but the payload, which the caller sent."""

    payload: SkipJsonSchema[JsonValue] = Field(default=None, exclude=True)


class EventPage(BaseModel):
    """A page of events, newest first."""

    items: list[PublishedEvent]
    next_cursor: str | None = Field(description="pass back as `cursor` for the next page; null on the last")


class Health(BaseModel):
    """The process is up (degraded: its sender is waiting for the database, or set intents aside
    whose stored times cannot be read)."""

    status: Literal["ok", "degraded"]
    detail: str | None = Field(default=None, description="what the sender waits for, or set aside, when degraded")


class Ready(BaseModel):
    """The store answers."""

    status: Literal["ready"]


class FieldError(BaseModel):
    """One reason an input was refused."""

    field: str = Field(description="dotted path of the field; empty for the body as a whole")
    message: str


class Problem(BaseModel):
    """An RFC 9457 problem: every error is one, as application/problem+json."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(pattern=f"^{re.escape(PROBLEM_TYPE_PREFIX)}[a-z0-9-]+$",
                      description="what went wrong; the kinds are listed in the README's Errors table",
                      examples=[PROBLEM_TYPE_PREFIX + "unknown-destination"])
    title: str
    status: int = Field(ge=400, le=599)
    detail: str = Field(description="what to change")
    instance: str = Field(default="", description="the path that was asked for")
    errors: list[FieldError] = Field(default_factory=list, description="invalid-input: each refused field")


class BatchItem(BaseModel):
    """One intent's answer in a batch, in the request's order: ``status`` is what POST
    /v1/intents would have answered for it alone (201 created, 200 the same intent already
    existed, 403, 409, 413, 422), with the intent or the problem."""

    status: int
    intent: BatchIntent | None = Field(default=None, description="when status is 200 or 201")
    problem: Problem | None = Field(default=None, description="otherwise: the problem+json a single enqueue answers")


class BatchResult(BaseModel):
    """Every intent's answer, in the request's order (the batch was one durable commit)."""

    results: list[BatchItem]


class EventBatchItem(BaseModel):
    """One event's answer in a batch, in the request's order: ``status`` is what POST /v1/events
    would have answered for it alone (201, 200, 403, 409, 413, 422), with the event or the problem."""

    status: int
    event: BatchEvent | None = Field(default=None, description="when status is 200 or 201")
    problem: Problem | None = Field(default=None, description="otherwise: the problem+json a single publish answers")


class EventBatchResult(BaseModel):
    """Every event's answer, in the request's order (the batch was one durable commit)."""

    results: list[EventBatchItem]


# -- the outbox's records as answers -------------------------------------------------------


class HasHistory(Protocol):
    """An intent's attempts and events (the store's ``History``)."""

    @property
    def attempts(self) -> Sequence[AttemptRecord]: ...
    @property
    def events(self) -> Sequence[EventRecord]: ...


def intent_json(intent: IntentRecord, *, payload: bool = True) -> dict[str, Any]:
    """An intent as the API and CLI show it (without its ``payload`` where the caller has it:
    a batch's answers): ``Intent``'s fields, built as a plain dict, since every enqueue, batch
    and page answers with it (a model dumped costs about five times as much)."""
    return {
        "action_id": intent.action_id, "scope": intent.scope, "idempotency_key": intent.key,
        "destination": intent.destination, "channel": intent.channel, "ordering_key": intent.ordering_key,
        "status": intent.status.value, **({"payload": intent.payload} if payload else {}),
        "payload_digest": intent.payload_digest, "attempt_count": intent.attempts,
        "max_attempts": intent.max_attempts, "next_attempt_at": iso(intent.next_attempt_at),
        "not_before": iso(intent.not_before), "expires_at": iso(intent.expires_at),
        "lease_owner": intent.lease_owner, "lease_expires_at": iso(intent.lease_expires_at), "fence": intent.fence,
        "created_at": iso(intent.created_at), "updated_at": iso(intent.updated_at),
        "last_error": intent.last_error, "unreadable": intent.unreadable, "event_id": intent.event_id,
        "trace": tracing.stored_fields(intent.trace_context) or None,
    }


def history_json(history: HasHistory) -> dict[str, Any]:
    """An intent's attempts and events as the API and CLI show them (``Attempt``'s and
    ``Event``'s fields, as plain dicts, as ``intent_json``)."""
    return {
        "attempts": [{
            "attempt_id": a.attempt_id, "number": a.number, "fence": a.fence, "worker": a.worker,
            "started_at": iso(a.started_at), "finished_at": iso(a.finished_at),
            "submission": a.submission.value if a.submission else None,
            "outcome": a.outcome.value if a.outcome else None, "status_code": a.status_code, "reply": a.reply,
            "external_id": a.external_id, "error": a.error, "duration_ms": a.duration_ms, "stage": a.stage,
        } for a in history.attempts],
        "events": [{"kind": e.kind.value, "at": iso(e.at), "actor": e.actor, "reason": e.reason, "data": dict(e.data)}
                   for e in history.events],
    }


def waiting_behind_json(behind: BehindRecord) -> dict[str, Any]:
    """What a pending intent waits behind, as the API and CLI show it."""
    return WaitingBehind.model_construct(action_id=behind.action_id, scope=behind.scope,
                                         status=behind.status).model_dump(mode="json")


def destination_json(destination: DestinationRecord) -> dict[str, Any]:
    """A destination as the API and CLI show it: everything but the secrets, with the number of
    them that sign, as its channel tells (an SMTP or SASL password is a secret that does not)."""
    d = destination
    return Destination.model_construct(
        id=d.id, channel=d.channel, signing_secrets=len(signing_secrets(d)), idempotent=d.idempotent,
        retention_seconds=d.retention_seconds, on_unknown=d.on_unknown, timeout_seconds=d.timeout_seconds,
        requires_approval=d.requires_approval, allow_private_network=d.allow_private_network, disabled=d.disabled,
        reconcile=d.reconcile, ordering=d.ordering, ordering_on_dead=d.ordering_on_dead,
        retry_schedule=None if d.retry_schedule is None else list(d.retry_schedule), max_age_seconds=d.max_age_seconds,
        created_at=d.created_at, updated_at=d.updated_at, rate_limit=d.rate_limit, max_in_flight=d.max_in_flight,
        paused_until=d.paused_until, unusable=d.unusable, owner=d.owner,
        previous_secrets_until=d.previous_secrets_until if len(d.secrets) > 1 else None,
        subscriptions=[Subscription.model_construct(**s.json()) for s in d.subscriptions], **d.settings,
    ).model_dump(mode="json")


def event_json(event: StoredEvent, *, payload: bool = True) -> dict[str, Any]:
    """An event with its fan-out as the API and CLI show it (without its ``payload`` where the
    caller has it: a batch's answers)."""
    e = event
    return {
        "event_id": e.event_id, "scope": e.scope, "topic": e.topic,
        **({"payload": json_loads(e.payload_json)} if payload else {}),
        "payload_digest": e.payload_digest, "ordering_key": e.ordering_key, "created_at": iso(e.created_at),
        "fanout": [{"destination": d.destination, "action_id": d.action_id,
                    "status": d.status.value if d.status else None, "skipped": d.skipped} for d in e.fanout],
    }


def grant_json(grant: GrantRecord) -> dict[str, Any]:
    """A grant as the API and CLI show it."""
    g = grant
    return Grant.model_construct(id=g.id, scope=g.scope, destination=g.destination, revision=g.revision,
                                 expires_at=g.expires_at, note=g.note, created_at=g.created_at,
                                 updated_at=g.updated_at).model_dump(mode="json")


def token_json(token: TokenInfo) -> dict[str, Any]:
    """A token as the API and CLI show it (its text is never stored, so never shown)."""
    return Token.model_construct(id=token.id, role=token.role, scopes=list(token.scopes), label=token.label,
                                 created_at=token.created_at, revoked_at=token.revoked_at).model_dump(mode="json")
