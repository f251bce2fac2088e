from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

from outbox import Event, EventKind, Outcome, Status, Submission
from outbox.model import Release, Settle, Start
from outbox.store import timeline

from .test_model import STARTED, T0

DONE = replace(STARTED, finished_at=T0 + timedelta(seconds=2), submission=Submission.SUBMITTED,
               outcome=Outcome.DELIVERED)


def event(kind: str, seconds: int, **data: object) -> Event:
    return Event(kind, T0 + timedelta(seconds=seconds), "w", None, data)


def test_an_attempts_start_and_settle_keep_their_events_and_the_rest_are_rows():
    started, finished, delivered = event("attempt_started", 1), event("attempt_finished", 2), event("delivered", 2)
    start = Start("acme/a1", 1, STARTED, started)
    settle = Settle("acme/a1", 1, Status.DELIVERED, (finished, delivered), attempts=1, attempt=DONE)
    unsent = Settle("acme/a1", 1, Status.REVOKED, (event("authority_checked", 1), event("revoked", 1)))
    release = Release("acme/a1", 1, T0, (event("released", 1),))
    assert (timeline.held(start), timeline.logged(start)) == ((started,), ())
    assert (timeline.held(settle), timeline.logged(settle)) == ((finished, delivered), ())
    assert (timeline.held(unsent), timeline.logged(unsent)) == ((), unsent.events)
    assert (timeline.held(release), timeline.logged(release)) == ((), release.events)


def test_the_timeline_is_in_the_order_written_whatever_the_times():
    """Rows by id; each group after the row it names, groups after one row by attempt then write;
    a lease only the intent's row records comes last."""
    rows = [(1, event("enqueued", 0)), (2, event("leased", 9, fence=1)), (7, event("released", 1)),
            (9, event("leased", 3, fence=2))]
    first = [[2, json.loads(timeline.group([event("attempt_started", 5)], STARTED))],
             [2, json.loads(timeline.group([event("attempt_finished", 6), event("scheduled_retry", 6)], DONE))]]
    second = [[9, json.loads(timeline.group([timeline.lease_fact(T0, "w", 3), event("attempt_started", 4)],
                                            replace(STARTED, number=2)))]]
    lease = timeline.lease_fact(T0 + timedelta(seconds=8), "w", 4)
    read = timeline.merged(rows, [(replace(DONE, number=2), json.dumps(second)), (DONE, json.dumps(first))], lease)
    assert [(e.kind, e.at - T0) for e in read] == [
        (EventKind.ENQUEUED, timedelta(0)), (EventKind.LEASED, timedelta(seconds=9)),
        (EventKind.ATTEMPT_STARTED, timedelta(seconds=5)), (EventKind.ATTEMPT_FINISHED, timedelta(seconds=6)),
        (EventKind.SCHEDULED_RETRY, timedelta(seconds=6)), (EventKind.RELEASED, timedelta(seconds=1)),
        (EventKind.LEASED, timedelta(seconds=3)), (EventKind.LEASED, timedelta(0)),
        (EventKind.ATTEMPT_STARTED, timedelta(seconds=4)), (EventKind.LEASED, timedelta(seconds=8))]
    assert read[-1] == Event(EventKind.LEASED, T0 + timedelta(seconds=8), "w", None, {"fence": 4})


def test_a_group_reads_back_as_the_events_it_was_made_of():
    events = [Event(EventKind.ATTEMPT_FINISHED, T0 + timedelta(microseconds=7), "w1", "503 from the receiver",
                    {"attempt_id": "a-1", "status_code": 503, "outcome": "retryable"}),
              Event(EventKind.DELIVERED, T0, "w1")]
    assert timeline.merged([], [(DONE, json.dumps([[0, json.loads(timeline.group(events, DONE))]]))]) == events


def test_what_the_attempts_columns_give_is_kept_once():
    """An attempt's start and finish keep only what its columns do not hold (the start's authority and
    target), and read back as they were made; an event its columns do not give is kept whole."""
    failed = replace(DONE, submission=Submission.SUBMITTED, outcome=Outcome.RETRYABLE, status_code=503,
                     error="503 from the receiver")
    started = Event(EventKind.ATTEMPT_STARTED, T0, "w", None,
                    {"attempt_id": "a-1", "number": 1, "fence": 1, "authority": "allowed", "target": "https://x/"})
    finished = Event(EventKind.ATTEMPT_FINISHED, failed.finished_at, "w", "503 from the receiver",
                     {"attempt_id": "a-1", "submission": "submitted", "outcome": "retryable", "status_code": 503})
    retry = Event(EventKind.SCHEDULED_RETRY, failed.finished_at, "w", "503 from the receiver", {"next_attempt_at": "x"})
    assert json.loads(timeline.group([started], STARTED)) == [
        ["attempt_started", {"authority": "allowed", "target": "https://x/"}]]
    assert json.loads(timeline.group([finished, retry], failed))[0] == "attempt_finished"
    groups = [[0, json.loads(timeline.group([started], STARTED))],
              [0, json.loads(timeline.group([finished, retry], failed))]]
    read = timeline.merged([], [(failed, json.dumps(groups))])
    assert read == [started, finished, retry]
    assert [list(e.data) for e in read[:2]] == [list(started.data), list(finished.data)]


def test_an_event_that_differs_from_the_attempts_columns_is_kept_whole():
    """Another actor, time or data than the attempt's own: nothing is derived."""
    finished = Event(EventKind.ATTEMPT_FINISHED, DONE.finished_at, "sweeper", None,
                     {"attempt_id": "a-1", "submission": "submitted", "outcome": "delivered", "status_code": None})
    moved = Event(EventKind.ATTEMPT_STARTED, T0 + timedelta(seconds=1), "w", None,
                  {"attempt_id": "a-1", "number": 1, "fence": 1})
    for e, attempt in ((finished, DONE), (moved, STARTED)):
        assert len(json.loads(timeline.group([e], attempt))[0]) == 5
        assert timeline.merged([], [(DONE, json.dumps([[0, json.loads(timeline.group([e], attempt))]]))]) == [e]
