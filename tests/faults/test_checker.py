"""The checker's own tests: histories that must fail, each for its one reason, and honest ones
that must pass; and the truth table's cells for a hand-made history."""

from __future__ import annotations

import pytest

from . import tables
from .checker import AttemptFact, IntentFact, Truth, check, off_diagonal, recorded, render, truth_table


def attempt(attempt_id: str, submission: str | None, outcome: str | None = None) -> AttemptFact:
    return AttemptFact(attempt_id, submission, outcome)


def intent(key: str, status: str | None, *attempts: AttemptFact, acknowledged: bool = True) -> IntentFact:
    return IntentFact(key, acknowledged, status, attempts)


DELIVERED = intent("acme/d", "delivered", attempt("d1", "submitted", "delivered"))
#: An honest history: delivered once, refused before sending, unknown after a lost answer (the
#: effect happened), unknown whose request never arrived, and a dead letter the receiver refused.
HONEST = [
    DELIVERED,
    intent("acme/n", "dead", attempt("n1", "not_submitted", "retryable"), attempt("n2", "not_submitted", "retryable")),
    intent("acme/u1", "unknown", attempt("u1", "maybe_submitted", "unknown")),
    intent("acme/u2", "unknown", attempt("u2", "maybe_submitted", "unknown")),
    intent("acme/r", "dead", attempt("r1", "submitted", "rejected")),
    intent("acme/v", "revoked"),
]
HONEST_TRUTH = Truth(effects={"acme/d": 1, "acme/u1": 1}, reached=frozenset({"d1", "u1", "r1"}))


def test_an_honest_history_passes() -> None:
    assert check(HONEST, HONEST_TRUTH) == []


def test_retries_that_reach_an_idempotent_receiver_twice_pass_with_one_effect() -> None:
    history = [intent("acme/k", "delivered", attempt("a1", "maybe_submitted", "unknown"),
                      attempt("a2", "submitted", "delivered"))]
    assert check(history, Truth({"acme/k": 1}, frozenset({"a1", "a2"}))) == []


def test_a_lost_intent_that_was_never_acknowledged_is_no_violation() -> None:
    assert check([intent("acme/x", None, acknowledged=False)], Truth({}, frozenset())) == []


def test_duplicates_at_a_receiver_that_does_not_deduplicate_are_allowed() -> None:
    history = [intent("acme/k", "delivered", attempt("a1", "maybe_submitted", "unknown"),
                      attempt("a2", "submitted", "delivered"))]
    assert check(history, Truth({"acme/k": 2}, frozenset({"a1", "a2"}), idempotent=False)) == []


@pytest.mark.parametrize(("history", "truth", "says"), [
    pytest.param([intent("acme/x", None)], Truth({}, frozenset()), "acme/x: acknowledged but not in the store",
                 id="lost acknowledged intent"),
    pytest.param([DELIVERED], Truth({"acme/d": 2}, frozenset({"d1"})), "acme/d: 2 effects at an idempotent receiver",
                 id="two effects for a key"),
    pytest.param([DELIVERED], Truth({}, frozenset({"d1"})), "acme/d: recorded delivered, but no effect",
                 id="delivered without effect"),
    pytest.param([intent("acme/n", "dead", attempt("n1", "not_submitted", "retryable"))],
                 Truth({}, frozenset({"n1"})), "acme/n: attempt n1 recorded not_submitted, but its request reached",
                 id="not_submitted reached the receiver"),
    pytest.param([intent("acme/u", "unknown", attempt("u1", "submitted", "retryable"))],
                 Truth({}, frozenset({"u1"})), "acme/u: recorded unknown, but no attempt was maybe_submitted",
                 id="unknown without maybe_submitted"),
    pytest.param([DELIVERED], Truth({"acme/d": 1}, frozenset({"d1"}), stale_fence_applied=1),
                 "1 effect(s) applied with a stale fence", id="stale fence applied"),
    pytest.param([DELIVERED], Truth({"acme/d": 1}, frozenset({"d1"}), sent_after_revocation=2),
                 "2 request(s) reached a receiver after a revocation", id="send after revocation"),
])
def test_a_dishonest_history_fails_for_its_one_reason(history: list[IntentFact], truth: Truth, says: str) -> None:
    violations = check(history, truth)
    assert len(violations) == 1, violations
    assert violations[0].startswith(says), violations


def test_every_violation_of_a_history_is_reported() -> None:
    history = [*HONEST, intent("acme/x", None), intent("acme/y", "delivered", attempt("y1", "not_submitted"))]
    truth = Truth({**HONEST_TRUTH.effects, "acme/d": 3}, HONEST_TRUTH.reached | {"y1"}, stale_fence_applied=1)
    assert len(check(history, truth)) == 5  # lost, 3 effects, y delivered without effect, y1 reached, stale


@pytest.mark.parametrize(("fact", "row"), [
    (intent("k", "dead", attempt("a", "not_submitted"), attempt("b", "maybe_submitted")), "unknown"),
    (intent("k", "dead", attempt("a", "maybe_submitted"), attempt("b", "not_submitted")), "unknown"),
    (intent("k", "dead", attempt("a", "not_submitted"), attempt("b", None)), "not_submitted"),
    (intent("k", "dead", attempt("a", "not_submitted"), attempt("b", "submitted", "rejected")), "dead"),
    (intent("k", "dead"), "dead"),
    (intent("k", "pending", attempt("a", "not_submitted")), "pending"),
    (intent("k", None), "lost"),
])
def test_an_intent_s_row_follows_its_attempts(fact: IntentFact, row: str) -> None:
    assert recorded(fact) == row


def test_the_truth_table_of_a_hand_made_history() -> None:
    history = [*HONEST, intent("acme/twice", "delivered", attempt("t1", "submitted", "delivered"))]
    truth = Truth({**HONEST_TRUTH.effects, "acme/twice": 2}, HONEST_TRUTH.reached | {"t1"}, idempotent=False)
    table = truth_table(history, truth)
    assert dict(table) == {
        ("delivered", "once"): 1, ("delivered", "more than once"): 1,
        ("not_submitted", "never"): 1,
        ("unknown", "once"): 1, ("unknown", "never"): 1,
        ("dead", "never"): 1,
        ("revoked", "never"): 1,
    }
    assert off_diagonal(table) == 1  # delivered twice; unknown may sit anywhere
    lines = render(table, title="hand-made").splitlines()
    assert lines[0] == "hand-made"
    assert lines[1].split() == ["recorded", "\\", "truth", "once", "more", "than", "once", "never", "total"]
    assert [line.split() for line in lines[2:]] == [
        ["delivered", "1", "1", "0", "2"],
        ["not_submitted", "0", "0", "1", "1"],
        ["unknown", "1", "0", "1", "2"],
        ["dead", "0", "0", "1", "1"],
        ["revoked", "0", "0", "1", "1"],
        ["total", "2", "1", "4", "7"],
    ]
    assert len({len(line) for line in lines[1:]}) == 1  # fixed width


def test_the_rendered_table_adds_rows_the_run_did_not_settle() -> None:
    table = truth_table([intent("acme/p", "pending"), intent("acme/x", None)], Truth({}, frozenset()))
    rendered = render(table, title="t").splitlines()
    assert [line.split()[0] for line in rendered[2:]] == [
        "delivered", "not_submitted", "unknown", "dead", "revoked", "lost", "pending", "total"]


def test_the_summary_sums_each_channel_and_store_over_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables, "REPORTS", [])
    assert tables.summary() == ""
    honest = truth_table(HONEST, HONEST_TRUTH)
    for store, title in (("sqlite", "network, seed 1"), ("sqlite-crashes", "kills 3"), ("postgres", "network")):
        tables.REPORTS.append(tables.Reported("webhook", store, title, honest))
    text = tables.summary()
    assert text.index("webhook on postgres, 1 row(s)") < text.index("webhook on sqlite, 2 row(s)")
    sqlite = text[text.index("webhook on sqlite"):]
    assert "  - sqlite: network, seed 1\n  - sqlite-crashes: kills 3" in sqlite
    summed = render(honest + honest, title="").split("\n")[1:]  # the cells of both rows, added
    assert sqlite.split("\n")[1:1 + len(summed)] == summed
    tables.REPORTS.append(tables.Reported("webhook", "sqlite-plain", "not idempotent", honest, summed=False))
    text = tables.summary()
    sqlite = text[text.index("webhook on sqlite"):]
    assert sqlite.startswith("webhook on sqlite, 2 row(s)") and "sqlite-plain: not idempotent (not summed)" in sqlite
    assert sqlite.split("\n")[1:1 + len(summed)] == summed
