"""pgqueuer doing the outbox benchmark's job: POST each queued payload to a receiver, done on a 2xx.

``bench_postgres.py`` runs this file with the Python of a virtualenv of the benchmark's own that
holds pgqueuer, aiohttp and asyncpg (pgqueuer is no dependency of the project, and this file
imports nothing of the project): once to install pgqueuer's schema, once to enqueue the jobs,
then as the consumer it times. The consumer is pgqueuer's quick-start shape, a ``PgQueuer`` on
one asyncpg connection (``AsyncpgDriver``) with one entrypoint, run by ``QueueManager.run`` (on
uvloop unless told otherwise, as ``pgq run`` runs it), with the batch size given and
``max_concurrent_tasks`` set to the benchmark's concurrency (at least two batches, which pgqueuer
requires): without that cap pgqueuer picks every queued job at once. Each job POSTs its payload
on one pooled aiohttp session (as many connections as the concurrency) and raises unless the
receiver answers 2xx, so a job is logged ``successful`` only after a 2xx; pgqueuer deletes
finished jobs from its queue and logs them in batches (``batch_size`` at a time, or every 0.1 s).

    python pgqueuer_job.py install DSN
    python pgqueuer_job.py enqueue DSN --n N --note TEXT
    python pgqueuer_job.py consume DSN --url URL --batch-size B --concurrency C [--loop asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

ENTRYPOINT = "post"
ENQUEUE_BATCH = 1_000
HEADERS = {"Content-Type": "application/json"}
REQUEST_TIMEOUT_SECONDS = 30.0


def body(i: int, note: str) -> bytes:
    """The same JSON the outbox benchmark enqueues: ``{"order": i, "note": note}``."""
    return json.dumps({"order": i, "note": note}, separators=(",", ":")).encode()


async def install(dsn: str) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def enqueue(dsn: str, n: int, note: str) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        for lo in range(0, n, ENQUEUE_BATCH):
            stop = min(lo + ENQUEUE_BATCH, n)
            ids = await queries.enqueue([ENTRYPOINT] * (stop - lo), [body(i, note) for i in range(lo, stop)],
                                        [0] * (stop - lo))
            if len(ids) != stop - lo:
                raise SystemExit(f"enqueue returned {len(ids)} ids for {stop - lo} jobs")
    finally:
        await conn.close()


async def consume(dsn: str, url: str, batch_size: int, concurrency: int) -> None:
    import aiohttp
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job

    conn = await asyncpg.connect(dsn)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                    timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS))
    try:
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint(ENTRYPOINT)
        async def post(job: Job) -> None:
            async with session.post(url, data=job.payload, headers=HEADERS) as response:
                await response.read()
                if not 200 <= response.status < 300:
                    raise RuntimeError(f"the receiver answered {response.status}")

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, pgq.shutdown.set)
        tasks = max(concurrency, 2 * batch_size)  # pgqueuer refuses fewer than two batches
        print(f"consuming: batch_size={batch_size}, max_concurrent_tasks={tasks}", flush=True)
        await pgq.qm.run(batch_size=batch_size, max_concurrent_tasks=tasks)
    finally:
        await session.close()
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["install", "enqueue", "consume"])
    parser.add_argument("dsn")
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--note", default="")
    parser.add_argument("--url")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args(argv)
    work: Any
    if args.command == "install":
        work = install(args.dsn)
    elif args.command == "enqueue":
        work = enqueue(args.dsn, args.n, args.note)
    else:
        if not args.url:
            parser.error("consume needs --url")
        work = consume(args.dsn, args.url, args.batch_size, args.concurrency)
    if args.loop == "uvloop" and args.command == "consume":
        import uvloop

        uvloop.run(work)
    else:
        asyncio.run(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
