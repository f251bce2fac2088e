"""SQLAlchemy's scoped sessions (``scoped_session``, which Flask-SQLAlchemy's ``db.session`` is,
and ``async_scoped_session``) are taken as the session they stand for: the intent commits or
rolls back with the scope's session, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_scoped_session, async_sessionmaker, create_async_engine
from sqlalchemy.orm import scoped_session, sessionmaker

from outbox import AsyncProducer, Producer

from ..conftest import open_box, rows


def engine_url(store_url: str, driver: str) -> str:
    """The store's database as SQLAlchemy names it with ``driver`` (pysqlite, aiosqlite, psycopg, asyncpg)."""
    scheme, rest = store_url.split("://", 1)
    return f"{scheme}+{driver}://{rest}"


async def stored(url: str) -> list[str]:
    return sorted(row[0] for row in await rows(url, "SELECT action_id FROM intents"))


async def test_a_scoped_session_enqueues_in_its_sessions_transaction(store_url: str):
    await (await open_box(store_url)).close()  # (migrated, with the destination 'billing')
    engine = create_engine(engine_url(store_url, "pysqlite" if store_url.startswith("sqlite") else "psycopg"))
    db = scoped_session(sessionmaker(engine))
    producer = Producer()
    try:
        with db.begin():
            db.execute(text("SELECT 1"))
            sent = producer.enqueue(db, destination="billing", scope="acme", action_id="kept", payload={"n": 1})
        with pytest.raises(RuntimeError), db.begin():
            producer.enqueue(db, destination="billing", scope="acme", action_id="undone", payload={"n": 2})
            raise RuntimeError("roll back")
    finally:
        db.remove()
        engine.dispose()
    assert sent.created
    assert await stored(store_url) == ["kept"]


async def test_an_async_scoped_session_enqueues_in_its_sessions_transaction(store_url: str):
    await (await open_box(store_url)).close()
    engine = create_async_engine(engine_url(store_url, "aiosqlite" if store_url.startswith("sqlite") else "asyncpg"))
    db = async_scoped_session(async_sessionmaker(engine), scopefunc=asyncio.current_task)
    producer = AsyncProducer()
    try:
        async with db.begin():
            sent = await producer.enqueue(db, destination="billing", scope="acme", action_id="kept", payload={})
        with pytest.raises(RuntimeError):
            async with db.begin():
                await producer.enqueue(db, destination="billing", scope="acme", action_id="undone", payload={})
                raise RuntimeError("roll back")
    finally:
        await db.remove()
        await engine.dispose()
    assert sent.created
    assert await stored(store_url) == ["kept"]
