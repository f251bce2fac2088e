import itertools

import pytest

from outbox import TRANSITIONS, IllegalTransition, Status
from outbox.model import INITIAL, OPEN, TERMINAL, check_transition


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
