"""The enqueue's rules and statements, once, whatever driver runs them.

An enqueue is a short conversation with the database: read the destination, lock the ordering
keys, insert, compare with what holds the key. It is written here once as *steps*: a generator
that yields each ``Statement`` it needs and is sent back its answer, deciding with the pure
rules of ``rules``. It does no I/O of its own (the shape of h11 and httpcore), so the same steps
run on the store's own connections and on the connection an application already has, sync or
async: a driver is only an executor (``run``, ``run_async`` with the driver's ``execute``).

What a dialect gives the steps is its statements (``Intake``): each builds a ``Statement`` from
records, with values as that dialect stores them; none runs one.

    enqueued = run(insert_intent(dialect, new, first), driver.execute)
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from ..errors import NotFound, OutboxError
from ..events import NewEvent, Published, StoredEvent, event_key
from ..model import Enqueued, Event, NewIntent, Status
from .records import Reader, Row
from .rules import (
    batch_fanout_refusal,
    check_payload,
    decide_existing,
    decide_existing_event,
    decide_initial_status,
    fanout_of,
    fanout_refusal,
    inserted_intent,
    sending_event_payload,
)

T = TypeVar("T")


class Returns(enum.Enum):
    """What a statement's answer is, as the steps are sent it."""

    ROWS = "rows"  # every row (a list; each row read by column name)
    ROW = "row"  # the first row, or None
    VALUE = "value"  # the first column of the first row, or None
    NOTHING = "nothing"  # None


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of the dialect's SQL, its parameters (positional, as the dialect numbers
    them), and what its answer is."""

    sql: str
    args: tuple[Any, ...]
    returns: Returns


#: Steps that yield statements, are sent their answers, and return a ``T``.
Steps = Generator[Statement, Any, T]

#: One of an enqueue's items: the new intent, its first event, its channel and starting status.
Judged = tuple[NewIntent, Event, str, Status]


class Intake(Protocol):
    """A dialect's statements for the enqueue (``sql/<dialect>.sql``), each built from records."""

    #: The dialect's records from its rows.
    read: Reader

    def destination(self, destination_id: str) -> Statement:
        """The destination's ``channel``, ``requires_approval`` and ``owner`` (ROW, None: not registered)."""
        ...

    def lock_ordering_keys(self, intents: Sequence[NewIntent]) -> Statement | None:
        """Make enqueues of the same destination and ordering key take turns until the transaction
        ends; None where the dialect needs no lock (one writer at a time)."""
        ...

    def insert_intent(self, item: Judged, judged_on: Row) -> Statement:
        """Create one intent unless its key exists, while its destination still says what
        ``judged_on`` (a ``destination`` row, perhaps of an earlier transaction) says: the channel
        and ``requires_approval`` the intent was judged on (VALUE: its seq, or None)."""
        ...

    def insert_intents(self, items: Sequence[Judged]) -> Statement:
        """Create several intents, in order, each unless its key exists, an earlier item's
        included (ROWS: ``intent_key`` and ``seq`` of each created)."""
        ...

    def first_events(self, made: Sequence[tuple[int, Event]]) -> Statement | None:
        """Append the first events of intents just created (by seq); None where the dialect's
        inserts append them in the same statement."""
        ...

    def intent_by_key(self, key: str) -> Statement:
        """The intent holding ``key`` (ROW)."""
        ...

    def intents_by_keys(self, keys: Sequence[str]) -> Statement:
        """The intents holding any of ``keys`` (ROWS)."""
        ...

    # -- events -------------------------------------------------------------------------------

    def insert_topic_event(self, new: NewEvent) -> Statement:
        """Record an event unless its key exists (VALUE: its seq, or None)."""
        ...

    def insert_topic_events(self, items: Sequence[NewEvent]) -> Statement:
        """Record several events, in order, each unless its key exists, an earlier item's included
        (ROWS: ``event_key`` and ``seq`` of each recorded)."""
        ...

    def event_subscribers(self, new: NewEvent, granted_only: bool) -> Statement:
        """The destinations subscribed to ``new``'s topic for its scope (with ``granted_only``,
        that the scope holds a live grant for), by id (ROWS: ``id`` and ``judge``'s columns)."""
        ...

    def events_subscribers(self, items: Sequence[tuple[int, NewEvent]], granted_only: bool) -> Statement:
        """``event_subscribers`` for several events at once, each named by its number (ROWS:
        ``n``, ``id`` and ``judge``'s columns, by n then id)."""
        ...

    def set_event_skipped(self, seq: int, skipped: Sequence[tuple[str, str]]) -> Statement:
        """Record the subscribers an event made no intent for (NOTHING)."""
        ...

    def event_by_key(self, key: str) -> Statement:
        """The event recorded under ``key`` (ROWS: none or one)."""
        ...

    def intents_of_events(self, events: Sequence[tuple[str, str]]) -> Statement:
        """The intents of the events named ``(scope, event_id)`` (ROWS)."""
        ...


def run(steps: Steps[T], execute: Callable[[Statement], Any]) -> T:
    """Drive ``steps`` to their end with a synchronous driver's ``execute``; returns their result
    (their refusal or the driver's error is raised)."""
    try:
        statement = next(steps)
        while True:
            statement = steps.send(execute(statement))
    except StopIteration as done:
        return cast(T, done.value)
    finally:
        steps.close()


async def run_async(steps: Steps[T], execute: Callable[[Statement], Awaitable[Any]]) -> T:
    """``run`` with an asynchronous driver's ``execute``."""
    try:
        statement = next(steps)
        while True:
            statement = steps.send(await execute(statement))
    except StopIteration as done:
        return cast(T, done.value)
    finally:
        steps.close()


def judge(dialect: Intake, new: NewIntent, seen: dict[str, Any],
          known: dict[str, Any] | None = None) -> Steps[tuple[str, Status, Row]]:
    """The channel ``new`` goes through, the status it starts in and the destination's row they
    were judged on (``judged``), read in this transaction; raises the refusal of an unknown
    destination or a payload its channel cannot carry, before anything is written. ``seen``
    remembers destinations' rows (their ``channel`` and ``requires_approval``) across the intents
    of one batch; ``known``, if given, is told of each row read (or of a destination not found)."""
    found = seen.get(new.destination)
    if found is None:
        found = yield dialect.destination(new.destination)
        if found is not None:
            seen[new.destination] = found
        if known is not None:
            if found is None:
                known.pop(new.destination, None)
            else:
                known[new.destination] = found
    return (*judged(new, found), found)


def judged(new: NewIntent, found: Any) -> tuple[str, Status]:
    """The channel and first status of ``new`` by its destination's row ``found`` (None: not
    registered), as ``rules.decide_initial_status`` and ``rules.check_payload`` decide them. A
    destination another scope owns is, to ``new``, not registered (the refusal confirms nothing)."""
    if found is not None and found["owner"] is not None and found["owner"] != new.scope:
        found = None
    status = decide_initial_status(new, None if found is None else bool(found["requires_approval"]))
    check_payload(new, found["channel"])
    return found["channel"], status


def insert_intent(dialect: Intake, new: NewIntent, event: Event, seen: dict[str, Any] | None = None,
                  known: dict[str, Any] | None = None) -> Steps[Enqueued]:
    """The enqueue of one intent, inside a transaction: destination check, then insert or compare
    (``rules.decide_existing``). A refusal is raised before anything is written and without an
    SQL error, so it leaves the caller's transaction usable. ``seen``: as ``judge``'s, for an
    intent of a batch, whose ordering keys were locked already (alone, the intent's is locked here).

    ``known``: destinations' rows as earlier enqueues read them, perhaps in other transactions (a
    producer's, across its calls), kept up to date here. With one for ``new``'s destination the
    intent is judged on it and inserted in one statement that holds only while the destination
    still says so; the destination is read only when the insert did not hold or the row would
    refuse the intent, and the intent is judged again on what was read, so the outcome is the
    one reading it first would have had."""
    lock = dialect.lock_ordering_keys([new]) if seen is None else None
    row: Any = known.get(new.destination) if known is not None and seen is None else None
    while True:
        read_now = row is None
        if read_now:
            channel, status, row = yield from judge(dialect, new, {} if seen is None else seen, known)
        else:
            try:
                channel, status = judged(new, row)
            except OutboxError:  # refused on a row that may be out of date: read it
                row = None
                continue
        if lock is not None:
            yield lock
            lock = None
        seq = yield dialect.insert_intent((new, event, channel, status), row)
        if seq is not None:
            if (logged := dialect.first_events([(seq, event)])) is not None:
                yield logged
            return Enqueued(inserted_intent(seq, new, channel, status), created=True)
        row = None  # the key is held, or the destination says otherwise than the row now
        if not read_now:
            continue  # (a row of an earlier transaction: read the destination and judge again first)
        existing = yield dialect.intent_by_key(new.key)
        if existing is not None:
            return decide_existing(dialect.read.intent(existing), new)
        # the intent holding the key was pruned between the two statements (the key is free
        # again), or the destination changed since it was read: read it and judge again


def insert_batch(dialect: Intake, items: Sequence[tuple[NewIntent, Event]],
                 seen: dict[str, Any] | None = None) -> Steps[list[Enqueued | OutboxError]]:
    """A batch's enqueues, inside a transaction, in a few statements however many intents: each is
    judged as alone (a refusal is its result, decided before any write), the new keys are inserted
    with their first events at once, and the rest (keys held already, or by an earlier item) are
    compared with the intents holding them, as ``rules.decide_existing`` says. ``seen``:
    destinations' rows read already (``judge``'s), by id."""
    if (lock := dialect.lock_ordering_keys([new for new, _ in items])) is not None:
        yield lock
    seen = {} if seen is None else seen
    results: list[Enqueued | OutboxError | None] = [None] * len(items)
    fresh: dict[str, tuple[int, str, Status]] = {}  # key -> (its first item, channel, status)
    for i, (new, _) in enumerate(items):
        try:
            channel, status, _ = yield from judge(dialect, new, seen)
        except OutboxError as exc:
            results[i] = exc
            continue
        fresh.setdefault(new.key, (i, channel, status))
    created: dict[str, int] = {}
    if fresh:
        rows: list[Row] = yield dialect.insert_intents([(*items[i], channel, status)
                                                       for i, channel, status in fresh.values()])
        created = {row["intent_key"]: row["seq"] for row in rows}
    made: list[tuple[int, Event]] = []
    for key, (i, channel, status) in fresh.items():
        if key in created:
            made.append((created[key], items[i][1]))
            results[i] = Enqueued(inserted_intent(created[key], items[i][0], channel, status), created=True)
    if made and (logged := dialect.first_events(made)) is not None:
        yield logged
    taken = [i for i, result in enumerate(results) if result is None]  # their keys were held already
    if taken:
        holders: list[Row] = yield dialect.intents_by_keys([items[i][0].key for i in taken])
        existing = {row["intent_key"]: dialect.read.intent(row) for row in holders}
        for i in taken:
            new, event = items[i]
            try:
                holder = existing.get(new.key)  # None: pruned since, so the key is free again
                results[i] = (decide_existing(holder, new) if holder is not None
                              else (yield from insert_intent(dialect, new, event, seen)))
            except OutboxError as exc:
                results[i] = exc
    return cast(list[Enqueued | OutboxError], results)  # every place filled above


# -- events -----------------------------------------------------------------------------------


def publish(dialect: Intake, new: NewEvent, granted_only: bool,
            max_fanout: int | None = None) -> Steps[Published]:
    """Record ``new`` and make its intents, inside a transaction: one for each destination
    subscribed to its topic for its scope (with ``granted_only``, that the scope holds a live grant
    for), as one batch (``insert_batch``), each sending the payload stored once in the event's row;
    a subscriber whose intent is refused is recorded as skipped. An event already recorded under
    its key is compared (``rules.decide_existing_event``: the same event answers as recorded;
    another raises IntentConflict); one that would make more than ``max_fanout`` intents raises
    FanoutTooLarge (``rules.fanout_refusal``). A refusal is raised before anything is written."""
    seen = {row["id"]: row for row in (yield dialect.event_subscribers(new, granted_only))}
    if (refused := fanout_refusal(new, len(seen), max_fanout)) is not None:
        return (yield from _recorded_or(dialect, new, refused))
    seq = yield dialect.insert_topic_event(new)
    if seq is None:  # (on PostgreSQL, a concurrent publish of the key has committed: ON CONFLICT waited)
        return decide_existing_event((yield from event(dialect, new.key)), new)
    items = [new.intent_for(destination, seq) for destination in seen]
    results = (yield from insert_batch(dialect, items, seen)) if items else []
    intents, skipped = fanout_of(items, results)
    if skipped:
        yield dialect.set_event_skipped(seq, skipped)
    return Published(StoredEvent.recorded(seq, new).with_fanout(intents, skipped), created=True)


def publish_each(dialect: Intake, items: Sequence[NewEvent], granted_only: bool, max_fanout: int | None = None,
                 max_batch_fanout: int | None = None) -> Steps[list[Published | OutboxError]]:
    """``publish`` for each of ``items``, inside a transaction, in a few statements however many
    events: their subscribers are read at once, the new keys of those within ``max_fanout`` recorded
    at once and every intent made by one ``insert_batch``; the rest (keys recorded already, or
    earlier in the batch, and the events past ``max_fanout``) are compared afterwards with the event
    holding the key, or refused; so is each event that would take the batch past
    ``max_batch_fanout`` intents in all (counted in order). A refusal stands as its error in its
    place (decided before any write of that event: it undoes nothing)."""
    seen: dict[str, Any] = {}
    subscribers: dict[int, list[str]] = {i: [] for i in range(len(items))}
    if items:
        for row in (yield dialect.events_subscribers(list(enumerate(items)), granted_only)):
            seen.setdefault(row["id"], row)
            subscribers[row["n"]].append(row["id"])
    refused = {i: found for i, new in enumerate(items)
               if (found := fanout_refusal(new, len(subscribers[i]), max_fanout)) is not None}
    if max_batch_fanout is not None:  # the batch's budget, spent in order by the events within max_fanout
        spent = 0
        for i, new in enumerate(items):
            if i not in refused:
                if spent + len(subscribers[i]) > max_batch_fanout:
                    refused[i] = batch_fanout_refusal(new, len(subscribers[i]), spent, max_batch_fanout)
                else:
                    spent += len(subscribers[i])
    within = [new for i, new in enumerate(items) if i not in refused]
    recorded = {row["event_key"]: row["seq"] for row in (yield dialect.insert_topic_events(within))} if within else {}
    fresh = {i: recorded.pop(new.key) for i, new in enumerate(items) if i not in refused and new.key in recorded}
    made = [(i, items[i].intent_for(d, fresh[i])) for i in fresh for d in subscribers[i]]
    stored = (yield from insert_batch(dialect, [item for _, item in made], seen)) if made else []
    results: list[Published | OutboxError | None] = [None] * len(items)
    for i, seq in fresh.items():
        mine = [(item, result) for (n, item), result in zip(made, stored, strict=True) if n == i]
        intents, skipped = fanout_of([item for item, _ in mine], [result for _, result in mine])
        if skipped:
            yield dialect.set_event_skipped(seq, skipped)
        results[i] = Published(StoredEvent.recorded(seq, items[i]).with_fanout(intents, skipped), created=True)
    for i, new in enumerate(items):
        if results[i] is None:
            try:
                results[i] = ((yield from _recorded_or(dialect, new, refused[i])) if i in refused
                              else decide_existing_event((yield from event(dialect, new.key)), new))
            except OutboxError as exc:
                results[i] = exc
    return cast(list[Published | OutboxError], results)  # every place filled above


def _recorded_or(dialect: Intake, new: NewEvent, refused: OutboxError) -> Steps[Published]:
    """``new`` compared with the event recorded under its key (``rules.decide_existing_event``),
    or, with none recorded, ``refused`` raised."""
    try:
        existing = yield from event(dialect, new.key)
    except NotFound:
        raise refused from None
    return decide_existing_event(existing, new)


def deliver(dialect: Intake, new: NewIntent, first: Event) -> Steps[tuple[Enqueued, StoredEvent]]:
    """Make ``new``, an event's intent for one more destination, unless it exists (an operator's
    delivery), sending the payload the event stores; returns it and the event as it then stands.
    Raises NotFound (no such event, before any write), UnknownDestination, InvalidInput (its
    channel refuses the payload), IntentConflict."""
    found = yield from event(dialect, event_key(new))
    (result,) = yield from insert_batch(dialect, [(sending_event_payload(new, found), first)])
    if isinstance(result, OutboxError):
        raise result
    return result, (yield from event(dialect, event_key(new)))


def event(dialect: Intake, key: str) -> Steps[StoredEvent]:
    """The event recorded under ``key``, with its fan-out; raises NotFound."""
    found = yield from with_fanout(dialect, (yield dialect.event_by_key(key)))
    if not found:
        scope, _, event_id = key.rpartition("/")
        raise NotFound(f"event {event_id!r} does not exist in scope {scope!r}")
    return found[0]


def with_fanout(dialect: Intake, rows: Sequence[Row]) -> Steps[list[StoredEvent]]:
    """Events from their rows, each with its fan-out (one read for every row's intents)."""
    if not rows:
        return []
    intents: dict[tuple[str, str], list[Any]] = {}
    for row in (yield dialect.intents_of_events([(row["scope"], row["event_id"]) for row in rows])):
        intents.setdefault((row["scope"], row["event_id"]), []).append(dialect.read.intent(row))
    return [dialect.read.event_of(row, intents.get((row["scope"], row["event_id"]), [])) for row in rows]
