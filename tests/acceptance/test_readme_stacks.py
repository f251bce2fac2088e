"""The README's "From Python, in your own transaction" walkthroughs, one per stack, run as
printed in a fresh directory (bash, the virtualenv first on PATH): the sqlite3 and psycopg 3
scripts, the asyncpg example, the Django project, the Flask + SQLAlchemy app with its Alembic
migrations, and the FastAPI + async SQLAlchemy app, the apps on SQLite and on PostgreSQL. Only
ports, the database's name and the receiver are this run's: once a walkthrough has enqueued, the
test points its destination ``billing`` (example.com in the README) at a real receiver and a
separate ``outbox worker`` delivers each committed intent there once."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from outbox import DestinationSpec, Outbox, Settings
from outbox.contrib.alembic import OUTBOX_TABLES
from outbox.store.migrator import DIALECT_TABLES

from .. import pg
from ..conftest import SECRET, eventually, free_port, rows
from ..receiver import Receiver, Reply
from .conftest import clean_env, outbox_worker
from .test_readme import README, bash, python_blocks, shell_block_after, started

pytestmark = pytest.mark.acceptance

HEADING = "### From Python, in your own transaction"
SQLITE_URL = "sqlite:///shop.db"


def section_block(part: str, nth: int = 0) -> str:
    """The ``nth`` shell block of the section's part headed ``#### part``."""
    return shell_block_after(f"#### {part}", nth)


def setup_block() -> str:
    """The section's setup for its SQLite examples (the outbox's tables, a destination, a grant)."""
    block = shell_block_after(HEADING)
    assert block.startswith(f"export OUTBOX_DATABASE_URL={SQLITE_URL} ") and "\noutbox migrate " in block
    return block


def until_server(block: str, command: str, port: int) -> tuple[str, str]:
    """``block`` split into what runs before its server's command (``command``, its last line, which
    runs until stopped) and that command on ``port`` instead of the README's."""
    before, _, last = block.rstrip("\n").rpartition("\n")
    assert last.startswith(command), last
    return before, re.sub(r"(--port |runserver )\d+", rf"\g<1>{port}", last)


class Postgres:
    """The psycopg walkthrough's database, made by its own ``createdb`` (dropped afterwards), and
    its setup lines with this run's database in place of ``shop``."""

    def __init__(self, url: str) -> None:
        self.url = url
        server = urlsplit(url)
        self.name = server.path.lstrip("/")
        self.createdb = f"-h {server.hostname} -p {server.port or 5432} -U {server.username} {self.name}"

    def script(self, block: str) -> str:
        """``block`` (the psycopg walkthrough's) on this database."""
        assert "createdb -h 127.0.0.1 -U postgres shop" in block
        shown = "OUTBOX_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/shop"
        assert shown in block
        ours = f"OUTBOX_DATABASE_URL={self.url}"
        return block.replace("-h 127.0.0.1 -U postgres shop", self.createdb).replace(shown, ours)

    def setup(self) -> str:
        """The psycopg walkthrough's setup, without its script: what the apps on PostgreSQL run first."""
        block = self.script(section_block("A psycopg 3 script"))
        return block.replace("python psycopg_example.py\n", "")

    def sqlalchemy(self, driver: str) -> str:
        """This database as SQLAlchemy names it with ``driver``."""
        return self.url.replace("postgresql://", f"postgresql+{driver}://", 1)


@pytest.fixture
async def postgres() -> AsyncIterator[Postgres]:
    async with pg.database(create=False) as url:  # made by the README's createdb, dropped after
        yield Postgres(url)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def deliver(url: str, cwd: Path, receiver: Receiver, keys: set[str], key_file: Path | None = None) -> None:
    """Point ``billing`` at ``receiver`` and let a separate ``outbox worker`` run until every intent
    is delivered; asserts the receiver got ``keys`` (``scope/action_id``), each once."""
    receiver.script("/billing", Reply(200, headers={"External-Id": "inv"}))
    settings = Settings(database_url=url, secrets_key_file=key_file) if key_file else Settings(database_url=url)
    async with await Outbox.open(url, settings=settings) as box:
        await box.put_destination("billing", DestinationSpec(url=f"{receiver.url}/billing", secret=SECRET,
                                                             allow_private_network=True))
    env = clean_env(OUTBOX_DATABASE_URL=url, **({"OUTBOX_SECRETS_KEY_FILE": str(key_file)} if key_file else {}))
    with outbox_worker(cwd, env):
        await receiver.wait_for_requests(len(keys), "/billing", timeout=20)

        async def settled() -> bool:
            return await rows(url, "SELECT count(*) FROM intents WHERE status <> 'delivered'") == [(0,)]

        assert await eventually(settled, timeout=20)
    assert Counter(r.headers["idempotency-key"] for r in receiver.requests("/billing")) == Counter(keys)


def sqlite_url(cwd: Path) -> str:
    """The walkthrough's ``sqlite:///shop.db``, for a process that runs elsewhere."""
    return f"sqlite:///{cwd / 'shop.db'}"


async def test_the_sqlite3_script_commits_its_intent_with_its_order(tmp_path: Path, receiver: Receiver):
    (tmp_path / "sqlite3_example.py").write_text(python_blocks()["sqlite3-transaction"])
    run = section_block("A sqlite3 script")
    assert run == "python sqlite3_example.py\n"
    first = bash(setup_block() + run, tmp_path)
    again = bash(run, tmp_path)
    assert (first.splitlines()[-1], again) == ("True pending", "False pending\n")
    url = sqlite_url(tmp_path)
    assert await rows(url, "SELECT id, total_cents FROM orders") == [(42, 1999)]
    await deliver(url, tmp_path, receiver, {"acme/order-42-invoice"})


async def test_the_psycopg_script_and_the_asyncpg_example_commit_their_intents_with_their_orders(
        tmp_path: Path, postgres: Postgres, receiver: Receiver):
    """The psycopg walkthrough, as printed from ``createdb`` on; then the asyncpg example in the
    same shell, as the README runs it."""
    (tmp_path / "psycopg_example.py").write_text(python_blocks()["psycopg-transaction"])
    (tmp_path / "postgres_example.py").write_text(python_blocks()["postgres-transaction"])
    script = postgres.script(section_block("A psycopg 3 script"))
    assert "pip install 'outbox-delivery[psycopg]'" in script and script.endswith("python psycopg_example.py\n")
    shown = bash(script + "python psycopg_example.py\npython postgres_example.py\npython postgres_example.py\n",
                 tmp_path)
    assert shown.splitlines()[-4:] == ["True pending", "False pending", "True pending", "False pending"]
    assert await rows(postgres.url, "SELECT id, total_cents FROM orders ORDER BY id") == [(42, 1999), (43, 1999)]
    await deliver(postgres.url, tmp_path, receiver, {"acme/order-42-invoice", "acme/order-43-invoice"},
                  key_file=tmp_path / "secrets.key")


async def test_the_django_walkthrough_serves_a_view_whose_intent_commits_with_its_order(tmp_path: Path,
                                                                                        receiver: Receiver):
    """``django-admin startproject`` and ``startapp`` as printed, the README's settings appended to
    the generated ones, its model, view and URLs in place of the generated files, then its commands
    through ``runserver`` (on this run's port) and the ``curl`` it shows."""
    bash(section_block("Django"), tmp_path)
    site = tmp_path / "mysite"
    blocks = python_blocks()
    settings = site / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + blocks["django-settings"])
    (site / "orders" / "models.py").write_text(blocks["django-models"])
    (site / "orders" / "views.py").write_text(blocks["django-view"])
    (site / "mysite" / "urls.py").write_text(blocks["django-urls"])
    port = free_port()
    before, runserver = until_server(section_block("Django", 1), "python manage.py runserver", port)
    assert "export OUTBOX_DATABASE_URL=sqlite:///db.sqlite3" in before
    migrated = bash(before, site)
    assert "Applied the outbox's migrations to sqlite:///" in migrated, migrated
    with started(runserver, site, port) as log:
        answers = [httpx.post(f"http://127.0.0.1:{port}/orders", content=b'{"total_cents": 1999}', timeout=30)
                   for _ in range(2)]
    assert [(a.status_code, a.text) for a in answers] == [
        (201, '{"order": 1, "invoice": "pending"}'), (201, '{"order": 2, "invoice": "pending"}')], log.read_text()
    assert """-d '{"total_cents": 1999}'` answers\n`{"order": 1, "invoice": "pending"}`""" in README.read_text()
    url = f"sqlite:///{site / 'db.sqlite3'}"
    assert await rows(url, "SELECT id, total_cents FROM orders_order") == [(1, 1999), (2, 1999)]
    await deliver(url, site, receiver, {"acme/order-1-invoice", "acme/order-2-invoice"})


async def app_setup(tmp_path: Path, store: str, postgres: Postgres | None) -> tuple[str, dict[str, str], Path | None]:
    """The setup for the apps on ``store`` run in ``tmp_path``: the outbox's URL, the app's
    environment (``DATABASE_URL`` on PostgreSQL) and PostgreSQL's key file."""
    if postgres is None:
        bash(setup_block(), tmp_path)
        return sqlite_url(tmp_path), {}, None
    bash(postgres.setup(), tmp_path)
    return postgres.url, {"DATABASE_URL": postgres.sqlalchemy("psycopg")}, tmp_path / "secrets.key"


@pytest.fixture
def maybe_postgres(store: str, request: pytest.FixtureRequest) -> Postgres | None:
    """The walkthrough's PostgreSQL database when ``store`` is PostgreSQL."""
    return request.getfixturevalue("postgres") if store == "postgres" else None


async def test_the_flask_app_commits_each_orders_intent_with_it(tmp_path: Path, store: str,
                                                                maybe_postgres: Postgres | None, receiver: Receiver):
    (tmp_path / "shop.py").write_text(python_blocks()["flask-sqlalchemy"])
    url, app_env, key_file = await app_setup(tmp_path, store, maybe_postgres)
    port = free_port()
    before, run = until_server(section_block("Flask and SQLAlchemy"), "flask --app shop run", port)
    assert "pip install 'outbox-delivery[sqlalchemy]' flask" in before
    bash(before, tmp_path, **app_env)
    with started(_exported(app_env) + run, tmp_path, port) as log:
        answers = [httpx.post(f"http://127.0.0.1:{port}/orders", json={"total_cents": 1999}, timeout=30)
                   for _ in range(2)]
    assert [(a.status_code, a.text) for a in answers] == [
        (201, '{"invoice":"pending","order":1}\n'), (201, '{"invoice":"pending","order":2}\n')], log.read_text()
    assert 'answers `{"invoice":"pending","order":1}`' in README.read_text()
    assert await rows(url, "SELECT id, total_cents FROM orders ORDER BY id") == [(1, 1999), (2, 1999)]
    await deliver(url, tmp_path, receiver, {"acme/order-1-invoice", "acme/order-2-invoice"}, key_file=key_file)


async def test_the_fastapi_app_commits_each_orders_intent_with_it(tmp_path: Path, store: str,
                                                                  maybe_postgres: Postgres | None,
                                                                  receiver: Receiver):
    (tmp_path / "shop_api.py").write_text(python_blocks()["fastapi-sqlalchemy"])
    url, app_env, key_file = await app_setup(tmp_path, store, maybe_postgres)
    if maybe_postgres is not None:
        app_env = {"DATABASE_URL": maybe_postgres.sqlalchemy("asyncpg")}
    port = free_port()
    before, run = until_server(section_block("FastAPI and async SQLAlchemy"), "uvicorn shop_api:app", port)
    bash(before, tmp_path)
    with started(_exported(app_env) + run, tmp_path, port) as log:
        answers = [httpx.post(f"http://127.0.0.1:{port}/orders", json={"total_cents": 1999}, timeout=30)
                   for _ in range(2)]
    assert [(a.status_code, a.text) for a in answers] == [
        (201, '{"order":1,"invoice":"pending"}'), (201, '{"order":2,"invoice":"pending"}')], log.read_text()
    assert '`{"order":1,"invoice":"pending"}`' in README.read_text()
    assert await rows(url, "SELECT id, total_cents FROM orders ORDER BY id") == [(1, 1999), (2, 1999)]
    await deliver(url, tmp_path, receiver, {"acme/order-1-invoice", "acme/order-2-invoice"}, key_file=key_file)


def _exported(env: dict[str, str]) -> str:
    """``env`` as the shell lines that export it (what a user types before starting the app)."""
    return "".join(f"export {name}={value}\n" for name, value in env.items())


async def test_alembic_autogenerate_leaves_the_outboxs_tables_alone(tmp_path: Path, store: str,
                                                                     maybe_postgres: Postgres | None):
    """On a database the outbox migrated, ``alembic init`` and the README's ``env.py``: the
    autogenerated revision creates the application's table and nothing else (no drop of any of the
    outbox's tables), ``upgrade`` applies it, and autogenerate then finds nothing to do. The same
    ``env.py`` without the filter would drop every one of the outbox's tables: the premise."""
    (tmp_path / "shop.py").write_text(python_blocks()["flask-sqlalchemy"])
    url, app_env, _ = await app_setup(tmp_path, store, maybe_postgres)
    block = section_block("Flask and SQLAlchemy", 1)
    assert block.startswith("pip install alembic\nalembic init migrations ")
    env_py = python_blocks()["alembic-env"]
    unfiltered = env_py.replace("include_name=include_name", "")
    assert unfiltered != env_py
    init, _, rest = block.partition("alembic init migrations")
    bash(init + "alembic init migrations", tmp_path)
    (tmp_path / "migrations" / "env.py").write_text(unfiltered)
    bash("alembic revision --autogenerate -m unfiltered", tmp_path, **app_env)
    [premise] = (tmp_path / "migrations" / "versions").glob("*_unfiltered.py")
    upgrade = premise.read_text().partition("def downgrade")[0]
    dropped = set(re.findall(r"op\.drop_table\('(\w+)'\)", upgrade))
    made = DIALECT_TABLES[store]  # (OUTBOX_TABLES: either dialect's)
    assert dropped == made and "op.create_table('orders'" in upgrade  # (what the filter is for)
    premise.unlink()

    (tmp_path / "migrations" / "env.py").write_text(env_py)
    bash(rest.split("\n", 1)[1], tmp_path, **app_env)  # revision --autogenerate, upgrade head
    [revision] = (tmp_path / "migrations" / "versions").glob("*_orders.py")
    ops = re.findall(r"op\.(\w+)\('(\w+)'", revision.read_text())
    assert ops == [("create_table", "orders"), ("drop_table", "orders")]  # upgrade, then downgrade
    bash("alembic revision --autogenerate -m again", tmp_path, **app_env)
    [again] = (tmp_path / "migrations" / "versions").glob("*_again.py")
    assert not re.findall(r"op\.\w+\(", again.read_text())
    tables = await rows(url, "SELECT name FROM sqlite_master WHERE type = 'table'" if store == "sqlite" else
                        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    assert {name for name, in tables if not name.startswith("sqlite_")} == made | {"orders", "alembic_version"}
    assert made <= OUTBOX_TABLES
    assert await rows(url, "SELECT count(*) FROM destinations") == [(1,)]  # (the setup's billing, untouched)


def test_the_readme_runs_every_stack_it_names():
    """Every walkthrough named in the section's table is one of its parts, and each part's Python
    is an example these tests run."""
    text = README.read_text()
    section = text[text.index(HEADING):text.index("### From the command line")]
    parts = re.findall(r"^#### (.+)$", section, re.M)
    assert parts == ["A sqlite3 script", "A psycopg 3 script", "Django", "Flask and SQLAlchemy",
                     "FastAPI and async SQLAlchemy", "asyncio, with the library", "What your application sees"]
    for extra in ("[psycopg]", "[psycopg2]", "[sqlalchemy]", "[django]"):
        assert f"pip install 'outbox-delivery{extra}'" in section, extra
