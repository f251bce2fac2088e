"""An intent's history as one timeline read from two places, the same for every dialect.

What an attempt's start and its settle record (``attempt_started``; ``attempt_finished``, a
``reconciled`` answer and the fate, ``delivered`` or ``scheduled_retry`` ...) is kept in the
attempt's own row (its ``events`` column, migration 0019), not as rows of ``events``, and so is
the ``leased`` fact of the lease it started under: the claim writes no event (its lease's time,
owner and fence are in the intent's row until the lease ends), and the start records it in the
attempt's row. A lease that ends with no attempt started (released, held, recovered, settled
unsent) gets its ``leased`` row from the move that ends it, and a lease's fact still only in the
intent's row is read from there (``current_lease``). A delivery then inserts one attempt row and
no event rows. Every other fact (``enqueued``, ``held``, authority denials, releases, recoveries,
operators' moves, a settle with no attempt; a flow-limited claim's ``leased``) stays a row of
``events``. Nothing is lost or rewritten; only where it is kept moved.

An attempt's ``events`` is a JSON array of groups, one per write (its start, its settle), each
``[after, [entry, ...]]``: ``after`` is the id of the intent's last ``events`` row when the group
was written (0: none). An entry is ``[kind, at, actor, reason, data]`` (``at`` ISO 8601 text),
except for an event the attempt's own columns give (``given``: its ``attempt_started`` and
``attempt_finished``, made by the attempt's worker from those columns): that one is its kind alone,
or ``[kind, data]`` with only the data the columns do not hold (the start's authority and target),
so a delivery's row does not keep its id, times, fence and outcome twice. The timeline is the
rows by id, each group placed after the row it names, groups after the same row in the order of
their attempts and writes: the order the events were written in, as when each was a row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ..model import Attempt, Change, Event, EventKind, Intent, Settle, Start


def held(change: Change) -> tuple[Event, ...]:
    """The events ``change`` keeps in its attempt's row: all of a start's and of a settle's that
    records an attempt; none of any other change's."""
    if isinstance(change, Start):
        return (change.event,)
    if isinstance(change, Settle) and change.attempt is not None:
        return change.events
    return ()


def logged(change: Change) -> tuple[Event, ...]:
    """The events ``change`` appends as rows of ``events``: those its attempt does not keep."""
    if isinstance(change, Start) or (isinstance(change, Settle) and change.attempt is not None):
        return ()
    return change.events


def lease_fact(leased_at: datetime, owner: str, fence: int) -> Event:
    """The "leased" fact of a lease its claim recorded only in the intent's row (its updated_at,
    lease_owner and fence until the lease ends), as the move that starts its attempt or ends it
    writes it (PostgreSQL's blocks unrecorded_lease and lease_entry say when, in its SQL)."""
    return Event(EventKind.LEASED, leased_at, owner, None, {"fence": fence})


def group(events: Sequence[Event], attempt: Attempt | None) -> str:
    """Events as the JSON text of the entries of a group ``attempt`` keeps (its ``after`` is the
    statement's to add; no attempt, no entry given by one)."""
    return json.dumps([_entry(e, attempt) for e in events], separators=(",", ":"))


def given(kind: EventKind, attempt: Attempt) -> tuple[datetime, str, str | None, dict[str, Any]] | None:
    """The time, actor, reason and data of the ``kind`` event that ``attempt``'s columns give, or
    None for a kind they do not."""
    if kind is EventKind.ATTEMPT_STARTED:
        return attempt.started_at, attempt.worker, None, {
            "attempt_id": attempt.attempt_id, "number": attempt.number, "fence": attempt.fence}
    if kind is EventKind.ATTEMPT_FINISHED and attempt.finished_at is not None:
        return attempt.finished_at, attempt.worker, attempt.error, {
            "attempt_id": attempt.attempt_id,
            "submission": attempt.submission.value if attempt.submission else None,
            "outcome": attempt.outcome.value if attempt.outcome else None,
            "status_code": attempt.status_code}
    return None


def _entry(e: Event, attempt: Attempt | None) -> str | list[Any]:
    """``e`` as a group keeps it: as little as the attempt's columns leave out (``given``)."""
    known = None if attempt is None else given(e.kind, attempt)
    if known is not None:
        at, actor, reason, data = known
        names = list(e.data)
        if (e.at == at and e.actor == actor and e.reason == reason and names[:len(data)] == list(data)
                and all(e.data[name] == value for name, value in data.items())):
            if len(names) == len(data):
                return e.kind.value
            return [e.kind.value, {name: e.data[name] for name in names[len(data):]}]
    return [e.kind.value, e.at.isoformat(), e.actor, e.reason, dict(e.data)]


def current_lease(intent: Intent, unrecorded: object) -> Event | None:
    """The "leased" fact of ``intent``'s lease while it is recorded only in its row (the store's
    ``unrecorded_lease`` says so): the last of its timeline, since nothing recorded came after."""
    if not unrecorded or intent.lease_owner is None:
        return None
    return lease_fact(intent.updated_at, intent.lease_owner, intent.fence)


def merged(rows: Iterable[tuple[int, Event]], attempts: Iterable[tuple[Attempt, str | None]],
           lease: Event | None = None) -> list[Event]:
    """The timeline of an intent's ``(id, event)`` rows, its attempts with their ``events`` and
    the fact of its lease that only its row records (``current_lease``)."""
    placed: list[tuple[tuple[int, ...], Event]] = [((id_, 0), event) for id_, event in rows]
    for attempt, groups in attempts:
        for written, (after, entries) in enumerate(json.loads(groups or "[]")):
            placed += [((after, 1, attempt.number, written, i), _event(entry, attempt))
                       for i, entry in enumerate(entries)]
    return [event for _, event in sorted(placed, key=lambda found: found[0])] + ([lease] if lease else [])


def _event(entry: str | list[Any], attempt: Attempt) -> Event:
    """An entry as the event it keeps (``_entry``): whole, or rebuilt from ``attempt``'s columns."""
    if isinstance(entry, str):
        return _given_event(EventKind(entry), attempt, {})
    if len(entry) == 2:
        return _given_event(EventKind(entry[0]), attempt, entry[1])
    kind, at, actor, reason, data = entry
    return Event(kind, datetime.fromisoformat(at), actor, reason, data)


def _given_event(kind: EventKind, attempt: Attempt, more: dict[str, Any]) -> Event:
    known = given(kind, attempt)
    if known is None:
        raise ValueError(f"attempt {attempt.attempt_id}'s columns give no {kind.value} event")
    at, actor, reason, data = known
    return Event(kind, at, actor, reason, {**data, **more})
