"""The SQLite writer every SQLite store shares (the receivers' record store, the outbox's store):
durable connections, one-hop transactions, group commit, where concurrent writers share a
transaction and its fsync, and times kept as integer microseconds.

A public part of ``receivers`` (the leaf package) so that the outbox's store builds on it:
``Sqlite(error)`` names the store's own "not now" error, ``GroupCommitter`` queues write jobs, and
``SetJob`` lets jobs of one kind run as one set-wide statement. One job's failure undoes only that
job, and each writer is answered only after the commit that made its write durable. aiosqlite is
imported when a connection is opened, not with this module.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

from .records import StoreUnavailable

if TYPE_CHECKING:
    import aiosqlite

T = TypeVar("T")
#: sqlite3 messages that mean "not now" rather than "wrong": answered 503, retried by callers.
UNAVAILABLE = ("locked", "busy", "full", "disk i/o", "unable to open", "readonly")
#: Durable, concurrent-reader settings for every connection: an acknowledged write survives power loss.
PRAGMAS = """
PRAGMA journal_mode = WAL;
PRAGMA synchronous = FULL;
PRAGMA foreign_keys = ON;
PRAGMA busy_timeout = {busy_timeout_ms};
"""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@overload
def to_us(value: datetime) -> int: ...
@overload
def to_us(value: None) -> None: ...
def to_us(value: datetime | None) -> int | None:
    """A time as integer microseconds since the epoch, how the SQLite stores keep time (None stays None)."""
    return None if value is None else (value - EPOCH) // _MICROSECOND


@overload
def from_us(value: int) -> datetime: ...
@overload
def from_us(value: None) -> None: ...
def from_us(value: int | None) -> datetime | None:
    """The time ``to_us`` gave ``value`` for (None stays None)."""
    return None if value is None else EPOCH + value * _MICROSECOND


#: Times a new connection's setup (pragmas, tables) is tried while the file is "locked".
SETUP_TRIES = 5


def create_private(path: Path) -> None:
    """Create the database file readable by its owner only (0600) unless it exists: it holds
    payloads and signing secrets. SQLite gives its -wal and -shm files the same mode."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass


def _letting_go(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, which, when it fails, lets go of what the frames of its traceback hold. A cursor
    stopped part way through its rows (a row its caller could not read) keeps its statement, and
    with it the connection's read snapshot, for as long as those frames live: the error handling
    around a request keeps an exception's traceback until a garbage collection, and meanwhile
    every read on that connection saw nothing written since, and no checkpoint could pass it."""
    def run(*args: Any) -> T:
        try:
            return fn(*args)
        except BaseException as exc:
            chained: list[BaseException] = []  # (a cause or context raised inside holds frames as well)
            failed: BaseException | None = exc
            while failed is not None and all(failed is not seen for seen in chained):
                chained.append(failed)
                traceback.clear_frames(failed.__traceback__)
                failed = failed.__cause__ or failed.__context__
            raise

    return run


class Sqlite:
    """The plumbing's entry points, raising ``error(message)`` when SQLite answers "not now"."""

    def __init__(self, error: Callable[[str], Exception] = StoreUnavailable) -> None:
        self.error = error

    def unavailable(self, exc: sqlite3.Error) -> Exception | None:
        """The error an sqlite3 error stands for, if it is one of "not now"."""
        text = str(exc).lower()
        if isinstance(exc, sqlite3.OperationalError) and any(word in text for word in UNAVAILABLE):
            return self.error(f"the SQLite database is unavailable: {exc}")
        return None

    async def on_thread(self, db: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` on the connection's own thread, as one hop.

        aiosqlite would hop threads once per statement; a whole transaction in one hop is what lets
        a write cost little more than its fsync. This leans on aiosqlite's worker queue, hence the
        narrow version pin in pyproject.toml.
        """
        try:
            return await db._execute(_letting_go(fn), db._conn, *args)
        except sqlite3.Error as exc:
            mapped = self.unavailable(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def connect(self, path: Path, *, busy_timeout_ms: int, script: str = "") -> aiosqlite.Connection:
        """A connection with the durable pragmas (WAL, ``synchronous=FULL``), then ``script``; a new
        database file is created 0600. Raises the "not now" error, naming the file."""
        import aiosqlite  # the driver, only once a SQLite store is opened

        try:
            if str(path) != ":memory:":
                create_private(Path(path))
            db = await aiosqlite.connect(path, isolation_level=None)
        except (sqlite3.Error, OSError) as exc:
            raise self.error(f"cannot open SQLite database {str(path)!r}: {exc}") from exc
        db.row_factory = sqlite3.Row
        setup = PRAGMAS.format(busy_timeout_ms=busy_timeout_ms) + script
        for attempt in range(SETUP_TRIES):
            try:
                await db.executescript(setup)
                return db
            except sqlite3.Error as exc:
                # Processes opening a new file together race to switch it to WAL, and SQLite answers
                # that race "locked" without waiting (waiting could deadlock): the setup is idempotent.
                if self.unavailable(exc) is not None and attempt + 1 < SETUP_TRIES:
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                await db.close()
                raise self.error(f"cannot use SQLite database {str(path)!r}: {exc}") from exc
        raise AssertionError("unreachable")


#: The plumbing of the receivers' record store: "not now" is ``receivers.records.StoreUnavailable``.
SQLITE = Sqlite()


class SetJob:
    """A write job that runs together with the other jobs of its class in a few set-wide
    statements rather than a few statements each.

    sqlite3 gives the GIL up around every statement step and the writer thread must win it back
    from the event loop each time; a batch taking a few steps rather than a few per row keeps
    the commit, and every writer waiting on it, from stretching while the loop is busy.
    """

    @classmethod
    def run_many(cls, conn: sqlite3.Connection, jobs: Sequence[Any]) -> list[tuple[bool, Any]]:
        """Run ``jobs`` (all of this class) and return each one's (ok, value or exception);
        a job that fails on its own merits is reported, not raised, so the others stand."""
        raise NotImplementedError

    def __call__(self, conn: sqlite3.Connection) -> Any:
        ok, value = type(self).run_many(conn, [self])[0]
        if not ok:
            raise value
        return value


class _JobFailed(Exception):
    """A job raised while the jobs ran side by side (its cause is the job's error)."""


def _apply_batch(
    conn: sqlite3.Connection, jobs: Sequence[Callable[[sqlite3.Connection], Any]]
) -> list[tuple[bool, Any]]:
    """Run write jobs in one transaction and commit once.

    Jobs rarely fail, so they first run side by side; only if one raises is the transaction
    rolled back and run again with a savepoint around each job, so that one's failure undoes
    only its own writes.
    """
    try:
        return _transaction(conn, jobs, _together)
    except _JobFailed:
        return _transaction(conn, jobs, _isolated)


Runner = Callable[[sqlite3.Connection, Sequence[Callable[[sqlite3.Connection], Any]]], list[tuple[bool, Any]]]


def _transaction(conn: sqlite3.Connection, jobs: Sequence[Callable[[sqlite3.Connection], Any]],
                 run: Runner) -> list[tuple[bool, Any]]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        results = run(conn, jobs)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return results


def _together(conn: sqlite3.Connection, jobs: Sequence[Callable[[sqlite3.Connection], Any]]) -> list[tuple[bool, Any]]:
    """Plain jobs in order, then each class of SetJob at once. Jobs in one batch were submitted
    concurrently, so running a later one first is as valid an order as the queue's."""
    results: list[tuple[bool, Any]] = [(False, None)] * len(jobs)
    sets: dict[type[SetJob], list[int]] = {}
    try:
        for i, job in enumerate(jobs):
            if isinstance(job, SetJob):
                sets.setdefault(type(job), []).append(i)
            else:
                results[i] = (True, job(conn))
        for kind, indexes in sets.items():
            for i, result in zip(indexes, kind.run_many(conn, [jobs[i] for i in indexes]), strict=True):
                results[i] = result
    except Exception as exc:
        raise _JobFailed from exc
    return results


def _isolated(conn: sqlite3.Connection, jobs: Sequence[Callable[[sqlite3.Connection], Any]]) -> list[tuple[bool, Any]]:
    results: list[tuple[bool, Any]] = []
    for job in jobs:
        conn.execute("SAVEPOINT job")
        try:
            value = job(conn)
        except Exception as exc:  # one job's failure must not undo the others
            if not conn.in_transaction:  # SQLite gave up the whole transaction (full, I/O error): all failed
                raise
            conn.execute("ROLLBACK TO job")
            results.append((False, exc))
        else:
            results.append((True, value))
        conn.execute("RELEASE job")
    return results


class GroupCommitter:
    """Queues write jobs for one connection and commits them in shared transactions."""

    #: Whose "not now" error a failed commit raises (a store's subclass names its own).
    sqlite: ClassVar[Sqlite] = SQLITE

    def __init__(self, db: aiosqlite.Connection, *, max_batch: int = 256) -> None:
        self.db = db
        self.max_batch = max_batch
        #: Held while a batch commits; a caller's own transaction takes it too.
        self.lock = asyncio.Lock()
        self._queue: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def write(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` in a group-committed transaction; returns once it is durable."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append((job, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def idle(self) -> None:
        """Wait until every queued job has been committed or failed."""
        if self._drainer is not None and not self._drainer.done():
            await asyncio.wait([self._drainer])  # its failures went to the writers awaiting it

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                async with self.lock:
                    results = await self.sqlite.on_thread(self.db, _apply_batch, [job for job, _ in batch])
            except BaseException as exc:  # the whole transaction failed: nobody's write landed
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, future), (ok, value) in zip(batch, results, strict=True):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    mapped = self.sqlite.unavailable(value) if isinstance(value, sqlite3.Error) else None
                    future.set_exception(mapped or value)
