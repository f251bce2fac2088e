"""``receivers`` stands alone: a receiving application that embeds it loads the standard library,
rfc8785 and the driver of the record store it opens, never the outbox, the sender or the
service's frameworks."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

RECEIVERS = Path(__file__).resolve().parents[2] / "receivers"
#: Never loaded by ``import receivers``: the other two packages, and what only they need.
FORBIDDEN = {"outbox", "sender", "pydantic", "pydantic_settings", "prometheus_client", "fastapi", "starlette",
             "aiohttp", "aiosqlite", "asyncpg", "aiokafka", "aio_pika", "aiormq", "nats"}
#: The consumers of each broker, and the driver each loads when first named.
CONSUMERS = {"IdempotentConsumer": "aiokafka", "IdempotentRabbitMQConsumer": "aio_pika",
             "IdempotentJetStreamConsumer": "nats"}


def loaded_after(code: str) -> set[str]:
    """The top-level packages of every module loaded in a fresh interpreter after ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=RECEIVERS.parent, timeout=120)
    return {name.split(".")[0] for name in json.loads(done.stdout)}


def test_import_receivers_loads_neither_the_outbox_the_sender_nor_their_frameworks():
    loaded = loaded_after("import receivers\n"  # every public name but the brokers' consumers (below)
                          f"[getattr(receivers, name) for name in receivers.__all__ if name not in {set(CONSUMERS)!r}]")
    assert "receivers" in loaded and "rfc8785" in loaded
    assert loaded & FORBIDDEN == set()


def test_each_brokers_consumer_loads_its_driver_only_when_named():
    for name, driver in CONSUMERS.items():
        loaded = loaded_after(f"from receivers import {name}")
        assert driver in loaded
        assert loaded & {d for d in CONSUMERS.values() if d != driver} == set(), name


def test_record_stores_import_their_driver_only_when_opened(tmp_path: Path):
    loaded = loaded_after("from receivers import PostgresRecordStore, SqliteRecordStore\n"
                          "SqliteRecordStore('unused.db'); PostgresRecordStore('postgresql://unused/db')")
    assert loaded & FORBIDDEN == set()
    loaded = loaded_after("import asyncio\n"
                          "from receivers import SqliteRecordStore\n"
                          f"store = SqliteRecordStore({str(tmp_path / 'r.db')!r})\n"
                          "async def main():\n"
                          "    await store.open()\n"
                          "    await store.close()\n"
                          "asyncio.run(main())")
    assert "aiosqlite" in loaded
    assert loaded & FORBIDDEN == {"aiosqlite"}


def test_no_receivers_module_imports_the_outbox_or_the_sender_even_lazily():
    offenders = []
    for path in sorted(RECEIVERS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            if {"outbox", "sender"} & set(tops):
                offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []
