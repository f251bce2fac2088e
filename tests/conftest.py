"""Shared fixtures: real SQLite files in a temporary directory, an opened Outbox, the served API,
scripted receivers, table snapshots."""

from __future__ import annotations

import asyncio
import inspect
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from outbox import DestinationSpec, Outbox, Settings
from outbox.app.service import create_service

from . import pg
from .receiver import Receiver
from .servers import Served

if TYPE_CHECKING:
    from .kafka import Broker
    from .rabbitmq import Rabbit
    from .sqs import MotoServer


def pytest_addoption(parser: pytest.Parser) -> None:
    """The fault matrix's tier (tests/faults): ``tier1`` (seeded, in every run) or ``long``."""
    parser.addoption("--faults", choices=("tier1", "long"), default="tier1",
                     help="fault matrix tier: tier1 (seeded, bounded) or long (more intents, random seed)")
    parser.addoption("--faults-seed", type=int, default=None, help="replay the fault matrix with this seed")


SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 5.0) -> bool:
    """Whether ``check()`` comes true within ``timeout`` seconds, asked every 10 ms."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if await answer if inspect.isawaitable(answer) else answer:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)


def free_port() -> int:
    """A loopback port nothing listens on now (for a service the test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "outbox.db"


@pytest.fixture
def db_url(db_path: Path) -> str:
    return f"sqlite:///{db_path}"


@pytest.fixture
async def pg_url(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """A new, empty PostgreSQL database (tests/pg.py), dropped after the test; the test's
    outboxes get the run's secrets key file (``OUTBOX_SECRETS_KEY_FILE``), as PostgreSQL needs."""
    monkeypatch.setenv(*pg.key_env().popitem())
    async with pg.database() as url:
        yield url


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[Broker]:
    """A running noida-db Kafka broker (tests/kafka.py), killed after the test."""
    from .kafka import Broker

    broker = Broker("noida", tmp_path).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[Broker]:
    """A running Tansu Kafka broker, memory only (tests/kafka.py), killed after the test."""
    from .kafka import Broker

    broker = Broker("tansu", tmp_path).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[MotoServer]:
    """A running moto server, the tests' SQS API (tests/sqs.py), killed after the test."""
    from .sqs import MotoServer

    server = MotoServer(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def rabbit() -> AsyncIterator[Rabbit]:
    """The shared RabbitMQ, with an exchange and queues of the test's own (tests/rabbitmq.py),
    deleted after the test."""
    from .rabbitmq import Rabbit

    made = await Rabbit.open()
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, db_url: str) -> str:
    """The outbox database, once per store: a SQLite file, then a fresh PostgreSQL database."""
    return db_url if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


def records(url: str) -> str:
    """Where the outbox database at ``url`` is read for intents as records: on SQLite their rows, on
    PostgreSQL their rows with their leases (the view intent_records), whose status says leased."""
    return "intents" if url.startswith("sqlite:") else "intent_records"


async def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """What ``sql`` selects from the outbox database at ``url``, through a connection of its own."""
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return conn.execute(sql).fetchall()
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return [tuple(row) for row in await conn.fetch(sql)]
    finally:
        await conn.close()


async def open_box(url: str, **options: Any) -> Outbox:
    """An opened, migrated outbox on ``url`` with one destination, ``billing``."""
    outbox = await Outbox.open(url, **options)
    await outbox.put_destination(
        "billing", DestinationSpec(url="https://billing.example/hook", secret=SECRET)
    )
    return outbox


@pytest.fixture
def box_url(db_url: str) -> str:
    """The database ``box`` opens: the SQLite file ``db_url``, unless a module overrides this."""
    return db_url


@pytest.fixture
def box_settings() -> Settings | None:
    """The settings ``box`` opens with: the environment's, unless a module overrides this."""
    return None


@pytest.fixture
async def box(box_url: str, box_settings: Settings | None) -> AsyncIterator[Outbox]:
    """An opened, migrated outbox on ``box_url`` with ``box_settings`` and one destination,
    ``billing``."""
    outbox = await open_box(box_url, settings=box_settings)
    try:
        yield outbox
    finally:
        await outbox.close()


@pytest.fixture
def start_receiver() -> Iterator[Callable[[], Receiver]]:
    """Start as many receivers (tests/receiver.py) as a test needs; all are stopped after it."""
    started: list[Receiver] = []

    def start() -> Receiver:
        receiver = Receiver().start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.stop()


@pytest.fixture
def receiver(start_receiver: Callable[[], Receiver]) -> Receiver:
    """One running receiver; nothing is scripted yet (unscripted paths answer 404)."""
    return start_receiver()


@pytest.fixture
def serve_api() -> Iterator[Callable[[Settings], str]]:
    """Serve the HTTP API for given settings with a real uvicorn; returns its URL. Stopped after
    the test."""
    running: list[Served] = []

    def start(settings: Settings) -> str:
        running.append(Served(create_service(settings)))
        return running[-1].url

    yield start
    for served in running:
        served.stop()


def snapshot(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every outbox table, read through a separate connection."""
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}


@pytest.fixture
def spans() -> Iterator[Any]:
    """Every span this process finishes during the test (the SDK's in-memory exporter;
    ``tests.traces``, imported only by the tests that ask)."""
    from . import traces

    yield from traces.recording()
