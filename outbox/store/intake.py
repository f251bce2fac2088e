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

from ..errors import OutboxError
from ..model import Enqueued, Event, NewIntent, Status
from .records import Reader, Row
from .rules import check_payload, decide_existing, decide_initial_status, inserted_intent

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
        """The destination's ``channel`` and ``requires_approval`` (ROW, None: not registered)."""
        ...

    def lock_ordering_keys(self, intents: Sequence[NewIntent]) -> Statement | None:
        """Make enqueues of the same destination and ordering key take turns until the transaction
        ends; None where the dialect needs no lock (one writer at a time)."""
        ...

    def insert_intent(self, item: Judged) -> Statement:
        """Create one intent unless its key exists (VALUE: its seq, or None)."""
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


def judge(dialect: Intake, new: NewIntent, seen: dict[str, Any]) -> Steps[tuple[str, Status]]:
    """The channel ``new`` goes through and the status it starts in (``rules.decide_initial_status``,
    ``rules.check_payload``); raises the refusal of an unknown destination or a payload its
    channel cannot carry, before anything is written. ``seen`` remembers destinations' rows (their
    ``channel`` and ``requires_approval``) across the intents of one batch."""
    found = seen.get(new.destination)
    if found is None:
        found = yield dialect.destination(new.destination)
        if found is not None:
            seen[new.destination] = found
    status = decide_initial_status(new, None if found is None else bool(found["requires_approval"]))
    check_payload(new, found["channel"])
    return found["channel"], status


def insert_intent(dialect: Intake, new: NewIntent, event: Event,
                  seen: dict[str, Any] | None = None) -> Steps[Enqueued]:
    """The enqueue of one intent, inside a transaction: destination check, then insert or compare
    (``rules.decide_existing``). A refusal is raised before anything is written and without an
    SQL error, so it leaves the caller's transaction usable. ``seen``: as ``judge``'s, for an
    intent of a batch, whose ordering keys were locked already (alone, the intent's is locked here)."""
    channel, status = yield from judge(dialect, new, {} if seen is None else seen)
    if seen is None and (lock := dialect.lock_ordering_keys([new])) is not None:
        yield lock
    while True:
        seq = yield dialect.insert_intent((new, event, channel, status))
        if seq is not None:
            if (logged := dialect.first_events([(seq, event)])) is not None:
                yield logged
            return Enqueued(inserted_intent(seq, new, channel, status), created=True)
        existing = yield dialect.intent_by_key(new.key)
        if existing is not None:
            return decide_existing(dialect.read.intent(existing), new)
        # the intent holding the key was pruned between the two statements: the key is free again


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
            channel, status = yield from judge(dialect, new, seen)
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

