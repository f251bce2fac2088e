import itertools
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import outbox.store
from outbox import TRANSITIONS, Event, EventKind, IllegalTransition, Status
from outbox.model import INITIAL, OPEN, TERMINAL, check_transition, lifecycle_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_status_has_a_row_in_the_transition_table():
    assert set(TRANSITIONS) == set(Status)


@pytest.mark.parametrize("current,new", list(itertools.product(Status, Status)))
def test_check_transition_accepts_exactly_the_table(current, new):
    if new in TRANSITIONS[current]:
        check_transition(current, new)
    else:
        with pytest.raises(IllegalTransition, match=f"from '{current.value}' to '{new.value}'"):
            check_transition(current, new)


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
