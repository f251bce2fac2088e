"""What an enqueue on the application's own connection costs it besides its own work, on real
databases: memory that does not grow with the enqueues made, and the statements it runs."""

from __future__ import annotations

import psycopg
from psycopg.types.datetime import TimestamptzLoader

from outbox import AsyncProducer, DestinationSpec, Outbox, Producer, Settings

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
