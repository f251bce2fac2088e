"""The store protocol: what the outbox needs from a database, whatever the dialect.

What the outbox's rules decide (an intent's first status, the enqueue conflict, which moves a
change may make and what each writes, which migrations run) is decided once, in
``outbox.model``, ``rules.py``, ``moves.py`` and ``migrator.py``; a dialect holds its SQL (one
named block per move) and connection handling only. Every backend passes the conformance suite
in ``tests/conformance`` (its factory listed in ``backends.STORE_FACTORIES``); a new backend is
proven by those same tests, not by its own.

Two capabilities are a store's to offer or not, each its own protocol (as River's drivers
declare ``SupportsListener``): ``SupportsListener``, a store that hears of intents made due by
other processes, and ``SharesClock``, a store shared by hosts whose clock they all judge leases
by. ``Outbox.open`` asks ``isinstance`` of each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from ..destinations import Destination
from ..errors import OutboxError
from ..events import EventPage, EventQuery, NewEvent, Published, StoredEvent
from ..flow import Held
from ..grants import Grant, GrantSpec
from ..keyring import Keyring
from ..model import Attempt, Change, Enqueued, Event, Intent, NewIntent, Status
from ..portal import PortalLink, PortalSession
from ..tenants import TenantLimits
from ..tokens import ConsoleSession, TokenInfo


@dataclass(frozen=True, slots=True)
class IntentQuery:
    """Filters for listing intents; every field narrows, ``None`` means any."""

    statuses: Sequence[Status] | None = None
    scopes: Sequence[str] | None = None
    destination: str | None = None
    channel: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    before_seq: int | None = None  # the cursor: only intents older than this one
    limit: int = 50

    def filters(self) -> list[tuple[str, str, Any]]:
        """The narrowing filters as ``(column, operator, value)``, in the order every dialect
        writes them; the operator ``in`` takes a list (empty: nothing matches), the others
        (``=``, ``>=``, ``<``) one value."""
        found: list[tuple[str, str, Any]] = []
        if self.statuses:
            found.append(("status", "in", [s.value for s in self.statuses]))
        if self.scopes is not None:  # none at all matches nothing
            found.append(("scope", "in", list(self.scopes)))
        for column, operator, value in (
            ("destination", "=", self.destination),
            ("channel", "=", self.channel),
            ("created_at", ">=", self.created_after),
            ("created_at", "<", self.created_before),
            ("seq", "<", self.before_seq),
        ):
            if value is not None:
                found.append((column, operator, value))
        return found

    def page(self, intents: list[Intent]) -> Page:
        """The page of ``intents`` read for this query: up to ``limit + 1``, newest first, the
        one past the limit only telling that more follow."""
        shown = intents[: self.limit]
        more = len(intents) > self.limit
        return Page(shown, shown[-1].seq if more and shown else None)


@dataclass(frozen=True, slots=True)
class Page:
    """A page of intents, newest first; ``next_seq`` continues it, ``None`` when done."""

    intents: list[Intent]
    next_seq: int | None


@dataclass(frozen=True, slots=True)
class History:
    """An intent's attempts and events, in order, and the intent as the same read saw it (so a
    caller never shows a history newer than the status beside it)."""

    attempts: list[Attempt] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    intent: Intent | None = None


@dataclass(frozen=True, slots=True)
class AttemptMinute:
    """The attempts to one destination that finished in one minute with one outcome (of those that
    started in the window asked for)."""

    destination: str
    minute: datetime
    outcome: str
    count: int
    duration_ms: float  # summed over them
    last_at: datetime  # when the latest of them finished


@dataclass(frozen=True, slots=True)
class Failure:
    """A destination's latest attempt that did not deliver."""

    destination: str
    at: datetime
    outcome: str
    status_code: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One attempt that did not deliver, with the intent it was for: a destination's last errors."""

    action_id: str
    scope: str
    number: int
    at: datetime  # when it finished
    submission: str | None
    outcome: str
    status_code: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Waiting:
    """A destination's open (pending, leased, held) intents, and when its oldest due one fell due."""

    destination: str
    count: int
    oldest_due_at: datetime | None


@dataclass(frozen=True, slots=True)
class Span:
    """``count`` intents enqueued in minute ``since`` (the window's first, for older ones) and
    last changed in minute ``until`` as they settled (None: still open)."""

    since: datetime
    until: datetime | None
    count: int


@dataclass(frozen=True, slots=True)
class Activity:
    """What the console shows of a recent window: attempts per minute, latest failures, the
    open intents, and the spans from which the backlog over the window is counted."""

    minutes: list[AttemptMinute]
    failures: list[Failure]
    waiting: list[Waiting]
    backlog: list[Span]


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim made with a batch of changes: lease up to ``limit`` due intents to ``owner``
    until ``lease_until`` (see ``Store.claim``)."""

    owner: str
    now: datetime
    lease_until: datetime
    limit: int


@dataclass(frozen=True, slots=True)
class Applied:
    """What ``Store.apply`` did: one result per change, in order (None for a worker's change
    applied, the intent as it became for an operator's, or the error that refused it: NotFound,
    StaleWrite, IllegalTransition), the intents claimed after the changes, oldest due first, and
    the due intents the claim held back by a destination's limit or pause (``outbox.flow``)."""

    results: list[Intent | OutboxError | None]
    claimed: list[Intent] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)


class Transaction(Protocol):
    """A database transaction shared by the caller's own SQL and the outbox's writes."""

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run the caller's statement in this transaction; returns its rows."""
        ...

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        """As ``Store.insert_intent``, inside this transaction."""
        ...

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        """As ``Store.publish``, inside this transaction."""
        ...


class Schema(Protocol):
    """The database itself: connecting, migrating, and the caller's own transaction."""

    async def open(self) -> None:
        """Connect; does not migrate."""
        ...

    async def close(self) -> None:
        """Finish pending writes and disconnect."""
        ...

    async def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied (empty when up to date)."""
        ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers and is migrated."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """A transaction for the caller's own SQL together with enqueues; commits on success.
        (An enqueue on the caller's own connection needs no store: ``outbox.connections``.)"""
        ...


class Producing(Protocol):
    """What producers write: intents and events, each decided and recorded in one commit."""

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        """Create an intent (pending, or held if its destination requires approval) with its
        first event; the same key (scope/action_id), destination and digest returns the existing one.
        Raises UnknownDestination, IntentConflict."""
        ...

    async def insert_intents(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued]:
        """``insert_intent`` for many, all in one transaction: every one is recorded, or none."""
        ...

    async def insert_each(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued | OutboxError]:
        """``insert_intent`` for many in one transaction, each on its own: an intent refused
        (UnknownDestination, IntentConflict, InvalidInput) is answered by its error in its place
        and writes nothing; the others commit together, or (the commit failing) none does."""
        ...

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        """Record an event and, in the same transaction, one intent (``NewEvent.intent_for``) per
        destination with a subscription matching its topic (``topics.matches``) for its scope and,
        with ``granted_only``, a grant live at its ``created_at`` for that scope (``find_grant``'s
        rule); a subscriber whose intent is refused (its channel refuses the payload, its derived
        key is held by another operation) is skipped with the reason, recorded on the event. The
        same key (scope/event_id), topic, digest and ordering key again returns the event as it
        stands (``created=False``, nothing written); else raises IntentConflict, writing nothing. Its
        intents send the payload the event stores, not a copy each. A new event with more subscribers
        so reached than ``max_fanout`` (None: no limit) raises FanoutTooLarge, writing nothing."""
        ...

    async def publish_each(self, items: Sequence[NewEvent], *, granted_only: bool, max_fanout: int | None = None,
                           max_batch_fanout: int | None = None) -> list[Published | OutboxError]:
        """``publish`` for many in one transaction, each on its own: an event refused is answered
        by its error in its place and writes nothing; the others commit together, or none does.
        An event that would take the batch past ``max_batch_fanout`` intents in all (counted in
        order; None: no limit) is refused with FanoutTooLarge."""
        ...

    async def deliver_event(self, new: NewIntent, event: Event) -> tuple[Enqueued, StoredEvent]:
        """Create ``new``, an event's intent for one more destination (``new.event_id`` names it,
        in its scope), unless its key exists; returns it and the event with its fan-out as it then
        stands. Raises UnknownDestination, IntentConflict, InvalidInput (as ``insert_intent``) and
        NotFound when the event does not exist (writing nothing)."""
        ...


class Reading(Protocol):
    """What readers ask of intents and events (the API, the console, the CLI, harnesses)."""

    async def get_intent(self, key: str) -> Intent | None:
        """One intent, or None."""
        ...

    async def get_event(self, key: str) -> StoredEvent | None:
        """One event (scope/event_id) with its fan-out, or None."""
        ...

    async def events_named(self, event_id: str) -> list[StoredEvent]:
        """Every scope's event with this id (at most one per scope), by scope, with fan-outs."""
        ...

    async def list_events(self, query: EventQuery) -> EventPage:
        """A page of events matching ``query``, newest first, with their fan-outs."""
        ...

    async def intents_named(self, action_id: str) -> list[Intent]:
        """Every scope's intent with this action id (at most one per scope), by scope."""
        ...

    async def history(self, key: str) -> History:
        """An intent's attempts and events; empty if it does not exist."""
        ...

    async def list_intents(self, query: IntentQuery) -> Page:
        """A page of intents matching ``query``, newest first."""
        ...

    async def waiting_behind(self, key: str) -> Intent | None:
        """The earliest intent that keeps this pending intent of an ordered destination from being
        claimed (an earlier open intent of its key, or a dead or revoked one the destination blocks
        on), as ``claim`` judges it; None when nothing does, or the intent is not pending."""
        ...


class Delivery(Protocol):
    """What the sender's cycles and sweeper change: claims, leases and the moves of intents."""

    async def apply(self, changes: Sequence[Change], *, claim: Claim | None = None) -> Applied:
        """Make each change's move (``outbox.model.MOVES``) as one set per move, in one transaction
        (SQLite: one group commit), then make ``claim`` in the same transaction. An intent the
        changes make due may be left to a later claim (PostgreSQL claims in the statement of the
        settles and starts, on the rows as they were before it). Each change is
        judged on its own against the intent as it is: one refused (its intent gone, in another
        status, at another fence, or, for ``Start``, its lease expired) writes nothing and is
        answered by its error in its place; the others go on. A key named twice is changed in
        turn. Raises (writing nothing) only when the database fails, or for a change its move
        cannot make at all (``model.check_change``)."""
        ...

    async def recover(self, now: datetime, limit: int, actor: str) -> int:
        """Give back, in one transaction, up to ``limit`` intents whose lease expired before ``now``
        with no attempt in flight (move ``recover``: pending, due now, fence raised, a
        ``lease_expired`` event by ``actor``); returns how many. Those with an attempt in flight
        are left for the sweeper to settle (``expired_leases``)."""
        ...

    async def claim(
        self, owner: str, *, now: datetime, lease_until: datetime, limit: int
    ) -> list[Intent]:
        """Lease up to ``limit`` due intents (oldest due first) to ``owner``, bumping each
        fence and appending a ``leased`` event. Concurrent claimers never get the same intent. An
        intent of a destination with ordering 'key' is left while an earlier intent (smaller seq)
        of its destination and key is pending, leased, held or unknown, or dead or revoked when the
        destination's ordering_on_dead is 'block'. A destination's limits (``outbox.flow``) hold,
        for every claimer of the database together: no more than ``max_in_flight`` of its intents
        leased at once, no more leased than its ``rate_limit``'s bucket has tokens, none while it
        is paused; what they hold back stays pending, with no attempt and no event."""
        ...

    async def renew_leases(self, held: Sequence[tuple[str, int]], until: datetime) -> list[str]:
        """Extend the leases ``(key, fence)`` still held; returns the keys lost."""
        ...

    async def expired_leases(self, now: datetime, limit: int) -> list[tuple[Intent, Attempt | None]]:
        """Leased intents whose lease ran out, each with its unfinished attempt (if one started)."""
        ...

    async def first_submission_at(self, key: str) -> datetime | None:
        """When the intent's first attempt that may have reached the receiver started."""
        ...

    async def next_due_at(self, now: datetime | None = None) -> datetime | None:
        """When the soonest pending intent falls due, or None; an intent waiting behind an
        earlier one of its key (see ``claim``) is not counted, as it is not claimed when due,
        nor (given ``now``) one due by ``now`` of a destination with a limit or a pause, which a
        claim at ``now`` held back."""
        ...

    async def disable_destination(self, destination_id: str, at: datetime) -> None:
        """Mark a destination disabled (it answered 410 Gone)."""
        ...

    async def pause_destination(self, destination_id: str, until: datetime) -> None:
        """Claim none of a destination's intents until ``until`` (its receiver asked, 429 or 503
        with Retry-After), unless it is paused longer already."""
        ...


class Operations(Protocol):
    """What operators and the metrics read of the whole: pruning, counts, activity, failures."""

    async def prune(self, before: datetime, *, dry_run: bool, limit: int | None) -> list[str]:
        """Delete up to ``limit`` (None: all) delivered or cancelled intents last changed before
        ``before``, oldest first, with their attempts and events, in one transaction; returns
        their action_ids (nothing deleted on a dry run)."""
        ...

    async def count_by_status(self) -> list[tuple[str, str, int]]:
        """(status, channel, count) for every status and channel that has intents."""
        ...

    async def oldest_due_at(self, now: datetime) -> datetime | None:
        """When the oldest intent that is due now fell due, or None."""
        ...

    async def activity(self, since: datetime, now: datetime) -> Activity:
        """Attempts started since ``since`` that finished, the failures among them, and the intents
        settled since (minute by minute, through indexes on start and change times: an attempt's
        finish then changes no indexed column), and the open intents as of ``now``."""
        ...

    async def destination_counts(self, destination_id: str) -> dict[str, int]:
        """A destination's intents by status (statuses it has none of are left out)."""
        ...

    async def failed_attempts(self, destination_id: str, since: datetime, limit: int) -> list[FailedAttempt]:
        """A destination's attempts started since ``since`` that did not deliver, newest first, at
        most ``limit`` (through the index on start times, as ``activity``)."""
        ...


class Registry(Protocol):
    """The registries intents depend on: destinations and their sealed secrets, grants, tokens and console sessions."""

    async def put_grant(self, grant_id: str, spec: GrantSpec, at: datetime) -> tuple[Grant, bool]:
        """Create or replace a grant (its revision goes up); True when it was new."""
        ...

    async def get_grant(self, grant_id: str) -> Grant | None:
        """One grant, or None."""
        ...

    async def list_grants(self) -> list[Grant]:
        """Every grant, by id."""
        ...

    async def delete_grant(self, grant_id: str) -> None:
        """Remove a grant. Raises NotFound."""
        ...

    async def find_grant(self, scope: str, destination: str, now: datetime) -> Grant | None:
        """A live grant for ``scope`` at ``destination`` (an exact one before a '*' one)."""
        ...

    async def put_destination(self, destination: Destination, *, limits: TenantLimits | None = None) -> bool:
        """Register or replace a destination, its secrets sealed with the keyring under the key
        the database names (naming the keyring's first when it names none); True when it was new.
        With ``limits``, an owned destination is written only while its owner stays within them,
        counted in the same transaction (``tenants.decide_limits``: raises TenantLimit). Raises
        SecretsKeyError when the keyring does not hold that key."""
        ...

    async def get_destination(self, destination_id: str) -> Destination | None:
        """One destination, or None."""
        ...

    async def list_destinations(self, *, owner: str | None = None) -> list[Destination]:
        """Every destination (with ``owner``, those that scope owns), by id."""
        ...

    async def delete_destination(self, destination_id: str) -> None:
        """Remove a destination. Raises NotFound, or DestinationInUse while intents still wait
        on it or name it in their history."""
        ...

    async def sealing_key(self) -> str | None:
        """The id of the key destination secrets are sealed under, or None before any is named."""
        ...

    async def reseal_secrets(self, key: str, *, plain_only: bool = False) -> int:
        """In one transaction, seal every destination's secrets under ``key`` (with ``plain_only``,
        only those still stored plain) and name ``key`` as the one to seal under; returns how
        many destinations' secrets changed. Raises SecretsKeyError, changing nothing, when some
        destination's secrets do not open."""
        ...

    async def insert_token(self, info: TokenInfo, token_hash: str) -> None:
        """Store a token's hash and what it may do."""
        ...

    async def token_by_hash(self, token_hash: str) -> TokenInfo | None:
        """The active token with this hash, or None."""
        ...

    async def list_tokens(self) -> list[TokenInfo]:
        """Every token, revoked ones included."""
        ...

    async def revoke_token(self, token_id: str, at: datetime, *, keep_an_admin: bool = True) -> TokenInfo:
        """Revoke a token. Raises NotFound if there is no such active token and, with
        ``keep_an_admin``, LastAdmin if it is the last active admin token (judged atomically
        with the revocation, so concurrent revocations cannot leave no admin)."""
        ...

    async def count_active_tokens(self, role: str) -> int:
        """How many unrevoked tokens of ``role`` exist."""
        ...

    async def open_console_session(self, session: ConsoleSession, *, keep: int) -> None:
        """Store a new console session, in one transaction with dropping every session expired
        at its ``created_at`` or opened with a revoked token, and the oldest of its token's
        beyond the newest ``keep``."""
        ...

    async def console_session(self, id_hash: str, now: datetime) -> TokenInfo | None:
        """The token of the session with this hash, if the session is unexpired at ``now`` and
        the token is not revoked; otherwise None."""
        ...

    async def close_console_session(self, id_hash: str) -> None:
        """Remove a console session (none with this hash: nothing happens)."""
        ...

    async def insert_portal_link(self, link: PortalLink) -> None:
        """Store a new portal link, in one transaction with dropping the links unopened past their
        expiry at its ``created_at``, the sessions ended by then, and those of revoked tokens."""
        ...

    async def open_portal_link(self, link_hash: str, session_hash: str, now: datetime) -> PortalSession | None:
        """Open the link with this hash at ``now`` for the session with ``session_hash``, atomically
        and once: its session, or None when it is expired, opened already, its token revoked, or none."""
        ...

    async def portal_session(self, session_hash: str, now: datetime) -> PortalSession | None:
        """The portal session with this hash, if it is unexpired at ``now`` and its link's token
        is not revoked; otherwise None."""
        ...

    async def close_portal_session(self, session_hash: str) -> None:
        """Remove the portal session with this hash and its link (none: nothing happens), so
        neither the session nor the link opens again."""
        ...


class Store(Schema, Producing, Reading, Delivery, Operations, Registry, Protocol):
    """An outbox database: every role above. A part of the outbox that needs one role asks for
    that role's protocol, so a new store or a test double implements what it serves."""

    dialect: str
    #: Seals and opens destination secrets (``outbox.keyring``); ``Outbox.open`` gives it one.
    keyring: Keyring | None


@runtime_checkable
class SupportsListener(Protocol):
    """A store that tells when other processes make intents due, so workers need not wait for
    their next poll."""

    async def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever a transaction that made an intent pending commits, in any
        process, until cancelled (and once each time listening starts again after a loss)."""
        ...


@runtime_checkable
class SharesClock(Protocol):
    """A store shared by hosts, whose database clock is the one timeline they judge leases on."""

    async def clock_offset(self) -> float:
        """How far the database's clock is ahead of this host's, in seconds (negative: behind)."""
        ...
