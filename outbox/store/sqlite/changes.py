"""The SQLite store's ``apply``, ``claim`` and ``recover``, inside the group-committed write
transaction: the changes of every apply committed together made as one set (a named block per
move), then each apply's claim."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...crash import crash_point
from ...errors import OutboxError
from ...flow import Held, Limit, allowance, next_token_at, refilled, usable_cap, usable_rate
from ...model import Change, Intent, Start
from .. import moves, timeline
from ..plumbing import SetJob, to_us
from ..protocol import Applied, Claim
from .sql import READ, SQL, attempt_row, event_row, stored_row


def make_claim(conn: sqlite3.Connection, claim: Claim) -> tuple[list[Intent], list[Held]]:
    """Lease up to ``claim.limit`` due intents to its owner (``Store.claim``), inside the write
    transaction: five statements, however many, while no destination has a limit or a pause
    (``_flow`` then picks theirs); returns them and what the limits held back."""
    at = to_us(claim.now)
    flows = conn.execute(SQL["flow_destinations"], (at,)).fetchall()
    if not flows:
        seqs = conn.execute(SQL["due_seqs"], (at, claim.limit)).fetchone()[0]
        held: list[Held] = []
    else:
        picked, held = _flow(conn, claim, flows)
        rest = json.loads(conn.execute(SQL["unlimited_due_seqs"], (at, claim.limit - len(picked))).fetchone()[0])
        seqs = json.dumps(picked + rest)
    if seqs == "[]":
        return [], held
    conn.execute(SQL["lease"], (claim.owner, to_us(claim.lease_until), at, seqs))  # (its "leased" fact: timeline.py)
    rows = conn.execute(SQL["claimed_intents"], (seqs,)).fetchall()
    return sorted((READ.intent(r) for r in rows), key=lambda i: i.next_attempt_at), held


def _flow(conn: sqlite3.Connection, claim: Claim, flows: Sequence[sqlite3.Row]) -> tuple[list[int], list[Held]]:
    """The due intents of limited and paused destinations that ``claim`` may lease, up to its limit
    in all, by destination in id order, each limit applied as ``flow.allowance`` says (the one
    writer's claims take turns: what is leased is counted as it is), the tokens they take out of
    each bucket, and what the limits held back."""
    at = to_us(claim.now)
    picked: list[int] = []
    held: list[Held] = []
    for d in flows:
        left = claim.limit - len(picked)
        if left <= 0:
            break
        due = json.loads(conn.execute(SQL["flow_due_seqs"], (at, d["id"], left)).fetchone()[0])
        if not due:
            continue
        paused_until = READ.at(d["paused_until"])
        if paused_until is not None and paused_until > claim.now:
            held.append(Held(d["id"], Limit.PAUSED, len(due), paused_until))
            continue
        # (the stored limits as the nearest the API takes: a destination's value written by hand
        # holds its own intents back, never fails the claim of the others)
        rate = None if d["rate_per_second"] is None else usable_rate(d["rate_per_second"], d["rate_burst"])
        cap = usable_cap(d["max_in_flight"])
        last = claim.now if d["refilled_at"] is None else READ.at(d["refilled_at"])  # (a new bucket is full)
        tokens = None if rate is None else refilled(float(rate.burst) if d["tokens"] is None else d["tokens"],
                                                    last, claim.now, rate)
        in_flight = conn.execute(SQL["in_flight"], (d["id"],)).fetchone()[0] if cap else 0
        allowed = allowance(len(due), in_flight=in_flight, max_in_flight=cap, tokens=tokens)
        picked += due[:allowed.allowed]
        if allowed.held_in_flight:
            held.append(Held(d["id"], Limit.IN_FLIGHT, allowed.held_in_flight))
        if rate is not None and tokens is not None:
            tokens -= allowed.allowed
            conn.execute(SQL["put_bucket"], (d["id"], tokens, to_us(max(claim.now, last))))
            if allowed.held_rate:
                held.append(Held(d["id"], Limit.RATE, allowed.held_rate, next_token_at(tokens, claim.now, rate)))
    return picked, held


def _make(conn: sqlite3.Connection, changes: Sequence[Change]) -> list[Intent | OutboxError | None]:
    """Make ``changes`` (checked) in the write transaction, each judged on its own against its
    intent as it is: a handful of statements for the lot (one read of their targets, one UPDATE
    per move present, one write of their attempts and one of their events), a round of them
    more for each time a key comes again (the second change sees the first)."""
    results: list[Intent | OutboxError | None] = [None] * len(changes)
    for ready in moves.rounds(changes):
        _make_round(conn, [(i, changes[i]) for i in ready], results)
    return results


def _make_round(conn: sqlite3.Connection, changes: list[tuple[int, Change]],
                results: list[Intent | OutboxError | None]) -> None:
    """One round of ``_make``: ``changes`` name each key once."""
    found = conn.execute(SQL["update_targets"], (json.dumps([change.key for _, change in changes]),)).fetchone()
    rows: dict[str, list[list[Any]]] = {}
    answered: dict[int, int] = {}  # seq -> the position of the operator's change that answers with it
    attempts: list[list[Any]] = []
    events: list[list[Any]] = []
    outcome = False  # whether an attempt's outcome is among the writes
    for position, seq, status, fence, lease_expires_at, updated_at, lease_owner, unrecorded in json.loads(found[0]):
        i, change = changes[position]
        refused = moves.refusal(change, None if seq is None else (status, fence, READ.at(lease_expires_at)))
        if refused is not None:
            results[i] = refused
            continue
        if change.move in moves.ANSWERED:
            answered[seq] = i
        if not isinstance(change, Start):
            rows.setdefault(change.move, []).append(stored_row(seq, moves.written(change)))
        lease = (timeline.lease_fact(READ.at(updated_at), lease_owner, fence),) if unrecorded else ()
        attempt = moves.attempt(change)
        if attempt is not None:
            attempts.append([*attempt_row(seq, attempt), timeline.group((*lease, *timeline.held(change)), attempt)])
            outcome = outcome or attempt.finished_at is not None
        else:
            events += [event_row(seq, e) for e in (*lease, *timeline.logged(change))]
    for move, values in rows.items():
        for row in conn.execute(SQL[move], (json.dumps(values),)).fetchall():  # the operators' moves return rows
            results[answered[row["seq"]]] = READ.intent(row)
    if attempts:
        conn.executemany(SQL["put_attempts"], attempts)  # (bound as they are: no JSON to make and take apart)
    if events:
        conn.execute(SQL["insert_events"], (json.dumps(events),))
    if outcome:
        crash_point("mid_group_commit")  # (tests only) an outcome written, its batch not committed


@dataclass(slots=True, eq=False)
class Apply(SetJob):
    """One ``apply``: its changes (already checked) and its claim. The applies committed together
    (several workers' cycles) make their changes as one set, then each its claim."""

    changes: Sequence[Change]
    claim: Claim | None

    @classmethod
    def run_many(cls, conn: sqlite3.Connection, jobs: Sequence[Any]) -> list[tuple[bool, Any]]:
        made = iter(_make(conn, [change for job in jobs for change in job.changes]))
        return [(True, Applied([next(made) for _ in job.changes],
                               *(([], []) if job.claim is None else make_claim(conn, job.claim))))
                for job in jobs]


@dataclass(slots=True, eq=False)
class Recover:
    """Move ``recover``: one sweep of expired leases with no attempt in flight (``Store.recover``)."""

    now: datetime
    limit: int
    actor: str

    def __call__(self, conn: sqlite3.Connection) -> int:
        at = to_us(self.now)
        found = conn.execute(SQL["recoverable"], (at, self.limit)).fetchone()[0]
        recovered = json.loads(found)
        if not recovered:
            return 0
        conn.execute(SQL["recover"], (at, found))
        events = [event_row(seq, e) for seq, owner, leased_at, fence, unrecorded in recovered for e in (
            *((timeline.lease_fact(READ.at(leased_at), owner, fence),) if unrecorded else ()),
            moves.recovered_event(owner, self.now, self.actor))]
        conn.execute(SQL["insert_events"], (json.dumps(events),))
        return len(recovered)
