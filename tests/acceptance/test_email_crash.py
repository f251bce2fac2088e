"""``kill -9`` of ``outbox worker`` while a message's DATA is in progress: the server holds the
whole message and has not answered. After a restart nothing is lost, the message whose DATA
completed is never reported ``not_submitted``, and (mail servers do not deduplicate) it is not
sent again: it waits, ``unknown``, for an operator."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from outbox import IntentQuery, Outbox, Settings, Status, Submission
from sender import Worker
from sender.email import EmailSpec

from ..smtp import SmtpServer
from .conftest import clean_env, kill_9, outbox_worker

pytestmark = pytest.mark.acceptance

LEASE_SECONDS = 1.0


async def test_kill_9_during_data_leaves_the_message_unknown_never_not_submitted(tmp_path: Path) -> None:
    server = SmtpServer(after_data="hold", replies=["250 2.0.0 Ok: queued as FIRST"]).start()
    db = tmp_path / "outbox.db"
    url = f"sqlite:///{db}"
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS, poll_seconds=0.1)
    try:
        async with await Outbox.open(url, settings=settings) as box:
            await box.put_destination("mail", EmailSpec.model_validate({
                "channel": "email", "host": "127.0.0.1", "port": server.port, "tls": "none",
                "allow_insecure": True, "allow_private_network": True, "from": "shop@example.com",
                "timeout_seconds": 30}))
            for n in (1, 2):
                await box.enqueue(destination="mail", scope="acme", action_id=f"mail-{n}",
                                  payload={"to": ["ann@example.org"], "subject": f"#{n}", "text": "hello"})

            env = clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all", OUTBOX_WORKER_CONCURRENCY="1",
                            OUTBOX_LEASE_SECONDS=str(LEASE_SECONDS), OUTBOX_POLL_SECONDS="0.1")
            with outbox_worker(tmp_path, env) as (worker, log):
                deadline = time.monotonic() + 20
                while len(server.received) < 2:  # the second message's final "." has arrived
                    assert worker.poll() is None, f"the worker exited early:\n{log.read_text()}"
                    assert time.monotonic() < deadline, f"{len(server.received)} messages in 20 s:\n{log.read_text()}"
                    await asyncio.sleep(0.05)
                kill_9(worker)
            held = await box.get(next(f"mail-{n}" for n in (1, 2)
                                      if server.received[1].message["Subject"] == f"#{n}"))
            assert held.status is Status.LEASED  # the dead worker's lease, its attempt in flight

            recovering = Worker(box)
            running = asyncio.create_task(recovering.run())
            try:
                settled = await box.wait(held.action_id, timeout=20)
            finally:
                recovering.stop()
                await running
            intents = {i.action_id: i for i in (await box.list_intents(IntentQuery(limit=10))).intents}
            assert len(intents) == 2  # nothing lost
            first = next(a for a in intents if a != held.action_id)
            assert intents[first].status is Status.DELIVERED
            assert settled.status is Status.UNKNOWN
            for action_id in intents:
                for attempt in (await box.history(action_id)).attempts:
                    assert attempt.submission is not Submission.NOT_SUBMITTED, (action_id, attempt)
            [attempt] = (await box.history(held.action_id)).attempts
            assert attempt.submission is Submission.MAYBE_SUBMITTED
            assert len(server.received) == 2  # never sent again on its own
    finally:
        server.stop()
