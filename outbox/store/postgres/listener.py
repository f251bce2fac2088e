"""The PostgreSQL store's wake-ups: a dedicated connection LISTENs for what the statements that
make an intent pending notify at commit (``sql/postgres.sql``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from .connection import ended_before
from .sql import SQL

log = logging.getLogger("outbox.store")

#: What the statements that make an intent pending notify (sql/postgres.sql), and ``listen`` hears.
CHANNEL = "outbox_due"
#: How the listening connection shows in ``pg_stat_activity``.
LISTENER = "outbox listener"
#: A quiet listening connection proves it is still there this often: a silent network loss
#: (no reset, no close) is found within about twice this.
KEEPALIVE_SECONDS = 30.0
#: The pause before listening again after a lost connection, doubling while connecting fails.
RELISTEN_SECONDS = (0.1, 30.0)


async def _start_listening(conn: asyncpg.Connection, wake: Callable[[], None]) -> asyncio.Event:
    """LISTEN on ``conn``, calling ``wake`` on each notification; returns what is set once the
    connection is lost."""
    lost = asyncio.Event()
    conn.add_termination_listener(lambda _: lost.set())
    await conn.add_listener(CHANNEL, lambda *_: wake())
    return lost


async def _hang_up(conn: asyncpg.Connection) -> None:
    """Close ``conn``, politely if the server still answers, else by dropping it."""
    try:
        await conn.close(timeout=5)
    except Exception:
        conn.terminate()


async def listen(dsn: str, wake: Callable[[], None]) -> None:
    """Call ``wake`` whenever a transaction that made an intent pending (an enqueue, a replay,
    a retry) commits, in any process, until cancelled. A dedicated connection LISTENs; when it is lost (the
    server restarted, the network broke) another is made, and ``wake`` is called each time
    one starts listening, since whatever was notified meanwhile went unheard. Workers still
    poll, so a listener that cannot connect only delays them."""
    pause = RELISTEN_SECONDS[0]
    while True:
        try:
            conn = await asyncpg.connect(dsn, server_settings={"application_name": LISTENER})
        except Exception as exc:  # the next try may work; polling covers the gap
            log.warning("cannot listen for due intents (%s); trying again in %.1fs", exc, pause)
        else:
            failure: Exception | None = None
            try:
                lost = await _start_listening(conn, wake)
                pause = RELISTEN_SECONDS[0]
                wake()
                while not lost.is_set():
                    try:
                        await asyncio.wait_for(lost.wait(), KEEPALIVE_SECONDS)
                    except TimeoutError:
                        await conn.fetchval(SQL["ping"], timeout=KEEPALIVE_SECONDS)
            except Exception as exc:  # refused as the server ended the session: lost, like the rest
                failure = None if ended_before(exc, conn) else exc
            finally:
                await _hang_up(conn)
            if failure is None:
                log.warning("the connection listening for due intents was lost; listening again")
            else:
                log.warning("listening for due intents failed (%s); listening again", failure)
        await asyncio.sleep(pause)
        pause = min(pause * 2, RELISTEN_SECONDS[1])
