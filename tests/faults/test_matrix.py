"""The fault matrix, network faults (tier 1): webhook intents on SQLite and on PostgreSQL,
delivered by two real ``outbox worker`` processes sharing the store, through the
fault-injecting proxy (tests/faults/proxy.py) to a real uvicorn receiver running the receivers'
idempotency middleware. The receiver records
the ground truth (each effect per key, each attempt id that reached it, any effect applied under
a stale fence); once every intent settles, the store's histories and that truth go through the
checker, and the truth table is printed and kept under test-artifacts/.

``--faults=long`` runs more intents with a random seed, named in the table's title and in any
failure, so a failing run can be replayed (``--faults-seed``).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from outbox import DestinationSpec, NotFound, OnUnknown, Outbox, Settings
from outbox.model import SETTLED
from receivers import IdempotencyMiddleware, SqliteRecordStore

from ..acceptance.conftest import clean_env, outbox_worker
from ..conftest import SECRET, rows
from ..servers import Served
from .checker import AttemptFact, IntentFact, Truth, check, off_diagonal, render, truth_table
from .proxy import Proxy
from .tables import ARTIFACTS, REPORTS, Reported, store_name

TIER1_SEED = 18
#: Most connections pass; every fault mode is common enough to show up in a tier-1 run.
WEIGHTS = {"pass": 4.0, "refuse": 1.0, "reset_before": 1.0, "reset_after": 1.0, "late": 0.5,
           "headers_close": 1.0, "drip": 1.0}
WORKERS = 2  # worker processes sharing the store, each with 4 sends in flight
TIMEOUT_SECONDS = 1.0  # the destinations' timeout; the proxy's late answers come after 2.5 s


@dataclass
class Ground:
    """What really happened at the receiver (written on uvicorn's thread, read after the run)."""

    effects: Counter[str] = field(default_factory=Counter)
    reached: set[str] = field(default_factory=set)
    highest_fence: dict[str, int] = field(default_factory=dict)
    stale_fence_applied: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def truth(self) -> Truth:
        with self.lock:
            return Truth(dict(self.effects), frozenset(self.reached), self.stale_fence_applied)


def _header(scope: dict[str, Any], name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == name), "")


def receiver_app(ground: Ground, records: Path) -> Any:
    """The receiver: a recorder of every request that reached it, around the idempotency
    middleware, around the effect (counted per key; answered 201 with an External-Id)."""

    async def effect(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        key = _header(scope, b"idempotency-key")
        fence = int(_header(scope, b"outbox-fence") or 0)
        with ground.lock:
            ground.effects[key] += 1
            if fence < ground.highest_fence.get(key, fence):
                ground.stale_fence_applied += 1
            effect_id = f"effect-{key}-{ground.effects[key]}"
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"), (b"external-id", effect_id.encode())]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    guarded = IdempotencyMiddleware(effect, SqliteRecordStore(records), secrets=SECRET, retention_seconds=3600)

    async def recorder(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            key, attempt = _header(scope, b"idempotency-key"), _header(scope, b"outbox-attempt-id")
            fence = int(_header(scope, b"outbox-fence") or 0)
            with ground.lock:
                ground.reached.add(attempt)
                ground.highest_fence[key] = max(fence, ground.highest_fence.get(key, fence))
        await guarded(scope, receive, send)

    return recorder


async def facts(box: Outbox, keys: list[tuple[str, str]]) -> list[IntentFact]:
    """Each enqueued (so acknowledged) intent as the store records it."""
    found = []
    for scope, action_id in keys:
        try:
            intent, history = await box.show(action_id, scope=scope)
        except NotFound:
            found.append(IntentFact(f"{scope}/{action_id}", True, None, ()))
            continue
        attempts = tuple(AttemptFact(a.attempt_id, a.submission.value if a.submission else None,
                                     a.outcome.value if a.outcome else None) for a in history.attempts)
        found.append(IntentFact(intent.key, True, intent.status.value, attempts))
    return found


async def settled(box: Outbox, keys: list[tuple[str, str]], timeout: float) -> list[str]:
    """Wait until every intent is settled; returns the keys still open when ``timeout`` ran out."""
    deadline = time.monotonic() + timeout
    while True:
        open_ = [f"{s}/{a}" for s, a in keys if (await box.get(a, scope=s)).status not in SETTLED]
        if not open_ or time.monotonic() > deadline:
            return open_
        await asyncio.sleep(0.2)


async def run_until_settled(box: Outbox, worker: Any, keys: list[tuple[str, str]],
                            timeout: float) -> tuple[list[str], list[IntentFact]]:
    """Run ``worker`` until every intent is settled (or ``timeout``), stop it; the keys still
    open and the recorded history."""
    task = asyncio.create_task(worker.run())
    try:
        still_open = await settled(box, keys, timeout=timeout)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)
    return still_open, await facts(box, keys)


@contextmanager
def worker_processes(tmp_path: Path, env: dict[str, str], count: int) -> Iterator[list[tuple[Popen[bytes], Path]]]:
    """``count`` real ``outbox worker`` processes sharing one store (each with its own log);
    killed on leaving if still running."""
    with ExitStack() as stack:
        workers = []
        for n in range(count):
            (home := tmp_path / f"worker-{n}").mkdir()
            workers.append(stack.enter_context(outbox_worker(home, env)))
        yield workers


async def ready(workers: list[tuple[Popen[bytes], Path]], timeout: float = 30) -> None:
    """Wait until every worker process has said it started."""
    deadline = time.monotonic() + timeout
    while not all(" started (" in log.read_text() for _, log in workers):
        assert time.monotonic() < deadline, "a worker did not start:\n" + "\n".join(
            log.read_text()[-2000:] for _, log in workers)
        await asyncio.sleep(0.05)


def stopped(workers: list[tuple[Popen[bytes], Path]]) -> None:
    """SIGTERM each worker and wait for its drain."""
    for worker, _ in workers:
        worker.terminate()
    for worker, _ in workers:
        worker.wait(30)


def tier(request: pytest.FixtureRequest) -> tuple[bool, int]:
    """Whether this is the long run, and its seed: ``--faults-seed``, else the tier-1 seed, or a
    random one for ``--faults=long`` (named in the table's title and the failures, to replay it)."""
    long = request.config.getoption("--faults") == "long"
    seed = request.config.getoption("--faults-seed")
    if seed is None:
        seed = random.SystemRandom().randrange(2**32) if long else TIER1_SEED
    return long, int(seed)


def report(channel: str, store: str, title: str, table: Counter[tuple[str, str]], *, summed: bool = True) -> str:
    """The truth table rendered, printed, and kept under ARTIFACTS; ``summed=False`` keeps it out
    of the run's summary (a row whose receiver is meant to break the receivers' contract)."""
    rendered = render(table, title=f"{channel} on {store}: {title}")
    REPORTS.append(Reported(channel, store, title, table, summed))
    print("\n" + rendered)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"faults-{channel}-{store}.txt").write_text(rendered + "\n")
    return rendered


async def test_network_faults_lose_duplicate_or_misreport_nothing(
        request: pytest.FixtureRequest, store_url: str, tmp_path: Path) -> None:
    long, seed = tier(request)
    count = 600 if long else 60
    store = store_name(store_url)
    rng = random.Random(seed)
    ground = Ground()
    receiver = Served(receiver_app(ground, tmp_path / "records.db"), lifespan="on", timeout_graceful_shutdown=2)
    proxy = Proxy(receiver.port, rng=rng, weights=WEIGHTS, refuse_seconds=0.05).start()
    box = await Outbox.open(store_url, settings=Settings(default_max_attempts=12))
    env = clean_env(OUTBOX_DATABASE_URL=store_url, OUTBOX_AUTHORITY="allow-all", OUTBOX_BACKOFF_INITIAL_SECONDS="0.05",
                    OUTBOX_BACKOFF_CAP_SECONDS="0.2", OUTBOX_CIRCUIT_FAILURES="0", OUTBOX_POLL_SECONDS="0.1",
                    OUTBOX_WORKER_CONCURRENCY="4", OUTBOX_DEFAULT_MAX_ATTEMPTS="12")
    try:
        common: dict[str, Any] = {"secret": SECRET, "allow_private_network": True,
                                  "timeout_seconds": TIMEOUT_SECONDS, "idempotent": True, "retention_seconds": 3600}
        # unknowns are retried inside the receiver's retention; or never (so recorded unknown)
        await box.put_destination("declared", DestinationSpec(url=f"{proxy.url}/declared", **common))
        await box.put_destination("never", DestinationSpec(url=f"{proxy.url}/never", on_unknown=OnUnknown.NEVER,
                                                           **common))
        with worker_processes(tmp_path, env, WORKERS) as workers:
            await ready(workers)  # so that each takes a share of the backlog
            keys = []
            for n in range(count):
                destination = "never" if n % 3 == 2 else "declared"
                options = {"max_attempts": 2} if n % 3 == 1 else {}  # some run out of attempts: dead letters
                result = await box.enqueue(scope="acme", action_id=f"a-{n}", destination=destination,
                                           payload={"n": n}, **options)
                keys.append((result.intent.scope, result.intent.action_id))
            still_open = await settled(box, keys, timeout=600 if long else 60)
            crashed = [(w.returncode, log.read_text()[-2000:]) for w, log in workers if w.poll() is not None]
            stopped(workers)
        history = await facts(box, keys)
        senders = await rows(store_url, "SELECT DISTINCT worker FROM attempts")
    finally:
        await box.close()
        proxy.stop()
        receiver.stop()
    truth = ground.truth()
    table = truth_table(history, truth)
    faults = ", ".join(f"{mode} {n}" for mode, n in sorted(proxy.faults.items()))
    rendered = report("webhook", store, f"{count} intents, seed {seed}, connections: {faults}", table)
    assert crashed == [], f"seed {seed}: a worker ended early"
    assert len(senders) == WORKERS, f"seed {seed}: not every worker sent: {senders}"
    assert still_open == [], f"seed {seed}: not settled: {still_open}"
    assert check(history, truth) == [], f"seed {seed}"
    assert off_diagonal(table) == 0, f"seed {seed}\n{rendered}"
    assert sum(n for mode, n in proxy.faults.items() if mode != "pass") > 0, "no fault was injected"
