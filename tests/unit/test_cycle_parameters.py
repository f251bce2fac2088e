"""The PostgreSQL cycle's parameters are named, and so are every other move's: the SQL names each
array (``$settle_status``, ``$next_attempt_at``), the Python fills each by that name, and each part's
or move's columns are listed once in the order its rows are made, so a parameter shifted, missing or
unknown fails here rather than writing one column's value into another."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from datetime import timedelta
from enum import Enum

import pytest

from outbox import Event, Outcome, Status, Submission
from outbox.lifecycle import MOVES
from outbox.model import Approve, Cancel, Change, Hold, Reject, Release, Replay, Resolve, Settle, Start
from outbox.store.plumbing import Named, statements
from outbox.store.postgres.changes import (
    CLAIM_COLUMNS,
    MOVE_COLUMNS,
    SETTLE_COLUMNS,
    START_COLUMNS,
    cycle_arguments,
    move_arguments,
)
from outbox.store.postgres.sql import CYCLE, CYCLE_SQL, MOVE_SQL
from outbox.store.protocol import Claim
from outbox.store.records import ATTEMPT_COLUMNS

from .test_model import EV, STARTED, T0

LATER = T0 + timedelta(seconds=7)
FINISHED = replace(STARTED, attempt_id="a-2", number=2, fence=3, worker="w-9", finished_at=LATER,
                   submission=Submission.SUBMITTED, outcome=Outcome.RETRYABLE, status_code=503, reply="busy",
                   external_id="x-1", error="try later", duration_ms=12.5, stage="data")
#: (every value distinct from the others, so that one in another's place shows)
SETTLE = Settle("acme/s1", 8, Status.PENDING, (Event(kind="scheduled_retry", at=LATER + timedelta(seconds=1),
                                                      actor="w-9"),),
                last_error="503", next_attempt_at=LATER + timedelta(minutes=1), attempts=9, attempt=FINISHED,
                new_fence=4)
START = Start("acme/s2", 5, replace(STARTED, attempt_id="a-3", number=6, fence=5, worker="w-8"), EV)
CLAIM = Claim("w-7", T0, LATER, 10)
UNNEST = re.compile(r"unnest\(([^()]*)\)\s+WITH ORDINALITY AS b \(([^)]*)\)")
LAST = (Event(kind="replayed", at=LATER + timedelta(seconds=2), actor="op"),)
#: One change of each move outside the cycle, every value distinct from the others.
MOVED: list[Change] = [
    Release("acme/r1", 11, LATER + timedelta(minutes=2), LAST), Hold("acme/h1", 12, "approval needed", LAST),
    Replay("acme/p1", Status.DEAD, LATER + timedelta(minutes=3), 13, LAST),
    Resolve("acme/v1", Status.PENDING, LAST, next_attempt_at=LATER + timedelta(minutes=4), max_attempts=14),
    Cancel("acme/c1", Status.REVOKED, LAST),
    Approve("acme/a1", "sha256:ab", LATER + timedelta(hours=1), "op:alice", LATER + timedelta(minutes=5), LAST),
    Reject("acme/j1", LAST)]


def _by_name(arguments: list[object]) -> dict[str, object]:
    return dict(zip(CYCLE_SQL.names, arguments[CYCLE_SQL.numbered:], strict=True))


def _stored(value: object) -> object:
    return value.value if isinstance(value, Enum) else value


def _attempt(attempt: object, column: str) -> object:
    return _stored(getattr(attempt, "fence" if column == "attempt_fence" else column))


def test_every_name_the_cycle_uses_is_filled_and_nothing_else():
    assert set(CYCLE_SQL.names) == {f"{part}_{column}" for part, columns in (
        ("settle", (*SETTLE_COLUMNS, "held")), ("start", (*START_COLUMNS, "held")), ("claim", CLAIM_COLUMNS))
        for column in columns}
    assert CYCLE_SQL.numbered == 6  # logged's events, as every move's statement takes them
    assert "$settle" not in CYCLE_SQL.text and "$claim" not in CYCLE_SQL.text
    assert len(cycle_arguments([], [], None)) == len(cycle_arguments([SETTLE], [START], CLAIM)) == 6 + 35


def test_each_array_the_sql_unnests_is_named_for_the_column_it_becomes():
    text = statements("postgres")["cycle"]
    found = UNNEST.findall(text)
    assert len(found) == 2
    for arrays, aliases in found:
        named = [re.fullmatch(r"\$(settle|start)_(\w+)::\w+\[\]", a.strip()) for a in arrays.split(",")]
        assert all(named), arrays
        assert [m[2] for m in named] + ["n" if named[0][1] == "settle" else "i"] == [  # (then the ordinal)
            a.strip() for a in aliases.split(",")]


def test_each_settle_value_is_in_the_array_of_its_column():
    by_name = _by_name(cycle_arguments([SETTLE], [], None))
    change = {"intent_key": SETTLE.key, "updated_at": SETTLE.events[-1].at} | {f.name: _stored(getattr(SETTLE, f.name))
                                                                   for f in fields(SETTLE)}
    for column in SETTLE_COLUMNS:
        expected = _attempt(FINISHED, column) if column in ATTEMPT_COLUMNS else change[column]
        assert by_name[f"settle_{column}"] == [expected], column
    assert len(set(map(repr, (by_name[f"settle_{c}"] for c in SETTLE_COLUMNS)))) == len(SETTLE_COLUMNS)


def test_each_start_and_claim_value_is_in_the_array_of_its_column():
    by_name = _by_name(cycle_arguments([], [START], CLAIM))
    for column in START_COLUMNS:
        expected = {"intent_key": START.key, "fence": START.fence}.get(column) or _attempt(START.attempt, column)
        assert by_name[f"start_{column}"] == [expected], column
    assert [by_name[f"claim_{c}"] for c in CLAIM_COLUMNS] == [CLAIM.now, CLAIM.owner, CLAIM.lease_until, CLAIM.limit]
    assert by_name["settle_intent_key"] == [] and by_name["claim_limit"] == 10


def test_named_parameters_are_numbered_after_the_numbered_ones_and_taken_only_by_name():
    statement = Named.of("-- $ignored in a comment\nSELECT $1, $b::int, $a, $b, $2")
    assert (statement.text, statement.names, statement.numbered) == ("SELECT $1, $3::int, $4, $3, $2", ("b", "a"), 2)
    assert statement.arguments([1, 2], {"a": "A", "b": "B"}) == [1, 2, "B", "A"]
    for numbered, named in (([1, 2], {"a": "A"}), ([1, 2], {"a": "A", "b": "B", "c": "C"}), ([1], {"a": 1, "b": 2})):
        with pytest.raises(ValueError, match="takes 2 numbered parameters and"):
            statement.arguments(numbered, named)


def test_every_move_outside_the_cycle_takes_its_columns_by_name_after_its_events():
    assert set(MOVE_SQL) == set(MOVE_COLUMNS) == set(MOVES) - {"claim", "recover", *CYCLE} == {c.move for c in MOVED}
    text = statements("postgres")
    for move, named in MOVE_SQL.items():
        assert set(named.names) == set(MOVE_COLUMNS[move]) and named.numbered == 6, move
        assert not re.search(r"\$[a-z]", named.text), move
        ((arrays, aliases),) = UNNEST.findall(text[move])
        names = [re.fullmatch(r"\$(\w+)::\w+\[\]", a.strip()) for a in arrays.split(",")]
        assert all(names), arrays
        assert [m[1] for m in names] + ["n"] == [a.strip() for a in aliases.split(",")], move


@pytest.mark.parametrize("change", MOVED, ids=lambda change: change.move)
def test_each_move_value_is_in_the_array_of_its_column(change):
    arguments = move_arguments(change.move, [change])
    named = MOVE_SQL[change.move]
    by_name = dict(zip(named.names, arguments[named.numbered:], strict=True))
    for column in MOVE_COLUMNS[change.move]:
        expected = {"intent_key": change.key, "updated_at": change.events[-1].at}.get(column)
        assert by_name[column] == [expected or _stored(getattr(change, column))], column
    assert len(set(map(repr, by_name.values()))) == len(by_name)
    assert arguments[:6] == [[1], ["replayed"], [LAST[0].at], ["op"], [None], ["{}"]]
