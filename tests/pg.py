"""The real PostgreSQL the tests use: whether it answers (unreachable, a test FAILS under CI=true,
since CI must not pass by skipping, and skips elsewhere, saying why), and throwaway databases.

Each throwaway database is made for one test and dropped after it; its name carries the time it
was made, so the first one a run makes also drops any a killed run left behind. An outbox on
PostgreSQL needs a secrets key file (``OUTBOX_SECRETS_KEY_FILE``): ``key_file`` is the run's.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

#: An administrative connection to the server the outbox's tests make their databases on.
ADMIN_DSN = os.environ.get("OUTBOX_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
#: Every throwaway outbox database's name starts so, then the Unix time it was made.
PREFIX = "outbox_conf_"
#: A throwaway database older than this was left behind (no test run lasts this long).
STALE_SECONDS = 3 * 3600

_errors: dict[str, BaseException | None] = {}


@cache
def key_file() -> Path:
    """The key file the outboxes of this run seal their PostgreSQL databases' secrets with (as an
    operator gives every process one), made once per run; ``OUTBOX_SECRETS_KEY_FILE`` names it."""
    from outbox.keyring import generate_key, write_keys

    path = Path(tempfile.mkdtemp(prefix="outbox-pg-key-")) / "secrets.key"
    write_keys(path, [generate_key()], replace=False)
    return path


def key_env() -> dict[str, str]:
    """The setting that gives an outbox process ``key_file``."""
    return {"OUTBOX_SECRETS_KEY_FILE": str(key_file())}
_swept: set[str] = set()


def _unreachable(dsn: str) -> BaseException | None:
    """Why the PostgreSQL at ``dsn`` does not answer, or None; asked once per DSN."""
    if dsn not in _errors:
        import asyncpg

        async def check() -> None:
            conn = await asyncpg.connect(dsn, timeout=3)
            await conn.close()

        def run() -> None:  # on its own thread: the caller may be inside a running loop
            try:
                asyncio.run(check())
            except BaseException as exc:  # any failure means "unreachable"
                _errors[dsn] = exc
            else:
                _errors[dsn] = None

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(10)
        _errors.setdefault(dsn, TimeoutError("no answer within 10 s"))
    return _errors[dsn]


def require(dsn: str) -> str:
    """``dsn`` if its PostgreSQL answers; otherwise fail the test under CI=true, else skip it."""
    error = _unreachable(dsn)
    if error is not None:
        message = f"PostgreSQL at {dsn} is unreachable: {error!r}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return dsn


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


async def create_database(*, create: bool = True) -> str:
    """A new, empty database on the test server (the test fails or skips if there is none); returns
    its DSN. Drop it with ``drop_database``. Without ``create`` its name is only chosen, for a test
    that makes it itself, as a user would (``createdb``)."""
    import asyncpg

    require(ADMIN_DSN)
    name = f"{PREFIX}{int(time.time())}_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        if ADMIN_DSN not in _swept:
            _swept.add(ADMIN_DSN)
            await _drop_stale(admin)
        if create:
            await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    finally:
        await admin.close()
    return _with_database(ADMIN_DSN, name)


async def drop_database(dsn: str) -> None:
    """Drop a database ``create_database`` made, closing whatever is still connected to it."""
    import asyncpg

    name = urlsplit(dsn).path.lstrip("/")
    assert name.startswith(PREFIX), name
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@asynccontextmanager
async def database(*, create: bool = True) -> AsyncIterator[str]:
    """A new, empty database (``create_database``), yielding its DSN; dropped on leaving."""
    dsn = await create_database(create=create)
    try:
        yield dsn
    finally:
        await drop_database(dsn)


async def _drop_stale(admin: Any) -> None:
    """Drop the throwaway databases older than STALE_SECONDS: a killed run's leftovers."""
    names = [row[0] for row in await admin.fetch(
        "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", PREFIX)]
    for name in names:
        made = re.fullmatch(re.escape(PREFIX) + r"(\d+)_[0-9a-f]+", name)
        if made and time.time() - int(made.group(1)) > STALE_SECONDS:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
