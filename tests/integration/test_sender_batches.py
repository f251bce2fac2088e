"""A channel that takes batches (``send_many``): the worker hands it a cycle's started attempts at
once, each one's start already recorded, and records the result it gets for each in its place."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from outbox import Outbox, Outcome, Status, Submission, channels
from sender.channel import ProbeAnswer, Send, SendResult
from tests import file_channel
from tests.conftest import eventually

from .conftest import SenderEnv


@pytest.fixture
async def env(open_env) -> SenderEnv:
    """Authority allows all: every lease is judged without a read, so a cycle starts them together."""
    return await open_env(authority="allow-all")


class Journal:
    """The file channel taking batches: one write and one fsync for a batch's lines. A line
    ``refuse`` is refused unwritten (``not_submitted``, in its place); ``broken`` makes the whole
    batch raise. It notes each batch, the attempts whose start was not recorded when it came,
    and the most attempts it had in hand at once."""

    def __init__(self, box: Outbox, *, pause: float = 0.0) -> None:
        self.box, self.pause = box, pause
        self.batches: list[list[str]] = []
        self.unrecorded: list[str] = []
        self.in_hand = self.most_in_hand = 0

    async def send(self, intent, destination, *, attempt_id: str, fence: int) -> SendResult:
        return (await self.send_many([Send(intent, destination, attempt_id, fence)]))[0]

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        self.batches.append([send.intent.action_id for send in sends])
        self.in_hand += len(sends)
        self.most_in_hand = max(self.most_in_hand, self.in_hand)
        try:
            for send in sends:
                started = {a.attempt_id for a in (await self.box.history(send.intent.action_id)).attempts}
                if send.attempt_id not in started:
                    self.unrecorded.append(send.intent.action_id)
            await asyncio.sleep(self.pause)
            lines = [json.loads(send.intent.payload_json)["line"] for send in sends]
            if "broken" in lines:
                raise RuntimeError("the journal broke")
            with open(sends[0].destination.settings["path"], "a", encoding="utf-8") as file:
                for send, line in zip(sends, lines, strict=True):
                    if line != "refuse":
                        file.write(json.dumps({"key": send.intent.key, "line": line}) + "\n")
                file.flush()
                os.fsync(file.fileno())
            return [SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, error="refused") if line == "refuse"
                    else SendResult(Submission.SUBMITTED, Outcome.DELIVERED, answered=True) for line in lines]
        finally:
            self.in_hand -= len(sends)

    async def probe(self, intent, destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="a file cannot be asked")

    async def aclose(self) -> None:
        return None


@pytest.fixture
async def journal(env: SenderEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setitem(channels._kinds, "file", file_channel.CHANNEL)
    path = tmp_path / "journal.jsonl"
    await env.box.put_destination("journal", file_channel.FileSpec(channel="file", path=str(path)))
    return path


def lines(path: Path) -> list[str]:
    return sorted(json.loads(line)["line"] for line in path.read_text().splitlines()) if path.exists() else []


async def test_a_cycle_hands_its_attempts_to_a_batch_channel_at_once_each_start_recorded_first(
        env: SenderEnv, journal: Path):
    channel = Journal(env.box)
    worker = env.worker(channels={"file": channel}, concurrency=8)
    await env.enqueue("warm", {"line": "warm"}, destination="journal")
    assert await worker.run_once() == 1  # the destination is read, and cached for the next cycle
    for i in range(4):
        await env.enqueue(f"line-{i}", {"line": f"line {i}"}, destination="journal")
    await env.enqueue("refused", {"line": "refuse"}, destination="journal")
    assert await worker.run_once() == 5
    assert [sorted(batch) for batch in channel.batches] == [
        ["warm"], ["line-0", "line-1", "line-2", "line-3", "refused"]]
    assert channel.unrecorded == []  # every attempt's start was durable before the batch was sent
    assert lines(journal) == ["line 0", "line 1", "line 2", "line 3", "warm"]
    for i in range(4):
        attempt = (await env.box.history(f"line-{i}")).attempts[-1]
        assert (attempt.submission, attempt.outcome) == (Submission.SUBMITTED, Outcome.DELIVERED)
        assert (await env.box.get(f"line-{i}")).status is Status.DELIVERED
    attempt = (await env.box.history("refused")).attempts[-1]
    assert (attempt.submission, attempt.outcome, attempt.error) == (Submission.NOT_SUBMITTED, Outcome.REJECTED,
                                                                     "refused")
    assert (await env.box.get("refused")).status is Status.DEAD


async def test_a_batch_that_fails_as_a_whole_may_have_sent_every_attempt(env: SenderEnv, journal: Path):
    channel = Journal(env.box)
    worker = env.worker(channels={"file": channel}, concurrency=8)
    await env.enqueue("warm", {"line": "warm"}, destination="journal")
    assert await worker.run_once() == 1
    await env.enqueue("first", {"line": "first"}, destination="journal")
    await env.enqueue("broken", {"line": "broken"}, destination="journal")
    assert await worker.run_once() == 2
    assert sorted(channel.batches[-1]) == ["broken", "first"]
    for action_id in ("first", "broken"):
        attempt = (await env.box.history(action_id)).attempts[-1]
        assert (attempt.submission, attempt.outcome) == (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)
        assert "RuntimeError: the journal broke" in (attempt.error or "")


async def test_each_attempt_of_a_batch_takes_a_send_slot(env: SenderEnv, journal: Path):
    for i in range(12):
        await env.enqueue(f"line-{i}", {"line": f"line {i}"}, destination="journal")
    channel = Journal(env.box, pause=0.02)
    async with env.running(channels={"file": channel}, concurrency=3):
        assert await eventually(lambda: len(lines(journal)) == 12, timeout=15)
    assert channel.most_in_hand <= 3
    assert max(len(batch) for batch in channel.batches) > 1
