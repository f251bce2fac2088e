"""Topics, patterns and the action ids of an event's intents (``outbox.topics``), as pure rules."""

from __future__ import annotations

import pytest

from outbox.errors import InvalidInput
from outbox.ids import ACTION_ID, DESTINATION_ID, MAX_KEY_LENGTH, intent_key
from outbox.intake import LONGEST_DESTINATION, MAX_EVENT_KEY
from outbox.topics import (
    EVENT_ID,
    Subscription,
    action_id_for,
    checked_pattern,
    checked_topic,
    matches,
    subscription_rows,
)


@pytest.mark.parametrize("topic", ["invoice", "invoice.paid", "user.signed_up", "a-b.c_d.9", "a.b.c.d.e.f.g.h",
                                   "x" * 200])
def test_a_topic_is_dot_separated_segments(topic):
    assert checked_topic(topic) == topic


@pytest.mark.parametrize("topic", ["", "Invoice.paid", "invoice..paid", ".invoice", "invoice.", "invoice.*", "*",
                                   "invoice paid", "invoice.paid\n", "a.b.c.d.e.f.g.h.i", "x" * 201, "ünicode"])
def test_anything_else_is_not_a_topic(topic):
    with pytest.raises(InvalidInput, match="dot-separated segments"):
        checked_topic(topic)


@pytest.mark.parametrize("pattern", ["*", "invoice", "invoice.*", "invoice.paid.*", "invoice.paid"])
def test_a_pattern_is_a_topic_a_prefix_and_dot_star_or_a_star(pattern):
    assert checked_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern", ["", "**", "invoice*", "invoice.*.paid", "*.paid", "invoice.**", ".*",
                                     "invoice.*\n", "Invoice.*"])
def test_anything_else_is_not_a_pattern(pattern):
    with pytest.raises(InvalidInput, match="malformed"):
        checked_pattern(pattern)


@pytest.mark.parametrize("pattern,topic,expected", [
    ("*", "invoice", True), ("*", "a.b.c", True),
    ("invoice.paid", "invoice.paid", True), ("invoice.paid", "invoice.paid.late", False),
    ("invoice.paid", "invoice", False),
    ("invoice.*", "invoice.paid", True), ("invoice.*", "invoice.paid.late", True),
    ("invoice.*", "invoice", False), ("invoice.*", "invoices.paid", False), ("invoice.*", "x.invoice.paid", False),
    ("invoice.paid.*", "invoice.paid", False), ("invoice.paid.*", "invoice.paid.late", True),
    ("invoice_x.*", "invoicexx.y", False),  # an underscore is a character, never a wildcard
])
def test_matching(pattern, topic, expected):
    assert matches(pattern, topic) is expected


def test_subscription_rows_are_what_the_stores_match_against():
    rows = subscription_rows("hook", [Subscription("invoice.*"), Subscription("user.created", ("acme", "shop")),
                                      Subscription("*")])
    assert rows == [["hook", "invoice.", False, None], ["hook", "user.created", True, "acme"],
                    ["hook", "user.created", True, "shop"], ["hook", "", False, None]]


def test_derived_action_ids_are_action_ids_unique_per_event_and_destination():
    longest = action_id_for("e" * 128, LONGEST_DESTINATION)
    assert ACTION_ID.fullmatch(longest) and len(longest) == 197
    assert action_id_for("inv-42", "ledger") == "evt~inv-42~ledger"
    # a destination holds no "~", so the last one splits the pair back: no two pairs make one id
    assert not DESTINATION_ID.fullmatch("b~c")
    assert action_id_for("a~b", "c").rpartition("~") == ("evt~a~b", "~", "c")
    assert EVENT_ID.fullmatch("e" * 128) and not EVENT_ID.fullmatch("e" * 129)
    assert len(intent_key("s" * (MAX_EVENT_KEY - 128), action_id_for("e" * 128, LONGEST_DESTINATION))) \
        == MAX_KEY_LENGTH
