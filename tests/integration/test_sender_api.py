"""The service as deployed: the HTTP API with its embedded worker, under uvicorn, delivering to a
real receiver; producers long-poll an intent until it is settled."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx

from outbox import DestinationSpec, Outbox, Role, Settings, StoreUnavailable

from ..conftest import eventually
from ..receiver import Gate, Receiver, Reply
from .conftest import SECRET


async def _prepare(db_url: str, hook_url: str, **spec) -> str:
    async with await Outbox.open(db_url) as box:
        await box.put_destination("hook", DestinationSpec(url=hook_url, secret=SECRET, allow_private_network=True,
                                                          timeout_seconds=5, **spec))
        token, _ = await box.create_token(Role.ADMIN)
    return token


async def test_a_long_poll_answers_once_the_worker_has_delivered(tmp_path: Path, receiver: Receiver, serve_api):
    gate = Gate()
    receiver.script("/hook", Reply(200, headers={"External-Id": "rcpt-1"}, gate=gate))
    db_url = f"sqlite:///{tmp_path / 'api.db'}"
    token = await _prepare(db_url, f"{receiver.url}/hook")
    url = serve_api(Settings(database_url=db_url, worker=True, authority="allow-all"))

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        created = await c.post("/v1/intents", json={"action_id": "inv-1", "scope": "acme", "destination": "hook",
                                                    "payload": {"invoice": 1}})
        assert created.status_code == 201 and created.json()["status"] == "pending"
        polling = asyncio.create_task(c.get("/v1/intents/inv-1", params={"wait": 10}))
        [request] = await receiver.wait_for_requests(1, "/hook")  # the worker is sending it now
        assert not polling.done()  # ... so the long poll is still waiting
        gate.open()
        answer = await asyncio.wait_for(polling, 15)

    assert answer.status_code == 200
    shown = answer.json()
    assert shown["status"] == "delivered" and shown["settled"] is True
    assert shown["attempt_count"] == 1 and shown["last_error"] is None
    [attempt] = shown["attempts"]
    assert attempt["submission"] == "submitted" and attempt["outcome"] == "delivered"
    assert attempt["status_code"] == 200 and attempt["external_id"] == "rcpt-1"
    assert attempt["attempt_id"] == request.headers["outbox-attempt-id"]
    assert [e["kind"] for e in shown["events"]][-1] == "delivered"
    assert request.headers["idempotency-key"] == "acme/inv-1"
    assert request.json() == {"invoice": 1}


async def test_a_long_poll_reports_an_unknown_outcome_with_its_evidence(tmp_path: Path, receiver: Receiver,
                                                                        serve_api):
    receiver.script("/hook", Reply(200, delay=2))
    db_url = f"sqlite:///{tmp_path / 'api.db'}"
    token = await _prepare(db_url, f"{receiver.url}/hook")
    async with await Outbox.open(db_url) as box:  # a receiver that answers late, and is not idempotent
        await box.put_destination("hook", DestinationSpec(url=f"{receiver.url}/hook", allow_private_network=True,
                                                          timeout_seconds=0.3, idempotent=False))
    url = serve_api(Settings(database_url=db_url, worker=True, authority="allow-all"))

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        assert (await c.post("/v1/intents", json={"action_id": "inv-2", "scope": "acme", "destination": "hook",
                                                  "payload": {"invoice": 2}})).status_code == 201
        shown = (await c.get("/v1/intents/inv-2", params={"wait": 10})).json()

    assert shown["status"] == "unknown" and shown["settled"] is True
    [attempt] = shown["attempts"]
    assert attempt["submission"] == "maybe_submitted" and attempt["outcome"] == "unknown"
    assert "does not declare idempotency" in shown["last_error"]
    assert len(receiver.requests("/hook")) == 1


async def test_a_410_shows_as_a_disabled_destination_and_later_intents_are_parked(
        tmp_path: Path, receiver: Receiver, serve_api):
    receiver.script("/hook", Reply(410, body="gone"))
    db_url = f"sqlite:///{tmp_path / 'api.db'}"
    token = await _prepare(db_url, f"{receiver.url}/hook")
    url = serve_api(Settings(database_url=db_url, worker=True, authority="allow-all"))

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        intent = {"scope": "acme", "destination": "hook", "payload": {"n": 1}}
        assert (await c.post("/v1/intents", json={**intent, "action_id": "gone-1"})).status_code == 201
        first = (await c.get("/v1/intents/gone-1", params={"wait": 10})).json()
        assert first["status"] == "dead" and first["last_error"] == "rejected: receiver answered 410"
        destination = (await c.get("/v1/destinations/hook")).json()
        assert destination["disabled"] is True

        assert (await c.post("/v1/intents", json={**intent, "action_id": "gone-2"})).status_code == 201
        for _ in range(500):  # until the worker has looked at it
            second = (await c.get("/v1/intents/gone-2")).json()
            if "released" in [e["kind"] for e in second["events"]]:
                break
            await asyncio.sleep(0.01)
        assert second["status"] == "pending" and second["settled"] is False
        assert second["attempts"] == [] and second["attempt_count"] == 0
        released = [e for e in second["events"] if e["kind"] == "released"][-1]
        assert released["reason"] == "destination 'hook' is disabled"
    assert [r.headers["idempotency-key"] for r in receiver.requests()] == ["acme/gone-1"]


async def test_healthz_fails_once_the_embedded_sender_has_crashed(tmp_path: Path, serve_api, monkeypatch, caplog):
    from sender import Worker

    async def crash(self: Worker) -> None:
        raise RuntimeError("a bug in the sender")

    monkeypatch.setattr(Worker, "run", crash)  # the precise fault: the sender's task ends by itself
    url = serve_api(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", worker=True))
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        health = await c.get("/healthz")
        assert health.status_code == 503 and health.headers["content-type"] == "application/problem+json"
        assert health.json()["detail"] == ("the embedded sender stopped: RuntimeError: a bug in the sender; "
                                           "restart the process")
        assert (await c.get("/readyz")).status_code == 200  # the store is fine; the process is not
    assert "the embedded sender stopped: RuntimeError: a bug in the sender" in caplog.text


async def test_healthz_is_ok_while_the_embedded_sender_runs(tmp_path: Path, serve_api):
    url = serve_api(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", worker=True))
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}


async def test_healthz_names_a_failure_that_is_not_the_databases_as_what_it_is(
        tmp_path: Path, serve_api, monkeypatch, caplog):
    """A cycle that fails on an error of the sender's own (what a claim that overflowed raised) is
    not the database being away: ``/healthz`` and the log name the error, never "cannot reach the
    database", which sent an operator to look at a database that answered."""
    from outbox.store import SqliteStore

    apply = SqliteStore.apply
    failing = True

    async def overflowing(self: SqliteStore, *args: object, **kwargs: object) -> object:
        if failing:
            raise OverflowError("date value out of range")
        return await apply(self, *args, **kwargs)

    monkeypatch.setattr(SqliteStore, "apply", overflowing)  # the precise fault: the claim's arithmetic
    url = serve_api(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", worker=True, poll_seconds=0.05))
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        async def degraded() -> bool:
            return (await c.get("/healthz")).json()["status"] == "degraded"

        assert await eventually(degraded, timeout=20)
        health = await c.get("/healthz")
        assert health.status_code == 200 and (await c.get("/readyz")).status_code == 200  # the database answers
        detail = health.json()["detail"]
        assert "cannot reach the database" not in detail
        assert "the sender's cycles fail since" in detail and "on an error that is not the database's: " \
            "OverflowError: date value out of range" in detail
        assert await eventually(lambda: "on an error of the sender's, not the database's answer (OverflowError: "
                                        "date value out of range)" in caplog.text, timeout=20)
        [failed, *_] = [r for r in caplog.records if r.getMessage().startswith("a cycle failed")]
        assert failed.exc_info and failed.exc_info[0] is OverflowError  # the log has where: its traceback
        assert "in overflowing" in logging.Formatter().formatException(failed.exc_info)
        failing = False

        async def ok() -> bool:
            return (await c.get("/healthz")).json() == {"status": "ok"}

        assert await eventually(ok, timeout=40)  # (the cycles back off up to 30 s)
    assert "the cycles go through again after" in caplog.text


async def test_healthz_says_while_the_sender_cannot_reach_the_database_and_recovers(
        tmp_path: Path, serve_api, monkeypatch, caplog):
    from outbox.store import SqliteStore

    apply = SqliteStore.apply
    down = True

    async def flaky_apply(self: SqliteStore, *args: object, **kwargs: object) -> object:
        if down:
            raise StoreUnavailable("could not connect to the database")
        return await apply(self, *args, **kwargs)

    monkeypatch.setattr(SqliteStore, "apply", flaky_apply)  # the precise fault: the database is gone
    url = serve_api(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", worker=True, poll_seconds=0.05))
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        async def degraded() -> bool:
            return (await c.get("/healthz")).json()["status"] == "degraded"

        assert await eventually(degraded)
        health = (await c.get("/healthz"))
        assert health.status_code == 200
        assert "the sender cannot reach the database since" in health.json()["detail"]
        assert "could not connect to the database; it keeps trying" in health.json()["detail"]
        assert await eventually(lambda: "a store cycle failed 3 time(s) in a row" in caplog.text)
        assert "trying again in 0.1s" in caplog.text and "trying again in 0.2s" in caplog.text  # backing off
        down = False

        async def ok() -> bool:
            return (await c.get("/healthz")).json() == {"status": "ok"}

        assert await eventually(ok, timeout=10)
    assert "the database answers again after" in caplog.text
