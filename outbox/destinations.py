"""The destination registry's record: where a channel delivers, and what the receiver declares.

Producers name a destination by id, never a raw URL, so the registry is the one place that
decides where effects may go and holds the secrets to sign them. The fields here are the ones
every channel shares; a channel's own settings (a webhook's URL, a mail server's host) are its
spec's (``outbox.channels``), kept with the record as ``settings``.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, TypeAdapter, ValidationError

from .fields import MAX_ROTATION_SECONDS, Subscriptions
from .flow import MAX_COUNT, MAX_PER_SECOND, MIN_PER_SECOND, RateLimit, usable_cap, usable_rate
from .model import Intent, OnDead, OnUnknown, Ordering
from .timestamps import later
from .topics import MAX_SUBSCRIPTIONS, Subscription


@dataclass(frozen=True, slots=True)
class Destination:
    """A registered destination. ``secrets`` (newest first) is never serialized by the API or
    logged; ``settings`` are the channel's own, as its spec validated them."""

    id: str
    channel: str
    settings: Mapping[str, Any]
    secrets: tuple[str, ...]
    idempotent: bool
    retention_seconds: int
    on_unknown: OnUnknown
    timeout_seconds: float
    requires_approval: bool
    allow_private_network: bool
    disabled: bool
    created_at: datetime
    updated_at: datetime
    reconcile: bool = False
    ordering: Ordering = Ordering.NONE
    ordering_on_dead: OnDead = OnDead.BLOCK
    #: The delays in seconds before retry 1, 2, ... (exhausted: dead); None: exponential backoff.
    retry_schedule: tuple[float, ...] | None = None
    #: How long after its enqueue an intent may still be attempted; None: no limit.
    max_age_seconds: int | None = None
    #: The topics it receives events of (``outbox.topics``), for which scopes.
    subscriptions: tuple[Subscription, ...] = ()
    rate_limit: RateLimit | None = None
    max_in_flight: int | None = None
    #: Until when a receiver asked for a pause (429/503 with Retry-After): no claim sends to it.
    paused_until: datetime | None = None
    #: Which stored settings are not ones the API takes (a row written by hand, or kept from a
    #: release that took them), each read as the nearest it takes (``Stored``); None for every
    #: other destination. The sender sends nothing to it while this is set.
    unusable: str | None = None
    #: The one scope whose intents and events may reach it, which manages it (a tenant's own
    #: endpoint); None: shared, registered by an admin and reached by grants.
    owner: str | None = None
    #: Until when the secrets after the newest still sign (a rotation's window); None: until
    #: ``drop_previous_secrets`` ends the rotation.
    previous_secrets_until: datetime | None = None

    def live_secrets(self, now: datetime) -> tuple[str, ...]:
        """The secrets that sign at ``now``: the previous ones only while a rotation's window lasts."""
        if self.previous_secrets_until is not None and now >= self.previous_secrets_until:
            return self.secrets[:1]
        return self.secrets

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"Destination(id={self.id!r}, channel={self.channel!r}, settings={dict(self.settings)!r})"


#: A receiver's retention of keys: at least a minute, at most 90 days.
MIN_RETENTION_SECONDS = 60
MAX_RETENTION_SECONDS = 90 * 86_400
DEFAULT_RETENTION_SECONDS = 86_400
#: A request's timeout: above 0, at most five minutes.
MAX_TIMEOUT_SECONDS = 300.0
DEFAULT_TIMEOUT_SECONDS = 10.0
#: A retry schedule's longest delay: the default backoff cap, an hour.
MAX_RETRY_DELAY_SECONDS = 3600
#: A retry schedule's most delays.
MAX_RETRY_SCHEDULE = 100
#: The longest max age: a receiver's longest retention, 90 days.
MAX_AGE_SECONDS = 90 * 86_400

RetryDelay = Annotated[StrictInt | StrictFloat, Field(gt=0, le=MAX_RETRY_DELAY_SECONDS)]


class DestinationSpec(BaseModel):
    """What an admin sends to register or replace a destination: the fields every channel
    shares. The channel's own settings ride along as further fields; registering checks them
    with the channel's spec, a subclass of this one that forbids anything else."""

    model_config = ConfigDict(extra="allow")

    channel: str = Field(default="webhook", description="how it is delivered: an installed channel's name")
    secret: str | None = Field(
        default=None,
        description="write-only credential in the channel's form (a webhook's whsec_ signing secret). "
                    "Omitted on update: the current one stays.",
    )
    rotation_window_seconds: StrictInt | StrictFloat | None = Field(
        default=None, ge=0, le=MAX_ROTATION_SECONDS,
        description="with a new secret, how long the previous ones still sign beside it, then the new one alone "
                    "(default: the setting secret_rotation_seconds, 24 h); for channels that sign with every secret",
    )
    drop_previous_secrets: StrictBool = Field(
        default=False,
        description="keep only the newest secret: the end of a rotation, once the receiver has the new one",
    )
    idempotent: StrictBool = Field(
        default=False, description="the receiver deduplicates on Idempotency-Key"
    )
    retention_seconds: StrictInt = Field(
        default=DEFAULT_RETENTION_SECONDS, ge=MIN_RETENTION_SECONDS, le=MAX_RETENTION_SECONDS,
        description="how long the receiver keeps keys"
    )
    on_unknown: OnUnknown = OnUnknown.DECLARED
    timeout_seconds: StrictFloat = Field(default=DEFAULT_TIMEOUT_SECONDS, gt=0, le=MAX_TIMEOUT_SECONDS)
    requires_approval: StrictBool = False
    allow_private_network: StrictBool = Field(
        default=False, description="allow loopback and private addresses (off: SSRF guard)"
    )
    disabled: StrictBool = False
    reconcile: StrictBool = Field(
        default=False,
        description="the receiver answers the reconcile probe (the receivers' idempotency middleware)",
    )
    ordering: Ordering = Field(
        default=Ordering.NONE,
        description="key: intents with the same ordering_key are delivered one at a time, in enqueue order",
    )
    ordering_on_dead: OnDead = Field(
        default=OnDead.BLOCK,
        description="under ordering, a dead or revoked intent blocks its key until an operator replays or "
                    "cancels it (block), or the key goes on without it (skip)",
    )
    subscriptions: Subscriptions = Field(
        default_factory=list,
        description="topics whose events it receives: [{\"topic\": \"invoice.*\", \"scopes\": [\"acme\"]}] "
                    "(scopes omitted: every scope that holds a grant for it)",
    )

    retry_schedule: list[RetryDelay] | None = Field(
        default=None, min_length=1, max_length=MAX_RETRY_SCHEDULE,
        description="seconds to wait before retry 1, 2, ... (exact, no jitter; a Retry-After may lengthen one); "
                    "once every delay is used the intent is dead. Null: exponential backoff with jitter",
    )
    max_age_seconds: StrictInt | None = Field(
        default=None, ge=1, le=MAX_AGE_SECONDS,
        description="an intent not delivered this long after it was enqueued is dead instead of attempted "
                    "again; judged from the current value, so a change applies to intents already queued",
    )
    rate_limit: RateLimit | None = Field(
        default=None,
        description="sends per second, with a burst (a token bucket), across every worker; null: unlimited",
    )
    max_in_flight: StrictInt | None = Field(
        default=None, ge=1, le=MAX_COUNT,
        description="intents leased at once (from the claim to the outcome), across every worker; null: unlimited",
    )

    def subscribed(self) -> tuple[Subscription, ...]:
        """The subscriptions as the record keeps them."""
        return tuple(Subscription(s.topic, None if s.scopes is None else tuple(dict.fromkeys(s.scopes)))
                     for s in self.subscriptions)

    def settings(self) -> dict[str, Any]:
        """The channel's own settings: every field but the shared ones, as JSON values."""
        return self.model_dump(mode="json", by_alias=True, exclude=set(DestinationSpec.model_fields))


@dataclass(frozen=True, slots=True)
class Deadline:
    """When an intent stops being attempted, and what set that time."""

    at: datetime
    why: str  # "its expires_at (...)", or the destination's max age


def deadline(intent: Intent, destination: Destination) -> Deadline | None:
    """The time from which ``intent`` gets no attempt: its own ``expires_at`` or its enqueue plus
    the destination's ``max_age_seconds``, whichever is first; None when neither is set.

    The age is measured from the destination's current value, not one stored at enqueue, so a
    changed ``max_age_seconds`` holds alike for intents queued before and after the change."""
    found = []
    if intent.expires_at is not None:
        found.append(Deadline(intent.expires_at, f"its expires_at ({intent.expires_at.isoformat()})"))
    if destination.max_age_seconds is not None:
        at = later(intent.created_at, destination.max_age_seconds)
        found.append(Deadline(at, f"the destination's max age of {destination.max_age_seconds}s ({at.isoformat()})"))
    return min(found, key=lambda d: d.at, default=None)


E = TypeVar("E", bound=enum.Enum)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: object) -> float:
    return float(value) if _is_number(value) else math.nan  # type: ignore[arg-type]


def _shown(value: Any) -> str:
    """A value as a note shows it: an enum's by its value, anything else as Python writes it, at
    most 80 characters (a stored number can have hundreds of digits)."""
    text = repr(value.value if isinstance(value, enum.Enum) else value)
    return text if len(text) <= 80 else text[:79] + "…"


class Stored:
    """Reads a destination's stored settings as the sender can use them. A value the API would
    refuse (written into the database by hand, or kept from a release that took it: a rate of
    1e-12) is read as the nearest one it takes, or as its default where there is none, and noted
    (``unusable``), so the sender holds that destination's intents and says why, instead of
    failing a computation for every destination."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def _noted(self, field: str, stored: Any, takes: str, read: Any) -> Any:
        self.notes.append(f"{field} {_shown(stored)} (it takes {takes}; read as {_shown(read)})")
        return read

    def whole(self, field: str, stored: Any, low: int, high: int, default: int | None) -> Any:
        """A whole number from ``low`` to ``high``; None stays None where ``default`` is None."""
        if stored is None and default is None:
            return None
        if isinstance(stored, int) and not isinstance(stored, bool) and low <= stored <= high:
            return stored
        number = _number(stored)
        read = default if math.isnan(number) else int(min(max(number, low), high))
        return self._noted(field, stored, f"a whole number from {low} to {high}", read)

    def seconds(self, field: str, stored: Any, high: float, default: float) -> float:
        """A number above 0, at most ``high``."""
        if _is_number(stored) and 0 < stored <= high:
            return float(stored)
        return self._noted(field, stored, f"a number above 0, at most {high:g}",
                           high if _number(stored) > high else default)

    def choice(self, field: str, stored: Any, kind: type[E], default: E) -> E:
        """One of ``kind``'s values."""
        try:
            return kind(stored)
        except ValueError:
            return self._noted(field, stored, "one of " + ", ".join(str(k.value) for k in kind), default)

    def schedule(self, stored: str | None) -> tuple[float, ...] | None:
        """A retry schedule (stored as JSON text): 1 to MAX_RETRY_SCHEDULE delays, each above 0
        and at most MAX_RETRY_DELAY_SECONDS; anything else is read as none (the backoff)."""
        if stored is None:
            return None
        try:
            delays = json.loads(stored)
        except ValueError:
            delays = stored
        if (isinstance(delays, list) and 1 <= len(delays) <= MAX_RETRY_SCHEDULE
                and all(_is_number(d) and 0 < d <= MAX_RETRY_DELAY_SECONDS for d in delays)):
            return tuple(delays)
        return self._noted("retry_schedule", delays, f"1 to {MAX_RETRY_SCHEDULE} delays, each above 0 and "
                           f"at most {MAX_RETRY_DELAY_SECONDS}", None)

    def subscriptions(self, stored: str) -> tuple[Subscription, ...]:
        """The subscriptions (stored as JSON text), as the API takes them; anything else is read
        as none."""
        try:
            found = json.loads(stored)
        except ValueError:
            found = stored
        try:
            taken = _SUBSCRIPTIONS.validate_python(found)
        except ValidationError:
            return tuple(self._noted("subscriptions", found, f"at most {MAX_SUBSCRIPTIONS} subscriptions, each a "
                                     "topic pattern and its scopes", []))
        return tuple(Subscription(s.topic, None if s.scopes is None else tuple(s.scopes)) for s in taken)

    def rate(self, per_second: Any, burst: Any) -> RateLimit | None:
        """A rate limit (None: unlimited), as the claim computes with it (``flow.usable_rate``)."""
        if per_second is None:
            return None
        read = usable_rate(per_second, burst)
        if read.per_second != per_second or read.burst != burst:  # (NaN is never equal)
            slowest = f"{MIN_PER_SECOND:f}".rstrip("0")  # (0.00001, as the API's refusal writes it)
            self._noted("rate_limit", {"per_second": per_second, "burst": burst},
                        f"per_second from {slowest} to {MAX_PER_SECOND}, burst from 1 to {MAX_COUNT}",
                        {"per_second": read.per_second, "burst": read.burst})
        return read

    def cap(self, stored: Any) -> int | None:
        """A ``max_in_flight`` (None: unlimited), as the claim computes with it (``flow.usable_cap``)."""
        read = usable_cap(stored)
        return read if read == stored else self._noted("max_in_flight", stored, f"1 to {MAX_COUNT}", read)

    def settings(self, stored: str) -> dict[str, Any]:
        """The channel's own settings: a JSON object."""
        try:
            settings = json.loads(stored)
        except ValueError:
            settings = stored
        return settings if isinstance(settings, dict) else self._noted("settings", settings, "a JSON object", {})

    def unusable(self) -> str | None:
        """What ``Destination.unusable`` says, or None when every setting was read as stored."""
        if not self.notes:
            return None
        return (f"stored settings the outbox does not take: {'; '.join(self.notes)}; nothing is sent to it "
                "until it is put again with settings it takes")


_SUBSCRIPTIONS: TypeAdapter[Subscriptions] = TypeAdapter(Subscriptions)

#: The most secrets a destination keeps of one kind: the newest and two older ones, for a rotation.
KEPT_SECRETS = 3


def rotate_secrets(held: tuple[str, ...], spec: DestinationSpec) -> tuple[str, ...]:
    """The secrets a destination holds once ``spec`` replaces it (it held ``held``, newest first):
    a new secret goes first, the previous ones stay for a rotation until ``drop_previous_secrets``
    ends it, and without a secret the held ones stay."""
    secrets = held
    if spec.secret is not None and spec.secret not in secrets[:1]:
        secrets = (spec.secret, *(s for s in secrets if s != spec.secret))[:KEPT_SECRETS]
    if spec.drop_previous_secrets:
        secrets = secrets[:1]
    return secrets
