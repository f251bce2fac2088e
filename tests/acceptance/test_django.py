"""A real Django project (``tests/djangoshop``) served by ``manage.py runserver``, on SQLite and on
PostgreSQL, with the outbox's app installed: its views write an order and enqueue its invoice
in one transaction, and a separate ``outbox worker`` delivers to a real receiver exactly what
committed, once each. The project's tables come from Django's ``migrate`` and the outbox's from
Django's ``migrate`` through the outbox's app, on the URL it derives from ``DATABASES``; under
Django's own test runner, each test database has them too."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox import DestinationSpec, Outbox
from outbox.grants import GrantSpec
from outbox.store.migrator import scripts_for

from .. import pg
from ..conftest import SECRET, eventually, free_port, rows
from ..receiver import Receiver, Reply
from .conftest import clean_env, outbox_worker
from .test_readme import listening

pytestmark = pytest.mark.acceptance

PROJECT = Path(__file__).resolve().parents[1] / "djangoshop"


def django_env(url: str, **extra: str) -> dict[str, str]:
    """The project's environment: its settings module, and its database at ``url``."""
    return clean_env(DJANGO_SETTINGS_MODULE="shop.settings", PYTHONPATH=str(PROJECT), SHOP_DATABASE_URL=url, **extra)


def manage(url: str, *command: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py COMMAND`` for the project on ``url``."""
    done = subprocess.run([sys.executable, "-m", "django", *command], env=django_env(url, **env), cwd=PROJECT,
                          capture_output=True, text=True, timeout=120)
    assert not check or done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done


@contextmanager
def runserver(url: str, log: Path) -> Iterator[str]:
    """``manage.py runserver`` (threaded: a thread and a connection per request) on a free port;
    yields its base URL."""
    port = free_port()
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{port}"],
                                  env=django_env(url), cwd=PROJECT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def wait_for(log: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)


@pytest.fixture(params=["sqlite", "postgres"])
def shop_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The project's database (and so the outbox's): a SQLite file, then a fresh PostgreSQL database."""
    return f"sqlite:///{tmp_path / 'shop.sqlite3'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")


async def test_views_deliver_what_their_transactions_commit_and_nothing_else(shop_url: str, tmp_path: Path,
                                                                             receiver: Receiver):
    """Each view's answer, then what the worker delivered: the orders that committed have their
    intents delivered once each (an explicit ``atomic()``, ATOMIC_REQUESTS, a savepoint's
    survivor, ``django.db.connection`` through ``outbox.Producer``, ``enqueue_many``, an event's
    fan-out); a view that raised left neither its order nor its intent; outside any transaction
    the enqueue is refused with NoTransaction and nothing is written; a refusal caught inside the
    transaction leaves the order committed. The worker polls only every 30 s, so each delivery
    within the test's few seconds was woken by the commit (PostgreSQL's NOTIFY, SQLite's file
    watch)."""
    receiver.script("/billing", Reply(200, headers={"External-Id": "inv"}))
    migrated = manage(shop_url, "migrate").stdout
    assert "Applying shop.0001_initial... OK" in migrated
    assert re.search(r"Applied the outbox's migrations to (sqlite|postgresql):.*: 0001_initial, ", migrated), migrated
    assert "are up to date" in manage(shop_url, "migrate").stdout  # (again: nothing to do, for either)
    assert manage(shop_url, "outbox_migrate").stdout.startswith("the outbox's tables in ")  # (up to date too)
    async with await Outbox.open(shop_url) as box:  # (migrated already: opening applies nothing)
        await box.put_destination("billing", DestinationSpec(url=f"{receiver.url}/billing", secret=SECRET,
                                                             allow_private_network=True,
                                                             subscriptions=[{"topic": "order.*"}]))
        await box.put_grant("acme-billing", GrantSpec(scope="acme", destination="billing"))

    with outbox_worker(tmp_path, clean_env(OUTBOX_DATABASE_URL=shop_url, OUTBOX_POLL_SECONDS="30")) as (_, log), \
            runserver(shop_url, tmp_path / "django.log") as site:
        wait_for(log, " started (concurrency")
        time.sleep(0.5)  # (its first claim, at start, finds nothing: what follows is woken)
        answers: dict[str, Any] = {}
        for name, pk in [("explicit", 1), ("failing", 2), ("atomic_request", 3), ("atomic_request?fail=1", 4),
                         ("outside", 5), ("refused", 6), ("savepoint", 7), ("proxy", 8), ("many", 9), ("event", 10)]:
            path, _, query = name.partition("?")
            answer = httpx.post(f"{site}/{path}/{pk}" + (f"?{query}" if query else ""), timeout=30)
            answers[name] = (answer.status_code, answer.json() if answer.status_code != 500 else None)
        assert answers["explicit"] == (201, {"order": 1, "created": [True]})
        assert answers["failing"] == (500, None) and answers["atomic_request?fail=1"] == (500, None)
        assert answers["atomic_request"] == (201, {"order": 3, "created": [True]})
        status, refusal = answers["outside"]
        assert status == 409 and refusal["error"] == "NoTransaction"
        assert "with transaction.atomic(): ..., or ATOMIC_REQUESTS" in refusal["detail"]
        assert answers["refused"] == (201, {"order": 6, "refused": "destination 'nowhere' is not registered"})
        assert answers["savepoint"] == (201, {"order": 7, "created": [True]})
        assert answers["proxy"] == (201, {"order": 8, "created": [True]})
        assert answers["many"] == (201, {"order": 9, "created": [True, True]})
        assert answers["event"] == (201, {"order": 10, "fanout": ["evt~order-10~billing"]})

        delivered = {"acme/order-1", "acme/order-3", "acme/order-7", "acme/order-8", "acme/order-9-a",
                     "acme/order-9-b", "acme/evt~order-10~billing"}
        await receiver.wait_for_requests(len(delivered), "/billing", timeout=15)
        assert await eventually(lambda: settled(shop_url, len(delivered)), timeout=15)
        time.sleep(0.3)  # (nothing more arrives)

    keys = Counter(r.headers["idempotency-key"] for r in receiver.requests("/billing"))
    assert keys == Counter(delivered)  # each once, and only those
    assert sorted(r[0] for r in await rows(shop_url, "SELECT id FROM shop_order")) == [1, 3, 6, 7, 8, 9, 10]
    assert sorted(f"{s}/{a}" for s, a, in await rows(shop_url, "SELECT scope, action_id FROM intents")) == sorted(
        delivered)
    assert await settled(shop_url, len(delivered))


async def settled(url: str, count: int) -> bool:
    """Whether ``count`` intents are delivered (and no more are anything else)."""
    return await rows(url, "SELECT count(*) FROM intents WHERE status = 'delivered'") == [(count,)]


def test_the_projects_own_tests_enqueue_in_each_test_database_django_makes(shop_url: str, tmp_path: Path):
    """``manage.py test --parallel 2`` (tests/djangoshop/shop/tests.py): the test database Django
    migrates gets the outbox's tables from the same ``migrate``, so both clones have them and a
    view enqueues in each."""
    key = {"OUTBOX_SECRETS_KEY_FILE": str(pg.key_file())} if shop_url.startswith("postgres") else {}
    done = manage(shop_url, "test", "shop", "--parallel", "2", "--noinput", "-v", "2", check=False, **key)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Applied the outbox's migrations to " in done.stdout + done.stderr
    assert "Ran 2 tests" in done.stderr and "Cloning test database" in done.stderr


def test_with_migrate_false_django_leaves_the_outboxs_tables_to_outbox_migrate(tmp_path: Path):
    """``OUTBOX["MIGRATE"] = False``: Django's ``migrate`` makes only Django's tables, and
    ``manage.py outbox_migrate`` then applies the outbox's, at the URL it derives, once."""
    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    migrated = manage(url, "migrate", SHOP_OUTBOX_MIGRATE="0").stdout
    assert "Applying shop.0001_initial... OK" in migrated and "outbox" not in migrated
    tables = {name for name, in sqlite3.connect(tmp_path / "shop.sqlite3").execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "shop_order" in tables and "intents" not in tables
    applied = manage(url, "outbox_migrate", SHOP_OUTBOX_MIGRATE="0").stdout
    assert applied.startswith(f"applied {len(scripts_for('sqlite'))} outbox migrations to {url} "
                              "(Django's database 'default'): 0001_initial, "), applied
    assert "are up to date" in manage(url, "outbox_migrate", SHOP_OUTBOX_MIGRATE="0").stdout
