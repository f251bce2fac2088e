"""The fault matrix's checker: pure functions over what the outbox recorded (``IntentFact``) and
what really happened at the receivers (``Truth``), in the spirit of Jepsen's queue checker.

``check`` lists every violation of the outbox's promises (nothing acknowledged is lost, at most
one effect per key at an idempotent receiver, no outcome claimed that did not happen);
``truth_table`` counts recorded outcomes against the effects that really happened, and
``render`` prints it, so every run shows the table users judge the outbox by.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The truth table's rows (recorded outcomes) and columns (effects at the receiver), in order.
ROWS = ("delivered", "not_submitted", "unknown", "dead", "revoked")
COLUMNS = ("once", "more than once", "never")
#: Where a row's intents must land; "unknown" may land anywhere (that is what it says).
EXPECTED = {"delivered": "once", "not_submitted": "never", "dead": "never", "revoked": "never"}
CORNER = "recorded \\ truth"


@dataclass(frozen=True)
class AttemptFact:
    attempt_id: str
    submission: str | None  # "not_submitted" | "submitted" | "maybe_submitted" | None (never finished)
    outcome: str | None  # "delivered" | "retryable" | "rejected" | "conflict" | "unknown" | "denied" | None


@dataclass(frozen=True)
class IntentFact:
    key: str  # scope/action_id (the idempotency key receivers see)
    acknowledged: bool  # the producer's enqueue returned success
    status: str | None  # the store's final status; None: not in the store (lost)
    attempts: tuple[AttemptFact, ...]


@dataclass(frozen=True)
class Truth:
    """What really happened, from the receivers' side."""

    effects: Mapping[str, int]  # key -> how many times the effect happened
    reached: frozenset[str]  # attempt ids whose request reached the receiver (its Outbox-Attempt-Id)
    stale_fence_applied: int = 0  # effects applied with a fence below the highest seen for the key
    sent_after_revocation: int = 0  # requests that reached the receiver after a revocation was visible
    idempotent: bool = True  # the receiver deduplicates (at most one effect per key is required)


def check(intents: Sequence[IntentFact], truth: Truth) -> list[str]:
    """Every violation, one human-readable line each; [] when the history is honest."""
    violations: list[str] = []
    for intent in intents:
        effects = truth.effects.get(intent.key, 0)
        if intent.status is None:
            if intent.acknowledged:
                violations.append(f"{intent.key}: acknowledged but not in the store (lost)")
            continue
        if truth.idempotent and effects > 1:
            violations.append(f"{intent.key}: {effects} effects at an idempotent receiver")
        if intent.status == "delivered" and effects == 0:
            violations.append(f"{intent.key}: recorded delivered, but no effect happened")
        for attempt in intent.attempts:
            if attempt.submission == "not_submitted" and attempt.attempt_id in truth.reached:
                violations.append(f"{intent.key}: attempt {attempt.attempt_id} recorded not_submitted, "
                                  "but its request reached the receiver")
        if intent.status == "unknown" and not any(a.submission == "maybe_submitted" for a in intent.attempts):
            violations.append(f"{intent.key}: recorded unknown, but no attempt was maybe_submitted")
    if truth.stale_fence_applied:
        violations.append(f"{truth.stale_fence_applied} effect(s) applied with a stale fence")
    if truth.sent_after_revocation:
        violations.append(f"{truth.sent_after_revocation} request(s) reached a receiver after a revocation "
                          "was visible")
    return violations


def recorded(intent: IntentFact) -> str:
    """The intent's row in the truth table. ``delivered``, ``unknown`` and ``revoked`` are the
    store's statuses. An intent that ended otherwise (dead) is ``unknown`` when any attempt was
    maybe submitted (its effect may have happened), ``not_submitted`` when every finished attempt
    was not submitted (no request of it can have reached the receiver), and ``dead`` when the
    receiver answered and refused it. Any other status (pending, cancelled: the run did not
    settle it) is its own row, and an intent missing from the store is ``lost``."""
    if intent.status is None:
        return "lost"
    if intent.status != "dead":
        return intent.status
    submissions = {a.submission for a in intent.attempts if a.submission is not None}
    if "maybe_submitted" in submissions:
        return "unknown"
    if submissions == {"not_submitted"}:
        return "not_submitted"
    return "dead"


def happened(count: int) -> str:
    """The truth table's column for a key's effect count."""
    return "never" if count == 0 else "once" if count == 1 else "more than once"


def truth_table(intents: Sequence[IntentFact], truth: Truth) -> Counter[tuple[str, str]]:
    """(recorded outcome, what happened) -> how many intents; see ``recorded`` for the rows."""
    return Counter((recorded(i), happened(truth.effects.get(i.key, 0))) for i in intents)


def off_diagonal(table: Counter[tuple[str, str]]) -> int:
    """How many intents sit where their recorded outcome says they cannot (``unknown`` never does)."""
    return sum(n for (row, column), n in table.items() if row in EXPECTED and EXPECTED[row] != column)


def render(table: Counter[tuple[str, str]], *, title: str) -> str:
    """A fixed-width text table: the standard rows and columns, then any other row the table has."""
    rows = list(ROWS) + sorted({row for row, _ in table} - set(ROWS))
    width = max(len(r) for r in [*rows, CORNER])
    lines = [title, f"{CORNER:<{width}}" + "".join(f"{c:>16}" for c in COLUMNS) + f"{'total':>8}"]
    for row in rows:
        cells = [table.get((row, column), 0) for column in COLUMNS]
        lines.append(f"{row:<{width}}" + "".join(f"{n:>16}" for n in cells) + f"{sum(cells):>8}")
    lines.append(f"{'total':<{width}}" + "".join(f"{sum(n for (_, c), n in table.items() if c == column):>16}"
                                              for column in COLUMNS) + f"{sum(table.values()):>8}")
    return "\n".join(lines)
