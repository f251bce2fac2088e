"""``outbox worker``'s log lines as a log pipeline gets them: each line about an intent names
its action, attempt and fence, in text and in JSON, and no line holds a secret."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from outbox import Attempt, DestinationSpec, Outbox, Status

from ..conftest import SECRET
from ..receiver import Receiver, Reply
from .conftest import OUTBOX, clean_env

pytestmark = pytest.mark.acceptance
REPLIES = {"ok": Reply(200), "busy": Reply(503), "bad": Reply(400)}


async def prepare(url: str, base: str) -> None:
    async with await Outbox.open(url) as box:
        for name in REPLIES:
            await box.put_destination(name, DestinationSpec(
                url=f"{base}/{name}", secret=SECRET, allow_private_network=True))
            await box.enqueue(destination=name, scope="acme", action_id=f"job-{name}", payload={"n": name})


async def settled(url: str) -> dict[str, tuple[Status, list[Attempt]]] | None:
    """Every intent's status and attempts once job-ok is delivered, job-bad dead and job-busy
    scheduled for a retry; None before."""
    async with await Outbox.open(url) as box:
        found = {}
        for name in REPLIES:
            history = await box.history(f"job-{name}")
            assert history.intent is not None
            found[name] = (history.intent.status, list(history.attempts))
    done = (found["ok"][0] is Status.DELIVERED and found["bad"][0] is Status.DEAD
            and found["busy"][0] is Status.PENDING and len(found["busy"][1]) == 1)
    return found if done else None


def run_worker(url: str, log_format: str) -> tuple[str, dict[str, tuple[Status, list[Attempt]]]]:
    """Run ``outbox worker`` until the three intents have their outcomes; its stderr and them."""
    env = clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all", OUTBOX_POLL_SECONDS="0.1",
               OUTBOX_BACKOFF_INITIAL_SECONDS="600")
    worker = subprocess.Popen([OUTBOX, "worker", "--log-format", log_format], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while (found := asyncio.run(settled(url))) is None:
            assert time.monotonic() < deadline, "the worker did not settle the three intents"
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=20)
        assert worker.returncode == 0, stderr
    finally:
        worker.kill()
    return stderr, found


def deliver_three(tmp_path: Path, receiver: Receiver, log_format: str):
    """One intent delivered, one dead-lettered, one scheduled for a retry by ``outbox worker``."""
    for name, reply in REPLIES.items():
        receiver.script(f"/{name}", reply)
    url = f"sqlite:///{tmp_path / 'o.db'}"
    asyncio.run(prepare(url, receiver.url))
    return run_worker(url, log_format)


def test_json_lines_carry_the_action_attempt_and_fence(tmp_path, receiver):
    stderr, found = deliver_three(tmp_path, receiver, "json")

    records = [json.loads(line) for line in stderr.splitlines()]  # every line is one JSON object
    about = {name: [r for r in records if r.get("action_id") == f"job-{name}"] for name in REPLIES}
    assert about["ok"] == []  # delivered is a debug line
    for name, level, message in (("bad", "WARNING", "dead: rejected: receiver answered 400"),
                                 ("busy", "INFO", "retryable: receiver answered 503; next attempt at ")):
        (line,) = about[name]
        (attempt,) = found[name][1]
        assert line["level"] == level and line["message"].startswith(message)
        assert (line["attempt_id"], line["fence"], line["destination"]) == (attempt.attempt_id, attempt.fence, name)
        assert line["worker"] == attempt.worker and line["logger"] == "outbox.sender"
    assert any(r["message"].startswith("worker ") and r["message"].endswith(" started (concurrency 64)")
               for r in records)
    assert SECRET.removeprefix("whsec_") not in stderr


def test_text_lines_end_with_the_same_fields(tmp_path, receiver):
    stderr, found = deliver_three(tmp_path, receiver, "text")

    (attempt,) = found["bad"][1]
    expected = (f"WARNING outbox.sender: dead: rejected: receiver answered 400 action_id=job-bad "
                f"attempt_id={attempt.attempt_id} fence={attempt.fence} worker={attempt.worker} destination=bad")
    assert expected in stderr.splitlines()
    assert not any("job-ok" in line for line in stderr.splitlines())
    assert re.search(r"^INFO outbox\.sender: retryable: receiver answered 503; next attempt at \S+ "
                     r"action_id=job-busy attempt_id=\S+ fence=1 ", stderr, re.M)
    assert SECRET.removeprefix("whsec_") not in stderr
