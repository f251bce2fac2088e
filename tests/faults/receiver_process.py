"""A webhook receiver that kills itself between its effect and its idempotency record.

Run as its own process (``python -m tests.faults.receiver_process --port P ...``) under uvicorn:
``receivers.IdempotencyMiddleware`` with a ``SqliteRecordStore`` on disk, around an application
whose effect is a committed row in a SQLite file of its own (``--effects``). The first time the
handler runs for a key named in ``--crash-keys``, it commits its effect and then sends itself
SIGKILL before answering, so the middleware never completes the key's record: the window the
README's receiver contract leaves to the application.

``--fenced`` makes the effect idempotent the way the README asks: the effect's row is keyed on the
Idempotency-Key and inserted ``ON CONFLICT (key) DO NOTHING`` in the handler's own transaction,
and the answer names the effect that row records. Without it the effect is a plain insert.

The effects file is the ground truth a test reads after the run (the process may have died any
number of times): ``reached`` (every request's Outbox-Attempt-Id, before the middleware),
``runs`` (each time the handler ran: key, epoch, attempt), ``effects`` (the effect rows) and
``crashed`` (the keys whose handler killed the process).
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import uvicorn

from receivers import IdempotencyMiddleware, SqliteRecordStore

#: The effects file's tables; ``effects`` is keyed on the key only when the effect is fenced.
SCHEMA = """
CREATE TABLE IF NOT EXISTS reached (attempt_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL, epoch INTEGER NOT NULL, attempt_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS crashed (key TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL {unique}, epoch INTEGER NOT NULL,
                                    attempt_id TEXT NOT NULL);
"""


def header(scope: dict[str, Any], name: bytes) -> str:
    """A request header's first value ('' when absent)."""
    return next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == name), "")


async def lifespan(receive: Any, send: Any) -> None:
    """Answer an app's ASGI lifespan: started, then (when told) shut down."""
    await receive()
    await send({"type": "lifespan.startup.complete"})
    await receive()
    await send({"type": "lifespan.shutdown.complete"})


class Effects:
    """The application: a committed effect per handler run (fenced or not), then, for a key
    to crash on, SIGKILL of this process before anything is answered."""

    def __init__(self, path: Path, *, fenced: bool, crash_keys: frozenset[str]) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.executescript(SCHEMA.format(unique="UNIQUE" if fenced else ""))
        self.fenced = fenced
        self.crash_keys = crash_keys

    def reached(self, scope: dict[str, Any]) -> None:
        """Record a request before the middleware sees it (committed)."""
        self.db.execute("INSERT INTO reached VALUES (?)", (header(scope, b"outbox-attempt-id"),))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        claim = scope["state"]["idempotency"]
        attempt = header(scope, b"outbox-attempt-id")
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT INTO runs VALUES (?, ?, ?)", (claim.key, claim.epoch, attempt))
        conflict = "ON CONFLICT (key) DO NOTHING" if self.fenced else ""
        self.db.execute(f"INSERT INTO effects VALUES (?, ?, ?) {conflict}", (claim.key, claim.epoch, attempt))
        crash = (claim.key in self.crash_keys
                 and self.db.execute("INSERT OR IGNORE INTO crashed VALUES (?)", (claim.key,)).rowcount == 1)
        # fenced, the answer names the one effect the key has (made under this epoch or an earlier one)
        epoch = (self.db.execute("SELECT epoch FROM effects WHERE key = ?", (claim.key,)).fetchone()[0]
                 if self.fenced else claim.epoch)
        self.db.execute("COMMIT")
        if crash:  # the effect is durable; the middleware never gets to complete the record
            os.kill(os.getpid(), signal.SIGKILL)
        effect_id = f"effect-{claim.key}-{epoch}"
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"), (b"external-id", effect_id.encode())]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})


def app(effects: Effects, records: Path, lease_seconds: float, secret: str) -> Any:
    """The recorder of ``reached``, around the idempotency middleware, around ``effects``."""
    guarded = IdempotencyMiddleware(effects, SqliteRecordStore(records), secrets=secret,
                                    retention_seconds=3600, lease_seconds=lease_seconds)

    async def recorder(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            effects.reached(scope)
        await guarded(scope, receive, send)

    return recorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--records", type=Path, required=True, help="the middleware's SqliteRecordStore file")
    parser.add_argument("--effects", type=Path, required=True, help="the application's own SQLite file")
    parser.add_argument("--lease-seconds", type=float, required=True, help="the middleware's lease")
    parser.add_argument("--crash-keys", default="", help="comma-separated keys to crash on, once each")
    parser.add_argument("--fenced", action="store_true", help="insert the effect ON CONFLICT (key) DO NOTHING")
    args = parser.parse_args()
    effects = Effects(args.effects, fenced=args.fenced,
                      crash_keys=frozenset(k for k in args.crash_keys.split(",") if k))
    secret = os.environ["RECEIVER_SECRET"]
    uvicorn.run(app(effects, args.records, args.lease_seconds, secret), host="127.0.0.1", port=args.port,
                log_level="warning", lifespan="on", timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
