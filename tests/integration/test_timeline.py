"""An intent's timeline reads the same wherever its facts are kept: a recorded run, made through
``Store.apply`` as the sender makes it, reads back as it did when every event was a row (the
expected lists were captured from that store), and rows written that way read the same after
migration 0019 moves what their attempts hold into them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from outbox import Event, Outbox, Outcome, Status, Submission
from outbox.model import Attempt, NewIntent, Replay, Settle, Start
from outbox.store.protocol import Claim

from ..conftest import open_box, rows

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(kind: str, seconds: int, actor: str = "w1", reason: str | None = None, **data: Any) -> Event:
    return Event(kind, at(seconds), actor, reason, data)


def started(key: str, number: int, fence: int, seconds: int) -> Attempt:
    return Attempt(f"{key}/{number}", number, fence, "w1", at(seconds), None, None, None, None, None, None, None,
                   None)


def finished(a: Attempt, seconds: int, outcome: Outcome, status_code: int | None, error: str | None) -> Attempt:
    return Attempt(a.attempt_id, a.number, a.fence, a.worker, a.started_at, at(seconds), Submission.SUBMITTED,
                   outcome, status_code, None, None, error, 5.0)


def start_event(a: Attempt) -> Event:
    return event("attempt_started", int((a.started_at - T0).total_seconds()), attempt_id=a.attempt_id,
                 number=a.number, fence=a.fence, authority="allow-all", target="https://billing.example/hook")


def finish_event(a: Attempt, seconds: int) -> Event:
    return event("attempt_finished", seconds, reason=a.error, attempt_id=a.attempt_id, submission="submitted",
                 outcome=a.outcome.value if a.outcome else None, status_code=a.status_code)


async def claim(box: Outbox, seconds: int) -> Any:
    [intent] = (await box.store.apply([], claim=Claim("w1", at(seconds), at(seconds) + LEASE, 1))).claimed
    return intent


async def apply(box: Outbox, *changes: Any) -> None:
    """Apply ``changes``, every one applied (an operator's answered with its intent)."""
    assert not any(isinstance(result, Exception) for result in (await box.store.apply(list(changes))).results)


async def record(box: Outbox) -> None:
    """The run: r1 retried (a reconcile's answer among its settle's events), then delivered; r2
    revoked with no attempt, replayed by an operator, then dead on a rejection."""
    await box.store.insert_intents([
        (NewIntent("r1", "acme", "billing", '{"n":1}', "sha256:aa", 5, T0, None, None, T0),
         event("enqueued", 0, "api")),
        (NewIntent("r2", "acme", "billing", '{"n":2}', "sha256:bb", 5, at(1), None, None, T0),
         event("enqueued", 0, "api"))])
    one = await claim(box, 2)
    first = started(one.key, 1, one.fence, 3)
    await apply(box, Start(one.key, one.fence, first, start_event(first)))
    done = finished(first, 4, Outcome.UNKNOWN, None, "timed out")
    await apply(box, Settle(one.key, one.fence, Status.PENDING, (
        finish_event(done, 4), event("reconciled", 4, state="absent", fence=2),
        event("scheduled_retry", 4, reason="reconciled: retrying is safe", next_attempt_at=at(5).isoformat())),
        next_attempt_at=at(5), attempts=1, attempt=done, new_fence=2))
    two = await claim(box, 1)
    assert two.action_id == "r2"
    await apply(box, Settle(two.key, two.fence, Status.REVOKED, (
        event("authority_checked", 6, reason="no grant"), event("revoked", 6, reason="no grant"))))
    await apply(box, Replay(two.key, Status.REVOKED, at(7), 5, (event("replayed", 7, "op", "granted now"),)))
    one = await claim(box, 8)
    second = started(one.key, 2, one.fence, 9)
    await apply(box, Start(one.key, one.fence, second, start_event(second)))
    done = finished(second, 10, Outcome.DELIVERED, 200, None)
    await apply(box, Settle(one.key, one.fence, Status.DELIVERED, (
        finish_event(done, 10), event("delivered", 10, reason="receiver answered 200")), attempts=2, attempt=done))
    two = await claim(box, 11)
    third = started(two.key, 1, two.fence, 12)
    await apply(box, Start(two.key, two.fence, third, start_event(third)))
    done = finished(third, 13, Outcome.REJECTED, 422, "422")
    await apply(box, Settle(two.key, two.fence, Status.DEAD, (
        finish_event(done, 13), event("dead_lettered", 13, reason="rejected (422)")), attempts=1, attempt=done))


def timeline(events: list[Event]) -> list[tuple[Any, ...]]:
    return [(e.kind.value, int((e.at - T0).total_seconds()), e.actor, e.reason, dict(e.data)) for e in events]


STARTED = {"authority": "allow-all", "target": "https://billing.example/hook"}
#: The run's timelines as the store read them back when every event was a row of ``events``.
EXPECTED = {
    "r1": [
        ("enqueued", 0, "api", None, {}),
        ("leased", 2, "w1", None, {"fence": 1}),
        ("attempt_started", 3, "w1", None, {"attempt_id": "acme/r1/1", "number": 1, "fence": 1, **STARTED}),
        ("attempt_finished", 4, "w1", "timed out", {"attempt_id": "acme/r1/1", "submission": "submitted",
                                             "outcome": "unknown", "status_code": None}),
        ("reconciled", 4, "w1", None, {"state": "absent", "fence": 2}),
        ("scheduled_retry", 4, "w1", "reconciled: retrying is safe", {"next_attempt_at": at(5).isoformat()}),
        ("leased", 8, "w1", None, {"fence": 3}),
        ("attempt_started", 9, "w1", None, {"attempt_id": "acme/r1/2", "number": 2, "fence": 3, **STARTED}),
        ("attempt_finished", 10, "w1", None, {"attempt_id": "acme/r1/2", "submission": "submitted",
                                              "outcome": "delivered", "status_code": 200}),
        ("delivered", 10, "w1", "receiver answered 200", {}),
    ],
    "r2": [
        ("enqueued", 0, "api", None, {}),
        ("leased", 1, "w1", None, {"fence": 1}),
        ("authority_checked", 6, "w1", "no grant", {}),
        ("revoked", 6, "w1", "no grant", {}),
        ("replayed", 7, "op", "granted now", {}),
        ("leased", 11, "w1", None, {"fence": 2}),
        ("attempt_started", 12, "w1", None, {"attempt_id": "acme/r2/1", "number": 1, "fence": 2, **STARTED}),
        ("attempt_finished", 13, "w1", "422", {"attempt_id": "acme/r2/1", "submission": "submitted",
                                               "outcome": "rejected", "status_code": 422}),
        ("dead_lettered", 13, "w1", "rejected (422)", {}),
    ],
}


async def test_a_recorded_runs_timelines_read_as_when_every_event_was_a_row(store_url: str):
    box = await open_box(store_url)
    try:
        await record(box)
        for action_id, expected in EXPECTED.items():
            history = await box.history(action_id, scope="acme")
            assert timeline(history.events) == expected
        # what the attempts hold is not written again as rows
        kinds = [kind for (kind,) in await rows(store_url, "SELECT kind FROM events ORDER BY id")]
        assert not {"attempt_started", "attempt_finished", "delivered", "dead_lettered"} & set(kinds)
    finally:
        await box.close()


async def test_rows_written_before_migration_0019_read_as_the_same_timeline(store_url: str,
                                                                            monkeypatch: pytest.MonkeyPatch):
    """The run's rows as the store wrote them before 0019 (every event a row), migrated."""
    from outbox.store import migrator
    from outbox.store.postgres import store as postgres_dialect
    from outbox.store.sqlite import store as sqlite_dialect

    sqlite = store_url.startswith("sqlite:")
    module = sqlite_dialect if sqlite else postgres_dialect
    with monkeypatch.context() as patched:
        # (and 0021's columns, which today's registration of the destination writes)
        patched.setattr(module, "scripts_for", lambda name: [m for m in migrator.scripts_for(name)
                                                             if m.version < 19 or m.version == 21])
        box = await open_box(store_url)
        await box.close()

    def time(seconds: int) -> str:
        return str(int(at(seconds).timestamp() * 1_000_000)) if sqlite else f"'{at(seconds).isoformat()}'"

    def text(value: Any) -> str:
        import json

        return "NULL" if value is None else "'" + (value if isinstance(value, str) else json.dumps(value)) + "'"

    for seq, (action_id, status, attempts) in enumerate((("r1", "delivered", 2), ("r2", "dead", 1)), 1):
        await rows(store_url, f"""
            INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest, status,
                                 max_attempts, attempts, next_attempt_at, created_at, updated_at, fence)
            VALUES ('acme/{action_id}', '{action_id}', 'acme', 'billing', 'webhook', '{{"n":{seq}}}', 'sha256:aa',
                    '{status}', 5, {attempts}, {time(0)}, {time(0)}, {time(13)}, 3)""")
        for kind, seconds, actor, reason, data in EXPECTED[action_id]:
            await rows(store_url, f"""
                INSERT INTO events (intent_seq, kind, at, actor, reason, data)
                VALUES ({seq}, '{kind}', {time(seconds)}, '{actor}', {text(reason)}, {text(data)})""")
        for kind, seconds, _, _, data in EXPECTED[action_id]:
            if kind == "attempt_started":
                await rows(store_url, f"""
                    INSERT INTO attempts (attempt_id, intent_seq, number, fence, worker, started_at)
                    VALUES ('{data["attempt_id"]}', {seq}, {data["number"]}, {data["fence"]}, 'w1', {time(seconds)})""")
    box = await Outbox.open(store_url)  # migrates 0019
    try:
        for action_id, expected in EXPECTED.items():
            assert timeline((await box.history(action_id, scope="acme")).events) == expected
        kinds = [kind for (kind,) in await rows(store_url, "SELECT kind FROM events ORDER BY id")]
        assert "attempt_started" not in kinds and "attempt_finished" not in kinds
        assert kinds.count("leased") == 4  # the rows no attempt holds stay
    finally:
        await box.close()


async def test_an_attempt_whose_row_keeps_no_events_yet_keeps_its_settle(store_url: str):
    """An attempt row that holds no group (written by hand, or before its row kept events) gets its
    settle's group all the same, and its timeline still reads."""
    box = await open_box(store_url)
    try:
        await box.store.insert_intents([
            (NewIntent("r1", "acme", "billing", '{"n":1}', "sha256:aa", 5, T0, None, None, T0),
             event("enqueued", 0, "api"))])
        one = await claim(box, 2)
        first = started(one.key, 1, one.fence, 3)
        await apply(box, Start(one.key, one.fence, first, start_event(first)))
        await rows(store_url, "UPDATE attempts SET events = '[]'")
        done = finished(first, 4, Outcome.DELIVERED, 200, None)
        await apply(box, Settle(one.key, one.fence, Status.DELIVERED, (
            finish_event(done, 4), event("delivered", 4, reason="receiver answered 200")), attempts=1, attempt=done))
        assert timeline((await box.history("r1", scope="acme")).events) == [
            ("enqueued", 0, "api", None, {}),
            ("attempt_finished", 4, "w1", None, {"attempt_id": "acme/r1/1", "submission": "submitted",
                                                 "outcome": "delivered", "status_code": 200}),
            ("delivered", 4, "w1", "receiver answered 200", {})]
    finally:
        await box.close()
