"""Durable SQS delivery throughput, as a ratio to a bare aiobotocore ``send_message_batch`` loop
from the same run.

No AWS is reachable here, so every case sends to moto's server (one process for the run, on
loopback), whose own speed is the ceiling of all of them; absolute rates say more about moto and
the machine than the library, so each is printed as a ratio to the bare loop measured in the same
round. Every case sends to a fresh standard queue, which must then hold exactly what was sent:

1. baseline: one aiobotocore client, CONCURRENCY tasks each sending ``send_message_batch`` of ten
   ~100-byte JSON messages with the channel's four attributes, N messages in all;
2. the channel alone: ``SqsChannel.send_many`` of ten messages at a time, CONCURRENCY at once (no
   store): the channel's own ceiling;
3. the outbox: N intents enqueued into a fresh SQLite file (untimed), then ``sender.Worker`` with
   ``worker_concurrency=CONCURRENCY``, timed until every intent is delivered; the store must hold
   N delivered intents.

Printed per round and as medians; nothing here asserts on timing. The exit status is non-zero
only when a measurement is invalid (a failed send, an undelivered intent, a wrong message count).

    python tests/bench/bench_sqs.py [--n N] [--rounds R] [--concurrency C]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import harness
from bench_delivery import fill, scalar
from harness import BenchError

REGION, KEY_ID, SECRET_KEY = "eu-west-1", "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SIGNING = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="
BATCH = 10
TIMEOUT_SECONDS = 30.0  # moto answers a batch in milliseconds, but a busy machine should not fail a case


def payload(i: int) -> dict[str, Any]:
    return {"order": i, "customer": f"c-{i % 97:04d}", "total": 12.5, "currency": "EUR", "note": "x" * 40}


async def start_moto(root: Path) -> tuple[Any, str]:
    port = harness.free_port()
    proc = harness.spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], cwd=root,
                         log=root / "moto.log")
    endpoint = f"http://127.0.0.1:{port}"
    await harness.wait_ready(f"{endpoint}/moto-api/", lambda: harness.check_alive(proc, root / "moto.log", "moto"),
                             root / "moto.log")
    return proc, endpoint


class Moto:
    def __init__(self, endpoint: str) -> None:
        from aiobotocore.session import get_session

        self.endpoint, self._context = endpoint, get_session().create_client(
            "sqs", region_name=REGION, endpoint_url=endpoint, aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET_KEY)
        self.client: Any = None

    async def __aenter__(self) -> Moto:
        self.client = await self._context.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._context.__aexit__(None, None, None)

    async def queue(self) -> str:
        return str((await self.client.create_queue(QueueName=f"bench-{uuid.uuid4().hex[:8]}"))["QueueUrl"])

    async def held(self, url: str, n: int) -> None:
        found = (await self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                 )["Attributes"]["ApproximateNumberOfMessages"]
        await self.client.delete_queue(QueueUrl=url)
        if int(found) != n:
            raise BenchError(f"the queue holds {found} messages, expected {n}")


async def baseline(moto: Moto, n: int, concurrency: int) -> float:
    """The bare loop: CONCURRENCY tasks, each a send_message_batch of ten at a time."""
    import rfc8785

    url = await moto.queue()

    async def one(i: int) -> bool:
        entries = []
        for j in range(i * BATCH, min(n, (i + 1) * BATCH)):
            body = rfc8785.dumps(payload(j)).decode()
            entries.append({"Id": str(j % BATCH), "MessageBody": body, "MessageAttributes": {
                name: {"DataType": "String", "StringValue": value} for name, value in (
                    ("idempotency-key", f"acme/b-{j}"), ("payload-digest", "sha256:" + "0" * 64),
                    ("outbox-attempt-id", str(uuid.uuid4())), ("outbox-fence", "1"))}})
        answer = await moto.client.send_message_batch(QueueUrl=url, Entries=entries)
        return not answer.get("Failed")

    ok, seconds = await harness.fan_out(concurrency, 0, -(-n // BATCH), one)
    if ok != -(-n // BATCH):
        raise BenchError("a bare batch failed")
    await moto.held(url, n)
    return n / seconds


def spec(moto: Moto, url: str) -> Any:
    from sender.sqs import SqsSpec

    return SqsSpec.model_validate({
        "channel": "sqs", "region": REGION, "queue_url": url, "endpoint_url": moto.endpoint, "allow_insecure": True,
        "allow_private_network": True, "access_key_id": KEY_ID, "secret_access_key": SECRET_KEY, "secret": SIGNING,
        "timeout_seconds": TIMEOUT_SECONDS})


async def channel_alone(moto: Moto, root: Path, n: int, concurrency: int) -> float:
    from outbox import Outbox
    from sender.channel import Send
    from sender.sqs import SqsChannel

    url = await moto.queue()
    async with await Outbox.open(f"sqlite:///{harness.fresh_dir(root, 'alone') / 'o.db'}") as box:
        destination, _ = await box.put_destination("q", spec(moto, url))
        intents = [e.intent for lo in range(0, n, 500) for e in await box.enqueue_many(
            {"destination": "q", "scope": "acme", "payload": payload(i)} for i in range(lo, min(n, lo + 500)))]
        channel = SqsChannel(concurrency=concurrency)
        errors: list[str] = []
        try:
            async def one(i: int) -> bool:
                sends = [Send(intent, destination, str(uuid.uuid4()), 1)
                         for intent in intents[i * BATCH:(i + 1) * BATCH]]
                results = await channel.send_many(sends)
                errors.extend(r.error or r.outcome.value for r in results if r.outcome.value != "delivered")
                return not any(r.outcome.value != "delivered" for r in results)

            ok, seconds = await harness.fan_out(concurrency, 0, -(-n // BATCH), one)
        finally:
            await channel.aclose()
    if ok != -(-n // BATCH):
        raise BenchError(f"the channel failed {len(errors)} sends: {errors[:3]}")
    await moto.held(url, n)
    return n / seconds


async def outbox(moto: Moto, root: Path, n: int, concurrency: int) -> float:
    from outbox import Outbox, Settings
    from sender import Worker

    url = await moto.queue()
    settings = Settings(authority="allow-all", worker_concurrency=concurrency)
    async with await Outbox.open(f"sqlite:///{harness.fresh_dir(root, 'outbox') / 'o.db'}", settings=settings) as box:
        await box.put_destination("q", spec(moto, url))
        await fill(box, 0, n, lambda i: {"destination": "q", "scope": "acme", "payload": payload(i)})
        worker = Worker(box)
        began = time.perf_counter()
        task = asyncio.create_task(worker.run())
        try:
            while await scalar(box, "SELECT count(*) FROM intents WHERE status = 'delivered'") < n:
                if task.done():
                    raise BenchError("the worker stopped before delivering everything")
                await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await task
        seconds = time.perf_counter() - began
    await moto.held(url, n)
    return n / seconds


async def run(n: int, rounds: int, concurrency: int) -> int:
    began = time.perf_counter()
    problems: list[str] = []
    ratios: dict[str, list[float]] = {"channel": [], "outbox": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        proc, endpoint = await start_moto(root)
        try:
            async with Moto(endpoint) as moto:
                print(f"SQS delivery, {n} messages a case, concurrency {concurrency}, moto {endpoint}; "
                      f"{harness.machine_summary()}")
                for number in range(rounds):
                    try:
                        bare = await baseline(moto, n, concurrency)
                        alone = await channel_alone(moto, root, n, concurrency)
                        durable = await outbox(moto, root, n, concurrency)
                    except BenchError as exc:
                        problems.append(f"round {number + 1}: {exc}")
                        break
                    ratios["channel"].append(alone / bare)
                    ratios["outbox"].append(durable / bare)
                    print(f"round {number + 1}: bare {bare:.0f}/s, channel {alone:.0f}/s ({alone / bare:.2f}x), "
                          f"outbox {durable:.0f}/s ({durable / bare:.2f}x)")
        finally:
            harness.stop_process(proc)
    for name, found in ratios.items():
        if found:
            print(f"median {name} / bare send_message_batch loop: {statistics.median(found):.2f}x")
    return harness.finish(began, problems)


def main(argv: list[str] | None = None) -> int:
    parser = harness.new_parser(__doc__)
    parser.add_argument("--n", type=int, help="messages per case per round (2,000; --quick 300)")
    parser.add_argument("--rounds", type=int, help="rounds (3; --quick 1)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="a short run")
    args = parser.parse_args(argv)
    args.n, args.rounds = args.n or (300 if args.quick else 2000), args.rounds or (1 if args.quick else 3)
    harness.require_positive(parser, args, ["n", "rounds", "concurrency"])
    return asyncio.run(run(args.n, args.rounds, args.concurrency))


if __name__ == "__main__":
    sys.exit(main())
