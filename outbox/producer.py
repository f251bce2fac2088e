"""Enqueue on the application's own connection, inside its own transaction: the intent commits
with the application's rows, or not at all, whatever the application writes with
(``outbox.connections``: sqlite3, psycopg, psycopg2, asyncpg, aiosqlite, SQLAlchemy, Django).

    producer = Producer()                      # the OUTBOX_* settings: payload limit, attempts
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("INSERT INTO orders (id) VALUES (42)")
        producer.enqueue(conn, destination="billing", scope="acme", payload={"order": 42})

``Producer`` is synchronous and starts no event loop; ``AsyncProducer`` is the same for an
asyncio application. Both check what they are given as ``Outbox.enqueue`` does (``Intake``) and
run the enqueue's one set of rules and statements (``store.intake``) on the connection, so the
results and errors are the library's: ``Enqueued`` (``created=False`` for the same operation
again), IntentConflict, UnknownDestination, InvalidInput, PayloadTooLarge. A refusal is raised
before anything is written and without an SQL error, so the caller's transaction stays usable:
let it propagate (everything rolls back) or catch it and commit the rest. The outbox's service
(its worker) sees the intent once the transaction commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Unpack

from .clock import Clock, SystemClock
from .connections import bind, bind_async
from .errors import OutboxError
from .events import Published
from .intake import EventFields, Intake, IntentFields
from .model import Enqueued, Event, NewIntent
from .settings import Settings
from .store import intake as steps
from .store.intake import Returns, Statement
from .store.rules import whole_or_refused

#: The savepoint an ``enqueue_many`` writes under, so a refusal found after its insert undoes it.
_SAVEPOINT = "outbox_enqueue_many"
_MARK, _UNDO, _KEEP = (Statement(f"{verb} {_SAVEPOINT}", (), Returns.NOTHING)
                       for verb in ("SAVEPOINT", "ROLLBACK TO SAVEPOINT", "RELEASE SAVEPOINT"))


class _Base:
    def __init__(self, settings: Settings | None = None, *, clock: Clock | None = None) -> None:
        #: The checks every intent passes before it is written, with these settings' limits.
        self.intake = Intake(settings or Settings(), (clock or SystemClock()).now)
        #: Destinations' rows as this producer's enqueues last read them: an enqueue judges its
        #: intent on its destination's and inserts it in one statement that holds only while the
        #: destination still says so (``store.intake.insert_intent``), reading it only when not.
        self._destinations: dict[str, Any] = {}

    def _prepared(self, intents: Iterable[Mapping[str, Any]]) -> list[tuple[NewIntent, Event]]:
        return [self.intake.intent(**intent) for intent in intents]


class Producer(_Base):
    """Enqueues on a synchronous connection or session, in the caller's transaction."""

    def enqueue(self, connection: Any, /, **intent: Unpack[IntentFields]) -> Enqueued:
        """Record an intent in ``connection``'s transaction (durable when it commits); the fields
        are ``Outbox.enqueue``'s."""
        new, event = self.intake.intent(**intent)
        bound = bind(connection)
        with bound.unavailable():
            return bound.run(steps.insert_intent(bound.dialect, new, event, known=self._destinations))

    def enqueue_many(self, connection: Any, intents: Iterable[Mapping[str, Any]], /) -> list[Enqueued]:
        """Record several intents in ``connection``'s transaction, all or none: the first refusal,
        or an error of the database part way, is raised with none of them written (the caller's
        own writes untouched, and on PostgreSQL the transaction usable again)."""
        prepared = self._prepared(intents)
        if not prepared:
            return []
        bound = bind(connection)
        with bound.unavailable():
            bound.execute(_MARK)
            try:
                results = bound.run(steps.insert_batch(bound.dialect, prepared))
            except BaseException:  # (the database failed part way: none of the batch stays)
                bound.execute(_UNDO)
                raise
            if not _accepted(results):
                bound.execute(_UNDO)
            bound.execute(_KEEP)
            return whole_or_refused(results)

    def publish(self, connection: Any, /, **event: Unpack[EventFields]) -> Published:
        """Record an event in ``connection``'s transaction, with one intent per destination
        subscribed to its topic (durable when it commits); the fields are ``Outbox.publish``'s. An
        event that would make more intents than ``max_fanout`` raises FanoutTooLarge."""
        new = self.intake.event(**event)
        bound = bind(connection)
        with bound.unavailable():
            return bound.run(steps.publish(bound.dialect, new, self.intake.granted_only,
                                           self.intake.settings.max_fanout))


class AsyncProducer(_Base):
    """Enqueues on an asyncio connection or session, in the caller's transaction."""

    async def enqueue(self, connection: Any, /, **intent: Unpack[IntentFields]) -> Enqueued:
        """As ``Producer.enqueue``."""
        new, event = self.intake.intent(**intent)
        bound = await bind_async(connection)
        with bound.unavailable():
            return await bound.run_async(steps.insert_intent(bound.dialect, new, event, known=self._destinations))

    async def enqueue_many(self, connection: Any, intents: Iterable[Mapping[str, Any]], /) -> list[Enqueued]:
        """As ``Producer.enqueue_many``."""
        prepared = self._prepared(intents)
        if not prepared:
            return []
        bound = await bind_async(connection)
        with bound.unavailable():
            await bound.execute(_MARK)
            try:
                results = await bound.run_async(steps.insert_batch(bound.dialect, prepared))
            except BaseException:  # (the database failed part way: none of the batch stays)
                await bound.execute(_UNDO)
                raise
            if not _accepted(results):
                await bound.execute(_UNDO)
            await bound.execute(_KEEP)
            return whole_or_refused(results)

    async def publish(self, connection: Any, /, **event: Unpack[EventFields]) -> Published:
        """As ``Producer.publish``."""
        new = self.intake.event(**event)
        bound = await bind_async(connection)
        with bound.unavailable():
            return await bound.run_async(steps.publish(bound.dialect, new, self.intake.granted_only,
                                           self.intake.settings.max_fanout))


def _accepted(results: list[Enqueued | OutboxError]) -> bool:
    return not any(isinstance(result, OutboxError) for result in results)

