"""``sender.channel.by_destination``: a batch split by destination, each group's results its own."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from outbox import Destination, Intent, OnUnknown, Outcome, Status, Submission
from sender.channel import Send, SendResult, by_destination

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
A = Destination("a", "kafka", {}, (), True, 86_400, OnUnknown.DECLARED, 10.0, False, False, False, T0, T0)
B = dataclasses.replace(A, id="b")
A_UPDATED = dataclasses.replace(A, updated_at=T0 + timedelta(seconds=1))
INTENT = Intent(1, "a1", "acme", "a", "kafka", "{}", "sha256:x", Status.LEASED, 0, 5,
                T0, None, None, "w", T0, 1, T0, T0, None)


def send(destination: Destination, n: int) -> Send:
    return Send(dataclasses.replace(INTENT, seq=n, destination=destination.id), destination, f"att-{n}", 1)


def delivered(send: Send) -> SendResult:
    return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, answered=True, external_id=send.attempt_id)


async def test_each_group_gets_its_own_sends_and_results_go_back_in_place() -> None:
    groups: list[tuple[str, datetime, list[str]]] = []

    async def group(destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        groups.append((destination.id, destination.updated_at, [s.attempt_id for s in sends]))
        return [delivered(s) for s in sends]

    sends = [send(A, 1), send(B, 2), send(A, 3), send(A_UPDATED, 4), send(B, 5)]
    results = await by_destination(sends, group)
    assert [r.external_id for r in results] == ["att-1", "att-2", "att-3", "att-4", "att-5"]
    assert sorted(groups) == [("a", T0, ["att-1", "att-3"]), ("a", A_UPDATED.updated_at, ["att-4"]),
                              ("b", T0, ["att-2", "att-5"])]


async def test_a_group_that_raises_is_unknown_and_the_others_keep_their_results() -> None:
    async def group(destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        if destination.id == "b":
            await asyncio.sleep(0)
            raise RuntimeError("the producer's state is broken")
        await asyncio.sleep(0.01)  # answered after the other group raised
        return [delivered(s) for s in sends]

    results = await by_destination([send(A, 1), send(B, 2), send(A, 3), send(B, 4)], group)
    assert [(r.submission, r.outcome, r.external_id) for r in results] == [
        (Submission.SUBMITTED, Outcome.DELIVERED, "att-1"),
        (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, None),
        (Submission.SUBMITTED, Outcome.DELIVERED, "att-3"),
        (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, None),
    ]
    assert results[1].error is not None and "RuntimeError: the producer's state is broken" in results[1].error


async def test_a_cancellation_is_not_taken_for_a_result() -> None:
    async def group(destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await by_destination([send(A, 1)], group)
