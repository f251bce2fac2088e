"""A consumer process for the crash test: an ``IdempotentConsumer`` whose handler appends each
record's key to a file (its effect, flushed and fsynced before it returns).

With ``--die-before-commit`` the process SIGKILLs itself when it is about to commit an offset,
after every handled record's completion was stored: the crash between handler and commit,
exactly there. Otherwise it runs until the group's committed offset of partition 0 reaches
``--until``, then stops gracefully.

    python -m tests.receivers.kafka_worker BOOTSTRAP TOPIC GROUP STORE EFFECTS SECRET [--die-before-commit] [--until N]

STORE is ``sqlite:PATH`` or ``postgres:TABLE:DSN``; SECRET the signing secret the records carry.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from receivers import IdempotencyContext, IdempotentConsumer, PostgresRecordStore, SqliteRecordStore


def open_store(spec: str) -> Any:
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        return SqliteRecordStore(rest)
    table, _, dsn = rest.partition(":")
    return PostgresRecordStore(dsn, table=table, pool_size=2)


async def main(args: argparse.Namespace) -> int:
    async def handle(record: Any, context: IdempotencyContext) -> None:
        with open(args.effects, "a") as effects:
            effects.write(f"{context.key} {record.offset}\n")
            effects.flush()
            os.fsync(effects.fileno())

    kafka = AIOKafkaConsumer(args.topic, bootstrap_servers=args.bootstrap, group_id=args.group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             # the broker's minimum: the crashed member is evicted sooner
                             session_timeout_ms=6000, heartbeat_interval_ms=1000)
    if args.die_before_commit:
        async def die(offsets: Any = None) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        kafka.commit = die  # the one fault: the process dies where the commit would be sent
    consumer = IdempotentConsumer(kafka, open_store(args.store), handle, secrets=args.secret)
    async with consumer:
        for _ in range(600):
            if await kafka.committed(TopicPartition(args.topic, 0)) == args.until:
                return 0
            await asyncio.sleep(0.05)
    return 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "group", "store", "effects", "secret"):
        parser.add_argument(name)
    parser.add_argument("--die-before-commit", action="store_true")
    parser.add_argument("--until", type=int, default=-1)
    sys.exit(asyncio.run(main(parser.parse_args())))
