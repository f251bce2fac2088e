"""The fault matrix's SQS row (tier 1), on the same checker and truth table as the other rows,
against moto's server (tests/sqs.py) with a FIFO queue: rounds of a few intents, each bringing a
fault drawn from the seed (every fault at least once), half of each round's intents sent to moto
directly and half through the fault proxy (tests/faults/proxy.py):

- the server killed before a send (SIGKILL, then started again, empty: the queue is made again):
  a direct send is refused at connect (not submitted); a proxied one reaches the proxy, whose
  upstream is gone (maybe submitted); both delivered once it is back.
- the server stopped (SIGSTOP) with requests in flight, then killed and started again: every
  request was written and none answered (maybe submitted), and none took effect; each is sent
  again and delivered.
- network faults: the proxy draws one per connection (refused, reset before or after the
  request reached moto, a late answer, an answer cut after its headers, an answer dripped).

The ground truth is what the queue held: it is drained before every kill (moto keeps nothing
across one) and at the end, every message counted by its ``idempotency-key``. The destinations'
``on_unknown`` is ``always`` (the default), and on a FIFO queue the deduplication id drops a
resend of a request that had reached the queue, so every intent must end delivered with exactly
one message, whatever was resent.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import Counter

import pytest

from outbox import Outbox, Settings
from receivers import wire
from sender import Worker
from sender.sqs import SqsChannel, SqsSpec

from ..conftest import SECRET
from ..sqs import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, MotoServer, queue_name
from .checker import Truth, check, off_diagonal, truth_table
from .proxy import Proxy
from .tables import store_name
from .test_matrix import facts, report, settled, tier
from .test_matrix_channels import attempted

KILLED = "killed before a send"
STOPPED = "stopped in flight, then killed"
NETWORK = "network faults"
FAULTS = (KILLED, STOPPED, NETWORK)
#: The proxy's faults in a NETWORK round, by connection; otherwise it passes everything.
WEIGHTS = {"pass": 2.0, "refuse": 0.5, "reset_before": 1.0, "reset_after": 1.0, "late": 1.0, "headers_close": 1.0,
           "drip": 0.5}
TIMEOUT_SECONDS = 0.5


class Queue:
    """The FIFO queue on moto's server, and every message it has held."""

    def __init__(self, moto: MotoServer) -> None:
        self.moto, self.name = moto, queue_name("matrix", fifo=True)
        self.url = ""
        self.arrivals: Counter[str] = Counter()
        self.reached: set[str] = set()

    async def create(self) -> None:
        self.url = await self.moto.create_queue(self.name)

    async def drain(self) -> None:
        for message in await self.moto.received(self.url):
            attributes = message["MessageAttributes"]
            self.arrivals[attributes[wire.KAFKA_IDEMPOTENCY_KEY]["StringValue"]] += 1
            self.reached.add(attributes[wire.KAFKA_ATTEMPT_ID]["StringValue"])



class Sender:
    """A worker sending to the queue; stopped while the server restarts, so that no intent meets
    the new server before its queue is made again (a queue that does not exist is rejected)."""

    def __init__(self, box: Outbox) -> None:
        self.box = box
        self.worker: Worker | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.worker = Worker(self.box, channels={"sqs": SqsChannel()}, concurrency=4)
        self.task = asyncio.create_task(self.worker.run())

    async def stop(self) -> None:
        if self.worker is not None and self.task is not None:
            self.worker.stop()
            await asyncio.wait_for(self.task, 15)
            await self.worker.aclose()
        self.worker = self.task = None


async def test_sqs_faults_lose_duplicate_or_misreport_nothing(
        request: pytest.FixtureRequest, store_url: str, moto: MotoServer) -> None:
    long, seed = tier(request)
    rng = random.Random(seed)
    store = store_name(store_url)
    rounds = [*FAULTS, *rng.choices([None, *FAULTS], k=12 if long else 3)]
    rng.shuffle(rounds)
    queue = Queue(moto)
    await queue.create()
    proxy = Proxy(moto.port, rng=rng, weights={"pass": 1.0}, late_seconds=TIMEOUT_SECONDS * 3,
                  refuse_seconds=0.05).start()
    settings = Settings(authority="allow-all", backoff_initial_seconds=0.05, backoff_cap_seconds=0.3,
                        circuit_failures=0, poll_seconds=0.1, default_max_attempts=100)
    box = await Outbox.open(store_url, settings=settings)
    sender = Sender(box)
    keys: list[tuple[str, str]] = []
    faults: Counter[str] = Counter()

    async def enqueue(prefix: str) -> list[tuple[str, str]]:
        batch = [(e.intent.scope, e.intent.action_id) for e in await box.enqueue_many(
            {"destination": "proxied" if n % 2 else "direct", "scope": "acme", "action_id": f"{prefix}-{n}",
             "payload": {"n": n}} for n in range(rng.randint(4, 8)))]
        keys.extend(batch)
        return batch

    try:
        for name, endpoint in (("direct", moto.endpoint), ("proxied", proxy.url)):
            await box.put_destination(name, SqsSpec.model_validate({
                "channel": "sqs", "region": REGION, "queue_url": f"{moto.endpoint}/{queue.url.split('/', 3)[3]}",
                "endpoint_url": endpoint, "allow_insecure": True, "allow_private_network": True,
                "access_key_id": ACCESS_KEY_ID, "secret_access_key": SECRET_ACCESS_KEY, "secret": SECRET,
                "timeout_seconds": TIMEOUT_SECONDS}))
        sender.start()
        try:
            for number, fault in enumerate([None, *rounds]):
                faults[fault or ("warm-up" if number == 0 else "none")] += 1
                if fault in (KILLED, STOPPED):
                    await queue.drain()
                    assert moto.process is not None
                    if fault == KILLED:
                        await asyncio.to_thread(moto.stop)
                    else:  # every request written, none answered; then killed (SIGKILL ends a stopped process)
                        os.kill(moto.process.pid, signal.SIGSTOP)
                    await attempted(box, batch := await enqueue(f"r{number}"))
                    await sender.stop()
                    await asyncio.to_thread(moto.stop)
                    await asyncio.to_thread(moto.start)
                    await queue.create()
                    sender.start()
                elif fault == NETWORK:
                    proxy.weights = WEIGHTS  # until the round is settled: its retries meet faults too
                    batch = await enqueue(f"r{number}")
                else:
                    batch = await enqueue(f"r{number}")
                assert await settled(box, batch, timeout=30) == [], f"seed {seed}, round {number}: {fault}"
                proxy.weights = {"pass": 1.0}
        finally:
            await sender.stop()
        await queue.drain()
        history = await facts(box, keys)
    finally:
        await sender.stop()
        await box.close()
        proxy.stop()
    truth = Truth(dict(queue.arrivals), frozenset(queue.reached), idempotent=True)
    table = truth_table(history, truth)
    submissions = Counter(a.submission for i in history for a in i.attempts)
    title = (f"{len(keys)} intents, seed {seed}, {sum(queue.arrivals.values())} messages, rounds: "
             + ", ".join(f"{k} {n}" for k, n in faults.items())
             + "; connections: " + ", ".join(f"{k} {n}" for k, n in sorted(proxy.faults.items()))
             + "; attempts: " + ", ".join(f"{k} {n}" for k, n in sorted(submissions.items(), key=str)))
    rendered = report("sqs", store, title, table)
    assert check(history, truth) == [], f"seed {seed}"
    assert off_diagonal(table) == 0, f"seed {seed}\n{rendered}"
    assert all(fact.status == "delivered" for fact in history), f"seed {seed}\n{rendered}"
    assert all(queue.arrivals[fact.key] == 1 for fact in history), f"seed {seed}: {queue.arrivals}"
    assert submissions["not_submitted"] > 0 and submissions["maybe_submitted"] > 0, f"seed {seed}\n{rendered}"
    assert sum(n for mode, n in proxy.faults.items() if mode != "pass") > 0, "no fault was injected"


