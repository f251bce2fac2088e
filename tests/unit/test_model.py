import re
from dataclasses import fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import get_args

import pytest

import outbox.store
from outbox import TRANSITIONS, Event, EventKind, IllegalTransition, Intent, Status
from outbox.model import (
    INITIAL,
    MOVES,
    OPEN,
    TERMINAL,
    Approve,
    Attempt,
    Cancel,
    Change,
    Hold,
    Reject,
    Release,
    Replay,
    Resolve,
    Settle,
    Start,
    check_change,
    expected_status,
    lifecycle_table,
    target_status,
)

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_status_has_a_row_in_the_transition_table():
    assert set(TRANSITIONS) == set(Status)


def test_delivered_and_cancelled_are_terminal():
    assert {Status.DELIVERED, Status.CANCELLED} == TERMINAL


def test_intents_start_pending_or_held_and_open_statuses_can_move():
    assert {Status.PENDING, Status.HELD} == INITIAL
    assert all(TRANSITIONS[s] for s in OPEN)


def test_dead_and_revoked_leave_only_by_replay_to_pending():
    assert Status.PENDING in TRANSITIONS[Status.DEAD]
    assert Status.DELIVERED not in TRANSITIONS[Status.DEAD]
    assert Status.DELIVERED not in TRANSITIONS[Status.REVOKED]


def test_the_readme_lifecycle_section_is_what_the_model_generates():
    section = re.search(r"^## Intent lifecycle\n\n(.*?)\n*(?=^## |\Z)", README.read_text(), re.M | re.S)
    assert section, "the README has no '## Intent lifecycle' section"
    expected = lifecycle_table()
    if section.group(1) + "\n" != expected:
        print(f"The README's Intent lifecycle section should read, below its heading:\n\n{expected}")
        pytest.fail("the README's Intent lifecycle section differs from outbox.model.lifecycle_table(); "
                    "paste the text printed under 'Captured stdout'")


def test_an_event_read_back_as_a_string_carries_its_kind():
    event = Event(kind="lease_expired", at=datetime(2030, 1, 1, tzinfo=UTC), actor="w")
    assert event.kind is EventKind.LEASE_EXPIRED and event.kind == "lease_expired"
    with pytest.raises(ValueError, match="leaseexpired"):
        Event(kind="leaseexpired", at=datetime(2030, 1, 1, tzinfo=UTC), actor="w")


# -- changes ------------------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, tzinfo=UTC)
EV = Event(kind="released", at=T0, actor="w")
STARTED = Attempt(attempt_id="a-1", number=1, fence=1, worker="w", started_at=T0, finished_at=None, submission=None,
                  outcome=None, status_code=None, reply=None, external_id=None, error=None, duration_ms=None)
#: One change of each type.
CHANGES: list[Change] = [
    Start("acme/a1", 1, STARTED, EV),
    Settle("acme/a1", 1, Status.DELIVERED, (EV,)),
    Release("acme/a1", 1, T0, (EV,)),
    Hold("acme/a1", 1, "needs approval", (EV,)),
    Replay("acme/a1", Status.DEAD, T0, 5, (EV,)),
    Resolve("acme/a1", Status.PENDING, (EV,), T0, 5),
    Cancel("acme/a1", Status.PENDING, (EV,)),
    Approve("acme/a1", "sha256:aa", T0, "op", T0, (EV,)),
    Reject("acme/a1", (EV,)),
]


def test_every_move_but_the_claim_and_the_recovery_is_made_by_one_change_type():
    """The claim and the sweeper's recovery are made by ``Store.claim`` and ``Store.recover``."""
    assert [type(change) for change in CHANGES] == list(get_args(Change))
    assert sorted(change.move for change in CHANGES) == sorted(set(MOVES) - {"claim", "recover"})


def test_a_moves_columns_are_intent_columns_it_either_sets_or_clears():
    columns = {f.name for f in fields(Intent)} - {"status", "updated_at"}
    for move in MOVES.values():
        assert {*move.sets, *move.clears} <= columns, move.name
        assert not set(move.sets) & set(move.clears), move.name


@pytest.mark.parametrize("change", CHANGES, ids=lambda change: change.move)
def test_a_change_expects_the_status_its_caller_saw_else_its_moves_sources(change):
    saw = getattr(change, "expected", None)
    assert {expected_status(change)} == ({saw} if saw is not None else MOVES[change.move].sources)


@pytest.mark.parametrize("change", CHANGES, ids=lambda change: change.move)
def test_a_change_ends_in_its_own_status_else_its_moves_one_target(change):
    ends = getattr(change, "status", None)
    assert target_status(change) is (ends if ends is not None else next(iter(MOVES[change.move].targets)))
    assert target_status(change) in MOVES[change.move].targets


@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("change", [c for c in CHANGES if hasattr(c, "expected")], ids=lambda change: change.move)
def test_a_change_is_made_only_from_a_status_its_move_starts_in(change, status):
    saw = replace(change, expected=status)
    if status in MOVES[change.move].sources:
        check_change(saw)
    else:
        with pytest.raises(IllegalTransition, match=f"from '{status.value}' to '{target_status(saw).value}'"):
            check_change(saw)


@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("change", [c for c in CHANGES if hasattr(c, "status")], ids=lambda change: change.move)
def test_a_change_ends_only_in_a_status_its_move_ends_in(change, status):
    ending = replace(change, status=status)
    if status in MOVES[change.move].targets:
        check_change(ending)
    else:
        with pytest.raises(IllegalTransition, match=f"move '{change.move}' cannot end in '{status.value}'"):
            check_change(ending)


@pytest.mark.parametrize("change", [c for c in CHANGES if not isinstance(c, Start)], ids=lambda change: change.move)
def test_every_change_appends_an_event(change):
    check_change(change)
    with pytest.raises(ValueError, match="at least one event"):
        check_change(replace(change, events=()))


def test_a_start_is_checked_without_an_events_tuple():
    check_change(CHANGES[0])  # its one event is a field of its own


_FROM = re.compile(r"(?<!\w)FROM\b", re.I)


def _expressions(text: str) -> list[str]:
    """The comma-separated expressions ``text`` starts with, up to a closing parenthesis or a
    FROM outside parentheses and quotes (a VALUES row, or a SELECT's columns)."""
    parts, depth, quoted, start, end = [], 0, False, 0, len(text)
    for i, char in enumerate(text):
        if char == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif depth == 0 and (char == ")" or _FROM.match(text, i)):
            end = i
            break
        elif depth == 0 and char == ",":
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:end].strip())
    return parts


def _kinds_written(sql: str) -> list[str]:
    """The literal event kinds the ``INSERT INTO events`` statements of ``sql`` write."""
    kinds = []
    for statement in re.sub(r"--[^\n]*", "", sql).split(";"):
        insert = re.search(r"INSERT\s+(?:OR\s+\w+\s+)?INTO\s+events\s*\(([^)]*)\)\s*(?:VALUES\s*\(|SELECT\b)(.*)",
                           statement, re.I | re.S)
        if insert is None:
            continue
        columns = [column.strip().lower() for column in insert.group(1).split(",")]
        kind = _expressions(insert.group(2))[columns.index("kind")]
        if literal := re.fullmatch(r"'([^']*)'", kind):
            kinds.append(literal.group(1))
    return kinds


def test_every_event_kind_the_dialect_sql_writes_is_an_event_kind():
    written = {path.relative_to(Path(outbox.store.__file__).parent): _kinds_written(path.read_text())
               for path in Path(outbox.store.__file__).parent.rglob("*.sql")}
    assert "leased" in [kind for kinds in written.values() for kind in kinds], written  # the claim's event
    for path, kinds in written.items():
        for kind in kinds:
            assert kind in {k.value for k in EventKind}, f"{path} writes events of kind {kind!r}, not an EventKind"
