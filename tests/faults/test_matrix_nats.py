"""The fault matrix's NATS JetStream row (tier 1), on the same checker and truth table as the
other rows, with a private ``nats-server -js`` (its own port and store directory) that the test
kills and starts again while a real ``sender.Worker`` publishes to it.

Rounds of intents, each bringing a fault drawn from the seed (every fault at least once):

- the server killed (SIGKILL) before a send: nothing can leave, so not submitted, then published
  once it is back;
- the server stopped (SIGSTOP) once the connection is up: the publishes are written and never
  acknowledged, so maybe submitted; once it runs again it stores them, and the resend is dropped
  by JetStream's duplicate window (answered duplicate: delivered);
- the server killed in the middle of a stream of publishes and started again on the same store:
  what it acknowledged must still be there, and everything else is published again.

The ground truth is the stream itself: each intent's message must be there exactly once (the
duplicate window, keyed on Nats-Msg-Id, drops every resend), and each attempt whose message is
in the stream reached the server.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import Counter
from pathlib import Path

import pytest

from outbox import Outbox, Settings, Status
from receivers import wire
from sender import Worker
from sender.nats import NatsChannel, NatsSpec

from ..conftest import SECRET
from ..nats import NatsServer, Stream
from .checker import Truth, check, off_diagonal, truth_table
from .tables import store_name
from .test_matrix import facts, report, settled, tier
from .test_matrix_channels import attempted

KILLED = "killed before a send"  # nothing can leave: not submitted, then published once it is back
SILENT = "stopped once connected"  # SIGSTOP: published, never acknowledged: maybe submitted
MIDSTREAM = "killed mid-stream"  # SIGKILL while a stream of publishes is in flight, then started again
FAULTS = (KILLED, SILENT, MIDSTREAM)


async def stream_truth(stream: Stream) -> tuple[Truth, int]:
    """The effects by idempotency key (the messages the stream holds, each an effect), the attempts
    whose message reached it, and how many messages it holds."""
    messages = await stream.messages()
    effects = Counter(m.headers[wire.KAFKA_IDEMPOTENCY_KEY] for m in messages)
    reached = frozenset(m.headers[wire.KAFKA_ATTEMPT_ID] for m in messages)
    return Truth(dict(effects), reached, idempotent=True), len(messages)


async def delivered_any(box: Outbox, keys: list[tuple[str, str]]) -> bool:
    return any([(await box.get(a, scope=s)).status is Status.DELIVERED for s, a in keys])


async def test_server_faults_lose_duplicate_or_misreport_nothing(
        request: pytest.FixtureRequest, store_url: str, tmp_path: Path) -> None:
    long, seed = tier(request)
    rng = random.Random(seed)
    store = store_name(store_url)
    rounds = [*FAULTS, *rng.choices([None, *FAULTS], k=12 if long else 2)]
    rng.shuffle(rounds)
    server = NatsServer(tmp_path).start()
    settings = Settings(authority="allow-all", backoff_initial_seconds=0.05, backoff_cap_seconds=0.3,
                        circuit_failures=0, poll_seconds=0.1, default_max_attempts=100)
    box = await Outbox.open(store_url, settings=settings)
    worker = Worker(box, channels={"nats": NatsChannel()}, concurrency=4)
    keys: list[tuple[str, str]] = []
    acked: list[str] = []  # delivered before the server was killed: their messages must survive it
    faults: Counter[str] = Counter()

    async def enqueue(prefix: str, size: int | None = None) -> list[tuple[str, str]]:
        batch = [(e.intent.scope, e.intent.action_id) for e in await box.enqueue_many(
            {"destination": "events", "scope": "acme", "action_id": f"{prefix}-{n}", "payload": {"n": n}}
            for n in range(size or rng.randint(2, 5)))]
        keys.extend(batch)
        return batch

    def pid() -> int:
        assert server.process is not None
        return server.process.pid

    try:
        async with Stream.made(server.url) as stream:
            await box.put_destination("events", NatsSpec.model_validate({
                "channel": "nats", "servers": [server.address], "subject": stream.subject,
                "allow_private_network": True, "timeout_seconds": 1.0, "secret": SECRET}))
            task = asyncio.create_task(worker.run())
            try:
                for number, fault in enumerate([None, *rounds]):
                    faults[fault or ("warm-up" if number == 0 else "none")] += 1
                    if fault == KILLED:
                        await asyncio.to_thread(server.stop)
                        await attempted(box, batch := await enqueue(f"r{number}"))
                        await asyncio.to_thread(server.start)
                    elif fault == SILENT:
                        # one intent delivered first: the connection is up (the round before may have
                        # killed the server), so the next publishes are written, unanswered
                        assert await settled(box, await enqueue(f"r{number}-connect", 1), timeout=30) == []
                        os.kill(pid(), signal.SIGSTOP)
                        try:
                            await attempted(box, batch := await enqueue(f"r{number}"))
                        finally:
                            os.kill(pid(), signal.SIGCONT)
                    elif fault == MIDSTREAM:  # killed once the first of the round is delivered
                        batch = await enqueue(f"r{number}", 40)
                        while not await delivered_any(box, batch):
                            await asyncio.sleep(0.01)
                        await asyncio.to_thread(server.stop)
                        await asyncio.sleep(0.3)  # (the sends meanwhile are refused at connect)
                        await asyncio.to_thread(server.start)
                    else:
                        batch = await enqueue(f"r{number}")
                    assert await settled(box, batch, timeout=30) == [], f"seed {seed}, round {number}: {fault}"
                    if fault in (None, SILENT):  # what it acknowledged must survive the next kill
                        acked.extend(f"{s}/{a}" for s, a in batch)
            finally:
                worker.stop()
                await asyncio.wait_for(task, 15)
            history = await facts(box, keys)
            truth, held = await stream_truth(stream)
    finally:
        await worker.aclose()
        await box.close()
        server.stop()
    table = truth_table(history, truth)
    submissions = Counter(a.submission for i in history for a in i.attempts)
    title = (f"{len(keys)} intents, seed {seed}, {held} messages, rounds: "
             + ", ".join(f"{k} {n}" for k, n in faults.items())
             + "; attempts: " + ", ".join(f"{k} {n}" for k, n in sorted(submissions.items(), key=str)))
    rendered = report("nats", store, title, table)
    assert check(history, truth) == [], f"seed {seed}"
    assert off_diagonal(table) == 0, f"seed {seed}\n{rendered}"
    assert all(fact.status == "delivered" for fact in history), f"seed {seed}\n{rendered}"
    # the duplicate window dropped every resend: each intent's message is in the stream once
    assert held == len(keys) and set(truth.effects.values()) == {1}, f"seed {seed}\n{rendered}"
    assert [key for key in acked if truth.effects.get(key) != 1] == [], f"seed {seed}: acknowledged messages lost"
    assert submissions["not_submitted"] > 0 and submissions["maybe_submitted"] > 0, f"seed {seed}\n{rendered}"
