"""Enqueue inside the application's own transaction, for every connection kind the outbox takes
(``tests/apps.py``: sqlite3, aiosqlite, psycopg 3 sync and async, psycopg2, asyncpg, SQLAlchemy's
Connection, Session, AsyncConnection and AsyncSession over each store's drivers, and
``Outbox.transaction(connection=...)`` on asyncpg and aiosqlite), on the store each applies to.

Each behaviour is written once and runs on every kind, in an empty database (a SQLite file of its
own; on PostgreSQL the module's one database, emptied before each test) holding the application's
own table (``orders``) beside the outbox's: a commit makes exactly one intent, which a separate
``outbox worker`` process delivers once to a real receiver; a rollback stores and sends nothing; a
refused enqueue raises and, caught, spoils nothing of the rest; a savepoint rolled back takes its
intent with it; ``enqueue_many`` is all or none; a publish's fan-out commits and rolls back with
the transaction; a connection with no transaction open is refused before anything is written;
and what is stored is what the library would have stored.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outbox import (
    DestinationSpec,
    EventKind,
    Intent,
    IntentConflict,
    InvalidInput,
    NoTransaction,
    Outbox,
    Settings,
    Status,
    UnknownDestination,
)
from outbox.grants import GrantSpec

from .. import pg
from ..acceptance.conftest import clean_env, outbox_worker
from ..apps import KINDS, ORDERS, App
from ..conftest import SECRET, rows
from ..receiver import Receiver, Reply


class Boom(Exception):
    """The application's own failure, after its writes and enqueues."""


@dataclass(frozen=True)
class Service:
    """The outbox's database as the service has it: destinations ``hook`` and ``audit`` (webhooks
    to the receiver) and ``mail`` (email: an order's payload is no mail), all subscribed to
    ``order.*`` and granted to acme, the application's ``orders`` table beside; ``base``: where on
    the receiver its hooks are."""

    url: str
    box: Outbox
    base: str


@dataclass(frozen=True)
class Stored:
    """What the database holds, read through a connection of its own."""

    orders: list[int]
    intents: dict[str, Any]  # action_id -> payload
    topic_events: list[str]  # event ids
    history: dict[str, list[str]]  # action_id -> its events' kinds, in order


async def stored(url: str) -> Stored:
    orders = [n for (n,) in await rows(url, "SELECT id FROM orders ORDER BY id")]
    intents = {a: json.loads(p) for a, p in await rows(  # (an event's intent sends the payload its event's row holds)
        url, "SELECT i.action_id, coalesce((SELECT e.payload FROM topic_events e WHERE e.seq = i.payload_event), "
             "i.payload) FROM intents i ORDER BY i.seq")}
    topic_events = [e for (e,) in await rows(url, "SELECT event_id FROM topic_events ORDER BY seq")]
    history: dict[str, list[str]] = {}
    for action_id, kind in await rows(url, "SELECT i.action_id, e.kind FROM events e JOIN intents i "
                                           "ON i.seq = e.intent_seq ORDER BY e.id"):
        history.setdefault(action_id, []).append(kind)
    return Stored(orders, intents, topic_events, history)


NOTHING = Stored([], {}, [], {})
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def order(n: int, **fields: Any) -> dict[str, Any]:
    """The intent of order ``n``: an invoice to ``hook``, for acme, its action id ``order-n``."""
    return {"destination": "hook", "scope": "acme", "action_id": f"order-{n}", "payload": {"order": n}, **fields}


@pytest.fixture(scope="module")
def shared_receiver() -> Iterator[Receiver]:
    """One receiver for the module; each test's hooks are under a path of its own."""
    with Receiver() as receiver:
        yield receiver


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> type[App]:
    return KINDS[request.param]


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """One PostgreSQL database for the module's tests, migrated once (made and dropped per test,
    they took as long as the rest of the module)."""

    async def migrated() -> str:
        url = await pg.create_database()
        await (await Outbox.open(url, settings=Settings(secrets_key_file=pg.key_file()))).close()
        return url

    with ThreadPoolExecutor(1) as thread:  # (asked for while a test's event loop runs)
        url = thread.submit(asyncio.run, migrated()).result()
        try:
            yield url
        finally:
            thread.submit(asyncio.run, pg.drop_database(url)).result()


async def emptied(url: str) -> None:
    """Every row of the outbox's tables gone but its schema's and key's, and the app's table."""
    conn = await asyncpg.connect(url)
    try:
        tables = [t for (t,) in await conn.fetch(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' "
            "AND table_name NOT IN ('schema_migrations', 'secrets_key', 'orders')")]
        await conn.execute("SET lock_timeout = '10s'")  # (a connection a test left open fails the next, not hangs)
        await conn.execute(f"DROP TABLE IF EXISTS orders; TRUNCATE {', '.join(tables)} RESTART IDENTITY")
    finally:
        await conn.close()


@pytest.fixture
async def url(kind: type[App], db_url: str, request: pytest.FixtureRequest,
              monkeypatch: pytest.MonkeyPatch) -> str:
    """The store the kind applies to, empty: a SQLite file, or the module's PostgreSQL database."""
    if kind.store == "sqlite":
        return db_url
    url = str(request.getfixturevalue("pg_database"))
    monkeypatch.setenv(*pg.key_env().popitem())
    await emptied(url)
    return url


@pytest.fixture
async def service(url: str, shared_receiver: Receiver) -> AsyncIterator[Service]:
    base = f"/{uuid.uuid4().hex}"
    for path in ("hook", "audit"):
        shared_receiver.script(f"{base}/{path}", Reply(200))
    box = await Outbox.open(url)
    try:
        for name in ("hook", "audit"):
            await box.put_destination(name, DestinationSpec(
                url=f"{shared_receiver.url}{base}/{name}", secret=SECRET, allow_private_network=True,
                subscriptions=[{"topic": "order.*"}]))
        await box.put_destination("mail", DestinationSpec(channel="email", host="smtp.example.com",
                                                          subscriptions=[{"topic": "order.*"}],
                                                          **{"from": "shop@example.com"}))
        await box.put_grant("acme", GrantSpec(scope="acme", destination="*"))
        await rows(url, ORDERS)
        yield Service(url, box, base)
    finally:
        await box.close()


@pytest.fixture
async def app(kind: type[App], service: Service) -> AsyncIterator[App]:
    """The kind's connection to the service's database, as the application opens it."""
    app = kind(service.url)
    await app.connect()
    try:
        yield app
    finally:
        await app.close()


# -- (a) and (b) with the service's worker: committed, delivered once; rolled back, never sent --------


def wait_for_line(log: Path, text: str, timeout: float = 20) -> None:
    """Block until the worker's log has a line with ``text``."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in the worker's log:\n{log.read_text()}"
        time.sleep(0.02)


@pytest.mark.acceptance
async def test_a_committed_intent_is_delivered_once_by_a_worker_process_and_a_rolled_back_one_never(
        app: App, service: Service, shared_receiver: Receiver, tmp_path: Path) -> None:
    """The worker is another process, already waiting (polling only every 5 s), when the
    application commits: it learns of the commit from the database (SQLite's data_version,
    PostgreSQL's NOTIFY at commit)."""
    hook = f"{service.base}/hook"
    env = clean_env(OUTBOX_DATABASE_URL=service.url, OUTBOX_POLL_SECONDS="5")
    with outbox_worker(tmp_path, env) as (worker, log):
        wait_for_line(log, "started")
        with pytest.raises(Boom):
            async with app.transaction():
                await app.insert(1)
                await app.enqueue(**order(1))
                raise Boom
        async with app.transaction():
            await app.insert(2)
            assert (await app.enqueue(**order(2))).created
        committed = time.monotonic()
        (request,) = await shared_receiver.wait_for_requests(1, hook, timeout=20)
        latency = request.at - committed
        assert (await service.box.wait("order-2", timeout=10, scope="acme")).status is Status.DELIVERED
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0, log.read_text()
    assert request.headers["idempotency-key"] == "acme/order-2" and request.json() == {"order": 2}
    assert shared_receiver.requests(hook) == [request]  # once, and order-1 never
    now = await stored(service.url)
    assert now.orders == [2] and now.intents == {"order-2": {"order": 2}}
    assert latency < 5, f"delivered {latency:.2f} s after the commit: the worker polled, nothing woke it"


# -- the same results as the library's ----------------------------------------------------------------


def as_twin(intent: Intent) -> Intent:
    """``intent`` without what tells two enqueues of the same fields apart."""
    return replace(intent, seq=0, action_id="-", created_at=EPOCH, updated_at=EPOCH, next_attempt_at=EPOCH)


async def test_what_the_app_enqueues_is_what_the_library_would_have_stored_whatever_its_connection_is_set_to(
        app: App, service: Service) -> None:
    """The stack's common settings on the connection (``App.customize``: row factories, JSON codecs
    and loaders, a session time zone) change nothing the outbox writes or answers."""
    await app.customize()
    later = datetime.now(UTC).replace(microsecond=123456) + timedelta(hours=1)
    fields: dict[str, Any] = {
        "destination": "hook", "scope": "acme", "payload": {"order": 1, "note": "ünïcödé ☃", "big": 2 ** 53 - 1,
                                                            "lines": [{"sku": "a", "qty": 1.5}, None]},
        "ordering_key": "customer-7", "not_before": later, "expires_at": later + timedelta(days=1),
        "max_attempts": 5, "trace_context": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
    event = {key: fields[key] for key in ("scope", "payload", "ordering_key", "not_before", "max_attempts")}
    async with app.transaction():
        await app.insert(1)
        made = await app.enqueue(action_id="app-1", **fields)
        again = await app.enqueue(action_id="app-1", **fields)
        many = await app.enqueue_many([{**fields, "action_id": "app-2"}]) if app.many else []
        published = await app.publish(topic="order.placed", event_id="e-app", **event)
    box = service.box
    library = await box.enqueue(action_id="lib-1", **fields)
    library_published = await box.publish(topic="order.placed", event_id="e-lib", **event)
    assert published.event == await box.get_event("e-app", scope="acme")
    assert replace(published.event, seq=0, event_id="-", created_at=EPOCH, fanout=()) == \
           replace(library_published.event, seq=0, event_id="-", created_at=EPOCH, fanout=())
    assert [(d.destination, d.status) for d in published.event.fanout] == \
           [(d.destination, d.status) for d in library_published.event.fanout]
    read = await box.history("app-1", scope="acme")
    assert read.intent == made.intent and made.created and not again.created
    assert again.intent == made.intent
    assert as_twin(made.intent) == as_twin(library.intent)
    assert [(e.kind, e.actor, e.reason, e.data) for e in read.events] == \
           [(e.kind, e.actor, e.reason, e.data) for e in (await box.history("lib-1", scope="acme")).events]
    for result in many:
        assert as_twin(result.intent) == as_twin(library.intent) and result.intent == await box.get("app-2")


# -- (b) rollback ------------------------------------------------------------------------------------


async def test_a_rolled_back_transaction_stores_nothing(app: App, service: Service) -> None:
    with pytest.raises(Boom):
        async with app.transaction():
            await app.insert(1)
            await app.enqueue(**order(1))
            await app.publish(scope="acme", topic="order.placed", event_id="e-1", payload={"order": 1})
            if app.many:
                await app.enqueue_many([order(2), order(3)])
            raise Boom
    assert await stored(service.url) == NOTHING


async def test_an_enqueue_that_opens_the_transaction_commits_and_rolls_back_with_it(app: App, service: Service) -> None:
    """The outbox's statements are the transaction's first: where the stack begins a transaction at
    its first statement (sqlite3, psycopg2, SQLAlchemy's autobegin), the outbox begins it (on
    SQLite IMMEDIATE), and the application's writes after it share it."""
    with pytest.raises(Boom):
        async with app.transaction():
            await app.enqueue(**order(1))
            await app.insert(1)
            raise Boom
    async with app.transaction():
        await app.enqueue(**order(2))
        await app.insert(2)
    async with app.transaction():
        await app.publish(scope="acme", topic="order.placed", event_id="e-3", payload={"order": 3})
        await app.insert(3)
    if app.many:
        with pytest.raises(Boom):
            async with app.transaction():
                await app.enqueue_many([order(4)])
                await app.insert(4)
                raise Boom
    now = await stored(service.url)
    assert now.orders == [2, 3] and now.topic_events == ["e-3"]
    assert now.intents.pop("order-2") == {"order": 2} and list(now.intents.values()) == [{"order": 3}] * 2


# -- (c) a refusal inside the transaction ------------------------------------------------------------


async def test_a_refused_enqueue_raises_and_the_rest_commits_when_the_app_catches_it(
        app: App, service: Service) -> None:
    async with app.transaction():
        await app.insert(1)
        assert (await app.enqueue(**order(1))).created
        with pytest.raises(IntentConflict):  # the same action id, another payload
            await app.enqueue(**order(1, payload={"order": 99}))
        with pytest.raises(UnknownDestination, match="nowhere"):
            await app.enqueue(**order(2, destination="nowhere"))
        with pytest.raises(InvalidInput, match="email"):  # no "to", no "subject": mail cannot carry it
            await app.enqueue(**order(3, destination="mail"))
        assert not (await app.enqueue(**order(1))).created  # the same operation again
        await app.insert(4)
        assert (await app.enqueue(**order(4))).created
    now = await stored(service.url)
    assert now.orders == [1, 4]
    assert now.intents == {"order-1": {"order": 1}, "order-4": {"order": 4}}
    assert now.history == {"order-1": [EventKind.ENQUEUED.value], "order-4": [EventKind.ENQUEUED.value]}


async def test_a_refusal_of_an_intent_committed_earlier_spoils_nothing_and_uncaught_rolls_back_all(
        app: App, service: Service) -> None:
    async with app.transaction():
        await app.insert(1)
        await app.enqueue(**order(1))
    async with app.transaction():
        await app.insert(2)
        with pytest.raises(IntentConflict):
            await app.enqueue(**order(1, payload={"order": 2}))
        await app.enqueue(**order(2))
    with pytest.raises(IntentConflict):  # not caught by the app: its whole transaction rolls back
        async with app.transaction():
            await app.insert(3)
            await app.enqueue(**order(3))
            await app.enqueue(**order(1, destination="audit"))
    now = await stored(service.url)
    assert now.orders == [1, 2] and now.intents == {"order-1": {"order": 1}, "order-2": {"order": 2}}


# -- (d) savepoints ----------------------------------------------------------------------------------


async def test_a_rolled_back_savepoint_takes_its_intent_and_keeps_the_rest(app: App, service: Service) -> None:
    async with app.transaction():
        await app.insert(1)
        await app.enqueue(**order(1))
        with pytest.raises(Boom):
            async with app.savepoint():
                await app.insert(2)
                await app.enqueue(**order(2))
                await app.publish(scope="acme", topic="order.placed", event_id="e-2", payload={"order": 2})
                raise Boom
        async with app.savepoint():
            await app.insert(3)
            await app.enqueue(**order(3))
        await app.enqueue(**order(4))
    now = await stored(service.url)
    assert now.orders == [1, 3] and list(now.intents) == ["order-1", "order-3", "order-4"]
    assert now.topic_events == []


# -- (e) enqueue_many --------------------------------------------------------------------------------


#: The kinds with an ``enqueue_many`` (``Outbox.transaction``'s has none).
MANY = pytest.mark.parametrize("kind", [name for name, k in KINDS.items() if k.many], indirect=True)


@MANY
async def test_enqueue_many_is_all_or_none_inside_the_transaction(app: App, service: Service) -> None:
    async with app.transaction():
        await app.insert(1)
        with pytest.raises(UnknownDestination):  # the last one refused: none of the three written
            await app.enqueue_many([order(1), order(2), order(3, destination="nowhere")])
        with pytest.raises(InvalidInput, match="email"):
            await app.enqueue_many([order(1), order(3, destination="mail")])
        await app.enqueue(**order(9))
        with pytest.raises(IntentConflict):  # refused after its insert: undone to the outbox's savepoint
            await app.enqueue_many([order(1), order(9, payload={"order": 0})])
        made = await app.enqueue_many([order(1), order(2), order(9)])
        assert [r.created for r in made] == [True, True, False]
        await app.insert(2)
    now = await stored(service.url)
    assert now.orders == [1, 2] and list(now.intents) == ["order-9", "order-1", "order-2"]
    assert all(kinds == [EventKind.ENQUEUED.value] for kinds in now.history.values())


#: A fault of the database itself, part way through an enqueue_many: the first event of order
#: "boom"'s intent cannot be written (after the intents' insert, on SQLite a statement of its own).
BOOM = {
    "sqlite": ["""CREATE TRIGGER boom BEFORE INSERT ON events
                 WHEN (SELECT action_id FROM intents WHERE seq = NEW.intent_seq) = 'order-boom'
                 BEGIN SELECT RAISE(ABORT, 'injected: the disk is full'); END"""],
    "postgres": ["""CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$
                   BEGIN
                       IF (SELECT action_id FROM intents WHERE seq = NEW.intent_seq) = 'order-boom' THEN
                           RAISE EXCEPTION 'injected: the disk is full';
                       END IF;
                       RETURN NEW;
                   END $$""",
                 "CREATE TRIGGER boom BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION boom()"],
}
#: What takes the fault away again.
UNBOOM = {"sqlite": ["DROP TRIGGER boom"], "postgres": ["DROP TRIGGER boom ON events", "DROP FUNCTION boom()"]}


@MANY
async def test_enqueue_many_leaves_nothing_of_itself_when_the_database_fails_part_way(
        app: App, service: Service) -> None:
    """Undone to its savepoint, whatever the error: no intent without its first event on SQLite,
    and on PostgreSQL a transaction the application can go on with."""
    for statement in BOOM[app.store]:
        await rows(service.url, statement)
    try:
        async with app.transaction():
            await app.insert(1)
            with pytest.raises(Exception, match="injected"):
                await app.enqueue_many([order(2), order("boom")])
            await app.insert(2)
        now = await stored(service.url)
        assert now.orders == [1, 2] and now.intents == {} and now.history == {}
    finally:
        for statement in UNBOOM[app.store]:
            await rows(service.url, statement)


# -- (f) publish -------------------------------------------------------------------------------------


async def test_a_publish_fans_out_and_commits_or_rolls_back_with_the_transaction(
        app: App, service: Service) -> None:
    with pytest.raises(Boom):
        async with app.transaction():
            await app.insert(1)
            await app.publish(scope="acme", topic="order.placed", event_id="e-1", payload={"order": 1})
            raise Boom
    assert await stored(service.url) == NOTHING
    async with app.transaction():
        await app.insert(1)
        published = await app.publish(scope="acme", topic="order.placed", event_id="e-1", payload={"order": 1})
        assert published.created
        assert [(d.destination, d.status, bool(d.skipped)) for d in published.event.fanout] == [
            ("audit", Status.PENDING, False), ("hook", Status.PENDING, False), ("mail", None, True)]
        with pytest.raises(IntentConflict):
            await app.publish(scope="acme", topic="order.placed", event_id="e-1", payload={"order": 2})
        assert not (await app.publish(scope="acme", topic="order.placed", event_id="e-1",
                                      payload={"order": 1})).created
    now = await stored(service.url)
    assert now.orders == [1] and now.topic_events == ["e-1"]
    assert sorted(now.intents.values(), key=repr) == [{"order": 1}, {"order": 1}] and len(now.intents) == 2
    assert await service.box.get_event("e-1", scope="acme") == published.event


# -- (g) no transaction ------------------------------------------------------------------------------


async def test_a_connection_with_no_transaction_open_is_refused_and_nothing_is_written(
        kind: type[App], service: Service) -> None:
    app = kind(service.url)
    await app.connect(autocommit=True)
    try:
        with pytest.raises(NoTransaction, match="commit at once and alone") as refused:
            await app.enqueue(**order(1))
        assert re.search(app.advice, str(refused.value)), refused.value  # what helps on this stack
        with pytest.raises(NoTransaction):
            await app.publish(scope="acme", topic="order.placed", event_id="e-1", payload={"order": 1})
        if app.many:
            with pytest.raises(NoTransaction):
                await app.enqueue_many([order(2)])
    finally:
        await app.close()
    assert await stored(service.url) == NOTHING


async def test_in_autocommit_mode_the_enqueue_joins_a_transaction_the_stack_begins_and_else_is_refused(
        kind: type[App], service: Service) -> None:
    """The remedy NoTransaction advises: where the stack's transaction block begins one on a
    connection in autocommit mode, the enqueue commits and rolls back with it; where the block
    begins none (the application's rows commit one by one), the enqueue is refused."""
    app = kind(service.url)
    await app.connect(autocommit=True)

    async def enqueue(n: int) -> None:
        if app.begins_in_autocommit:
            await app.enqueue(**order(n))
        else:
            with pytest.raises(NoTransaction):
                await app.enqueue(**order(n))

    try:
        async with app.transaction():
            await app.insert(1)
            await enqueue(1)
        with pytest.raises(Boom):
            async with app.transaction():
                await app.insert(2)
                await enqueue(2)
                raise Boom
    finally:
        await app.close()
    now = await stored(service.url)
    if app.begins_in_autocommit:
        assert now.orders == [1] and list(now.intents) == ["order-1"]
    else:
        assert now.orders[0] == 1 and now.intents == {}  # each row committed alone (a session's 2 never flushed)
