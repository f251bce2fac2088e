"""The fault matrix's Redis Streams row (tier 1), on the same checker and truth table as the
others: a real ``sender.Worker`` adds entries to a stream on a private redis-server (append-only,
fsynced at every write, so an entry it acknowledged is on disk), in rounds, each bringing a fault
drawn from the seed (every fault at least once):

- killed before a send: nothing can be written, so not submitted, then added once it is back;
- SIGSTOPped once connected: the script calls are written and never answered in time (maybe
  submitted); woken, the server runs them, and the retries are answered with those entries;
- SIGKILLed mid-stream: a larger round, the server killed once some of its entries are in the
  stream; what it acknowledged must survive the restart, what it did not is sent again;
- killed after acknowledged entries: they must be in the stream after the restart.

The ground truth is the stream: each intent's entries, by their ``idempotency-key`` (the server's
dedupe makes a resend add nothing, so every intent must be there exactly once, no consumer's
deduplication needed), and the attempts that reached it, by their ``outbox-attempt-id``.
``--faults=long`` runs more rounds with a random seed; ``--faults-seed`` replays one.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import Counter
from pathlib import Path

import pytest

from outbox import Outbox, Settings
from receivers import wire
from sender import Worker
from sender.redis import RedisChannel, RedisSpec

from ..conftest import SECRET
from ..redis_servers import RedisServer
from .checker import Truth, check, off_diagonal, truth_table
from .tables import store_name
from .test_matrix import facts, report, settled, tier
from .test_matrix_channels import attempted

STREAM = "orders"
KILLED = "killed before a send"
SILENT = "silent once connected"
MID_STREAM = "killed mid-stream"
ACKED = "killed after acknowledged entries"
FAULTS = (KILLED, SILENT, MID_STREAM, ACKED)


async def stream_truth(server: RedisServer) -> tuple[Truth, Counter[str]]:
    """The effects per key (entries carrying it) and the attempts that reached the stream."""
    client = server.client()
    try:
        found = await client.xrange(STREAM)
    finally:
        await client.aclose()
    keys = Counter(fields[wire.KAFKA_IDEMPOTENCY_KEY.encode()].decode() for _, fields in found)
    reached = frozenset(fields[wire.KAFKA_ATTEMPT_ID.encode()].decode() for _, fields in found)
    return Truth(dict(keys), reached, idempotent=True), keys


async def length(server: RedisServer) -> int:
    client = server.client()
    try:
        return int(await client.xlen(STREAM))
    finally:
        await client.aclose()


async def test_server_faults_lose_duplicate_or_misreport_nothing(
        request: pytest.FixtureRequest, store_url: str, tmp_path: Path) -> None:
    long, seed = tier(request)
    rng = random.Random(seed)
    store = store_name(store_url)
    rounds = [*FAULTS, *rng.choices([None, *FAULTS], k=12 if long else 2)]
    rng.shuffle(rounds)
    server = RedisServer(tmp_path).start()
    settings = Settings(authority="allow-all", backoff_initial_seconds=0.05, backoff_cap_seconds=0.3,
                        circuit_failures=0, poll_seconds=0.1, default_max_attempts=100)
    box = await Outbox.open(store_url, settings=settings)
    worker = Worker(box, channels={"redis": RedisChannel()}, concurrency=4)
    keys: list[tuple[str, str]] = []
    acked: list[str] = []  # delivered before the server was killed: their entries must survive it
    faults: Counter[str] = Counter()

    async def enqueue(prefix: str, size: int | None = None) -> list[tuple[str, str]]:
        batch = [(e.intent.scope, e.intent.action_id) for e in await box.enqueue_many(
            {"destination": "log", "scope": "acme", "action_id": f"{prefix}-{n}", "payload": {"n": n}}
            for n in range(size or rng.randint(2, 5)))]
        keys.extend(batch)
        return batch

    def pid() -> int:
        assert server.process is not None
        return server.process.pid

    try:
        await box.put_destination("log", RedisSpec.model_validate({
            "channel": "redis", "host": "127.0.0.1", "port": server.port, "stream": STREAM,
            "allow_private_network": True, "timeout_seconds": 0.5, "secret": SECRET}))
        task = asyncio.create_task(worker.run())
        try:
            for number, fault in enumerate([None, *rounds]):
                faults[fault or ("warm-up" if number == 0 else "none")] += 1
                if fault == KILLED:
                    await asyncio.to_thread(server.stop)
                    await attempted(box, batch := await enqueue(f"r{number}"))
                    await asyncio.to_thread(server.start)
                elif fault == SILENT:
                    # one intent delivered first, so the pool holds a connection the next calls are written on
                    assert await settled(box, await enqueue(f"r{number}-connect", 1), timeout=30) == []
                    os.kill(pid(), signal.SIGSTOP)
                    try:
                        await attempted(box, batch := await enqueue(f"r{number}"))
                    finally:
                        os.kill(pid(), signal.SIGCONT)
                elif fault == MID_STREAM:
                    before = await length(server)
                    batch = await enqueue(f"r{number}", 60)
                    while await length(server) < before + rng.randint(1, 20):
                        await asyncio.sleep(0.005)
                    await asyncio.to_thread(server.stop)
                    await attempted(box, batch)
                    await asyncio.to_thread(server.start)
                else:
                    batch = await enqueue(f"r{number}")
                assert await settled(box, batch, timeout=30) == [], f"seed {seed}, round {number}: {fault}"
                if fault == ACKED:
                    await asyncio.to_thread(server.stop)
                    await asyncio.to_thread(server.start)
                    acked.extend(f"{s}/{a}" for s, a in batch)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 15)
        history = await facts(box, keys)
        truth, entries = await stream_truth(server)
    finally:
        await worker.aclose()
        await box.close()
        server.stop()
    table = truth_table(history, truth)
    submissions = Counter(a.submission for i in history for a in i.attempts)
    title = (f"{len(keys)} intents, seed {seed}, {sum(entries.values())} entries, rounds: "
             + ", ".join(f"{k} {n}" for k, n in faults.items())
             + "; attempts: " + ", ".join(f"{k} {n}" for k, n in sorted(submissions.items(), key=str)))
    rendered = report("redis", store, title, table)
    assert check(history, truth) == [], f"seed {seed}"
    assert off_diagonal(table) == 0, f"seed {seed}\n{rendered}"
    assert all(fact.status == "delivered" for fact in history), f"seed {seed}\n{rendered}"
    assert entries == Counter(f"{s}/{a}" for s, a in keys), f"seed {seed}: not every intent exactly once"
    assert [key for key in acked if entries.get(key) != 1] == [], f"seed {seed}: acknowledged entries lost"
    assert submissions["not_submitted"] > 0 and submissions["maybe_submitted"] > 0, f"seed {seed}\n{rendered}"
