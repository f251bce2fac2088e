"""What an enqueue on the application's own connection costs it besides its own work, on real
databases: memory that does not grow with the enqueues made, and the statements it runs."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.types.datetime import TimestamptzLoader

from outbox import (
    AsyncProducer,
    DestinationSpec,
    IntentConflict,
    InvalidInput,
    Outbox,
    Producer,
    Settings,
    Status,
    UnknownDestination,
)
from outbox.store import IntentQuery
from sender.email import EmailSpec

from ..conftest import SECRET

SPEC = DestinationSpec(url="https://billing.example/hook", secret=SECRET)


async def registered(url: str) -> None:
    settings = Settings(database_url=url) if url.startswith("postgres") else None
    async with await Outbox.open(url, settings=settings) as box:
        await box.put_destination("billing", SPEC)


def intent(n: int) -> dict[str, object]:
    return {"destination": "billing", "scope": "acme", "action_id": f"order-{n}", "payload": {"order": n}}


async def test_psycopg_enqueues_keep_no_loader_per_cursor(pg_url: str) -> None:
    # psycopg keeps every loader class it is given; the outbox's must be made once, not per enqueue
    await registered(pg_url)
    with psycopg.connect(pg_url) as conn, conn.transaction():
        Producer().enqueue(conn, **intent(0))
        before = len(TimestamptzLoader.__subclasses__())
        for n in range(1, 51):
            Producer().enqueue(conn, **intent(n))
    async with await psycopg.AsyncConnection.connect(pg_url) as conn, conn.transaction():
        for n in range(51, 101):
            await AsyncProducer().enqueue(conn, **intent(n))
    assert len(TimestamptzLoader.__subclasses__()) == before


async def test_an_intent_made_on_psycopg_reads_back_whole(pg_url: str) -> None:
    await registered(pg_url)
    with psycopg.connect(pg_url) as conn, conn.transaction():
        made = Producer().enqueue(conn, **intent(1)).intent
        again = Producer().enqueue(conn, **intent(1))  # read back: the stored row, times and JSON
    assert not again.created and again.intent == made


# -- a producer's destinations as it last read them ---------------------------------------------


@contextmanager
def app_connection(url: str) -> Iterator[Any]:
    """The application's own connection to the outbox's database, in a transaction the block
    commits (a refusal caught inside leaves it usable)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            yield conn
            conn.commit()
        finally:
            conn.close()
        return
    with psycopg.connect(url) as pg, pg.transaction():
        yield pg


def rolled_back(url: str, producer: Producer, n: int) -> None:
    """An enqueue of ``producer`` in a transaction rolled back: the producer has read the
    destination, the database keeps nothing."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            producer.enqueue(conn, **intent(n))
        finally:
            conn.rollback()
            conn.close()
        return
    with psycopg.connect(url) as conn:
        producer.enqueue(conn, **intent(n))
        conn.rollback()


def words(sql: str) -> list[str]:
    """The words of ``sql`` past its comment lines."""
    return " ".join(line for line in sql.splitlines() if not line.lstrip().startswith("--")).split()


def traced(url: str, producer: Producer, n: int) -> list[str]:
    """The statements one enqueue of ``producer`` runs on a sqlite3 connection already in a
    transaction (the application's insert before it), by their first words."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    seen: list[str] = []
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO orders VALUES (?)", (n,))
        conn.set_trace_callback(lambda sql: seen.append(" ".join(words(sql)[:3])))
        producer.enqueue(conn, **intent(n))
        conn.set_trace_callback(None)
        conn.commit()
    finally:
        conn.close()
    return seen


async def test_a_producer_reads_a_destination_once_and_then_only_inserts(db_url: str) -> None:
    await registered(db_url)
    producer = Producer()
    first = traced(db_url, producer, 1)
    then = traced(db_url, producer, 2)
    assert first == ["DELETE FROM schema_migrations", "SELECT channel, requires_approval,",
                     "INSERT INTO intents", "INSERT INTO events"]
    assert then == ["DELETE FROM schema_migrations", "INSERT INTO intents", "INSERT INTO events"]


async def test_a_destination_changed_since_the_producer_read_it_is_read_again(store_url: str) -> None:
    async with await Outbox.open(store_url) as box:
        await box.put_destination("billing", SPEC)
        producer = Producer()
        with app_connection(store_url) as conn:
            assert producer.enqueue(conn, **intent(1)).intent.status is Status.PENDING
        await box.put_destination("billing", SPEC.model_copy(update={"requires_approval": True}))
        with app_connection(store_url) as conn:
            assert producer.enqueue(conn, **intent(2)).intent.status is Status.HELD
        assert [(await box.get(f"order-{n}")).status for n in (1, 2)] == [Status.PENDING, Status.HELD]


async def test_a_destination_gone_or_of_another_channel_refuses_as_if_read_first(store_url: str) -> None:
    mail = EmailSpec.model_validate({"channel": "email", "host": "mail.example", "from": "outbox@example.com"})
    async with await Outbox.open(store_url) as box:
        await box.put_destination("billing", SPEC)
        producer = Producer()
        rolled_back(store_url, producer, 1)  # the producer has read billing: a webhook
        await box.delete_destination("billing")
        await box.put_destination("billing", mail)
        with app_connection(store_url) as conn:
            with pytest.raises(InvalidInput, match="email channel"):  # judged by the channel it has now
                producer.enqueue(conn, **intent(1))
            conn.execute("SELECT 1")  # (the transaction is usable: nothing failed in SQL)
        await box.delete_destination("billing")
        with app_connection(store_url) as conn:
            with pytest.raises(UnknownDestination):
                producer.enqueue(conn, **intent(1))
            conn.execute("SELECT 1")
        assert (await box.list_intents(IntentQuery())).intents == []


async def test_the_same_operation_again_answers_as_stored(store_url: str) -> None:
    async with await Outbox.open(store_url) as box:
        await box.put_destination("billing", SPEC)
    producer = Producer()
    with app_connection(store_url) as conn:
        made = producer.enqueue(conn, **intent(1))
    with app_connection(store_url) as conn:
        again = producer.enqueue(conn, **intent(1))
        with pytest.raises(IntentConflict):
            producer.enqueue(conn, **{**intent(1), "payload": {"order": "another"}})
    assert made.created and not again.created and again.intent.seq == made.intent.seq
