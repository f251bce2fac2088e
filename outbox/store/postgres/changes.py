"""The PostgreSQL store's ``apply``: a batch of changes as the named arrays of their moves'
statements, the settles and starts with the claim in one (``cycle``), round by round."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import asyncpg

from ... import crash
from ...errors import OutboxError, StaleWrite
from ...flow import Held, Limit
from ...model import Attempt, Cancel, Change, Intent, OperatorChange, Replay, Settle, Start, Status
from ...timestamps import from_epoch
from .. import moves, timeline
from ..protocol import Applied, Claim
from ..records import ATTEMPT_COLUMNS, attempt_values, event_data
from .connection import READ, UNAVAILABLE
from .sql import CYCLE, CYCLE_SQL, LOCKED_FIRST, MOVE_SQL, SQL

log = logging.getLogger("outbox.store")
#: How many times a claim asks again for the places a lease committed after its snapshot took (``cycle``'s refused).
RECLAIMS = 8

#: Which of the cycle's named parameters is which (``$settle_status`` in sql/postgres.sql): each part's columns, in
#: the order ``_row`` makes a change's values. A column added on one side only fails as a name missing or unknown.
SETTLE_COLUMNS = ("intent_key", "fence", "status", "last_error", "next_attempt_at", "attempts", "new_fence",
                  "updated_at", *ATTEMPT_COLUMNS)
START_COLUMNS = ("intent_key", "fence", "attempt_id", "number", "attempt_fence", "worker", "started_at")
CLAIM_COLUMNS = ("now", "owner", "lease_until", "limit")
_SETTLE, _START, _CLAIM = ([f"{part}_{column}" for column in columns] for part, columns in (
    ("settle", SETTLE_COLUMNS), ("start", START_COLUMNS), ("claim", CLAIM_COLUMNS)))
#: Each other move's named arrays (``$intent_key``, ``$fence``, ...), in the order ``_row`` makes a change's values.
MOVE_COLUMNS = {
    "release": ("intent_key", "fence", "next_attempt_at", "updated_at"),
    "hold": ("intent_key", "fence", "last_error", "updated_at"),
    "replay": ("intent_key", "expected", "next_attempt_at", "max_attempts", "updated_at"),
    "resolve": ("intent_key", "status", "next_attempt_at", "max_attempts", "updated_at"),
    "cancel": ("intent_key", "expected", "updated_at"),
    "approve": ("intent_key", "approved_digest", "approval_expires_at", "approved_by", "next_attempt_at", "updated_at"),
    "reject": ("intent_key", "updated_at"),
}


def _attempt_values(a: Attempt | None) -> tuple[Any, ...]:
    """An attempt as the last values of a ``settle`` row (all null: the settle records no attempt)."""
    return (None,) * len(ATTEMPT_COLUMNS) if a is None else attempt_values(a)


def _row(change: Change) -> tuple[Any, ...]:
    """A change as one row of its move's block (its named arrays, or the cycle's part): its key,
    its fence (a worker's) or the status its caller saw (where its move starts in several), then
    a start's attempt, or what it writes (``moves.written``) and a settle's attempt."""
    head: tuple[Any, ...] = (change.key,)
    if (fence := moves.fence(change)) is not None:
        head += (fence,)
    elif isinstance(change, Replay | Cancel):
        head += (change.expected.value,)
    if isinstance(change, Start):
        a = change.attempt
        return (*head, a.attempt_id, a.number, a.fence, a.worker, a.started_at)
    written = tuple(value.value if isinstance(value, Status) else value for value in moves.written(change))
    return (*head, *written, *(_attempt_values(change.attempt) if isinstance(change, Settle) else ()))


def _events(batch: Sequence[Change]) -> list[tuple[Any, ...]]:
    """The events a batch of changes appends as rows (``timeline.logged``), as rows of
    ``logged``'s arrays ($1-$6), each with its change's place in the batch, from 1."""
    return [(n, e.kind.value, e.at, e.actor, e.reason, event_data(e))
            for n, change in enumerate(batch, 1) for e in timeline.logged(change)]


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as the arrays of a block's ``unnest`` (``width`` empty ones for no rows)."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def _named(names: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Rows as the named arrays of a move's block or a part of the cycle (a row of another width fails)."""
    return dict(zip(names, _columns(rows, len(names)), strict=True))


def move_arguments(move: str, batch: Sequence[Change]) -> list[Any]:
    """A batch of one move's changes (not the cycle's) as its statement's parameters: the events
    logged as rows, then by name the changes' columns."""
    return MOVE_SQL[move].arguments(_columns(_events(batch), 6),
                                    _named(MOVE_COLUMNS[move], [_row(change) for change in batch]))


def cycle_arguments(settles: Sequence[Change], starts: Sequence[Change], claim: Claim | None) -> list[Any]:
    """The ``cycle`` statement's parameters: the events of the settles then the starts logged as
    rows, then by name their columns with the events their attempts keep (``timeline.held``), and
    the claim's (a limit of 0 for none)."""
    claiming = (None, None, None, 0) if claim is None else (claim.now, claim.owner, claim.lease_until, claim.limit)
    return CYCLE_SQL.arguments(_columns(_events([*settles, *starts]), 6), {
        **_named(_SETTLE, [_row(c) for c in settles]), **_named(_START, [_row(c) for c in starts]),
        **dict(zip(_CLAIM, claiming, strict=True)),
        "settle_held": [timeline.group(timeline.held(c), moves.attempt(c)) for c in settles],
        "start_held": [timeline.group(timeline.held(c), moves.attempt(c)) for c in starts]})


def rounds_by_move(changes: Sequence[Change]) -> list[dict[str, list[int]]]:
    """The changes' places in ``moves.rounds``, each round by move and in key order (so batches
    that overlap lock their rows in one order)."""
    made: list[dict[str, list[int]]] = []
    for places in moves.rounds(changes):
        by_move: dict[str, list[int]] = {}
        for i in sorted(places, key=lambda i: changes[i].key):
            by_move.setdefault(changes[i].move, []).append(i)
        made.append(by_move)
    return made


def _refusal(change: Change, found: Any) -> OutboxError:
    """Why ``change`` was not applied, worded from its intent as it is now (``found``, None: gone)."""
    refused = moves.refusal(change, None if found is None else (
        found["status"], found["fence"], READ.at(found["lease_expires_at"])))
    return refused or StaleWrite(f"intent {change.key!r} changed while the write was judged; the write was not applied")


def crashing(changes: Sequence[Change]) -> bool:
    """(tests only) Whether a crash is armed to cut the batch after an attempt's outcome is written."""
    return crash.armed == "mid_group_commit" and any(
        isinstance(c, Settle) and c.attempt is not None and c.attempt.finished_at is not None for c in changes)


async def apply_rounds(conn: asyncpg.Connection, changes: Sequence[Change],
                        rounds: Sequence[Mapping[str, Sequence[int]]], claim: Claim | None) -> Applied:
    """The changes, round by round: one statement per move present, the settles and starts
    together in the ``cycle`` statement, which claims in the last round (or alone, for no
    changes; a move of ``LOCKED_FIRST`` after locking its intents), with the claim's refused places
    claimed again (``reclaimed``); then, for a round with changes refused, one read of their intents
    to word each refusal."""
    results: list[Intent | OutboxError | None] = [None] * len(changes)
    claimed: list[Intent] = []
    held: list[Held] = []
    rounds = list(rounds) or [{}]
    for r, round_ in enumerate(rounds):
        applied: dict[int, Any] = {}  # a change's place: its row (True: applied, no row)
        for move, places in round_.items():
            if move not in CYCLE:
                if move in LOCKED_FIRST:
                    await conn.execute(SQL["lock_intents"], [changes[i].key for i in places])
                rows = {row["n"]: row for row in await conn.fetch(SQL[move], *move_arguments(
                    move, [changes[i] for i in places]))}
                applied |= {i: rows[n] for n, i in enumerate(places, 1) if n in rows}
        cycled = [*round_.get("settle", ()), *round_.get("start", ())]
        asked = claim if r == len(rounds) - 1 else None
        if cycled or asked is not None:
            rows = await conn.fetch(SQL["cycle"], *cycle_arguments(
                [changes[i] for i in round_.get("settle", ())], [changes[i] for i in round_.get("start", ())], asked))
            for n in (rows[0]["settled_places"] or []) + (rows[0]["started_places"] or []):
                applied[cycled[n - 1]] = True
            claimed = [READ.intent(row) for row in rows if row["seq"] is not None]
            held = held_back(rows[0]["held"])
            if asked is not None and rows[0]["refused"]:
                claimed += await reclaimed(conn, replace(asked, limit=rows[0]["refused"]))
        refused = [i for places in round_.values() for i in places if i not in applied]
        for i, row in applied.items():
            if isinstance(changes[i], OperatorChange):
                results[i] = READ.intent(row)
        if refused:
            found = {row["intent_key"]: row for row in await conn.fetch(
                SQL["intents_by_keys"], [changes[i].key for i in refused])}
            for i in refused:
                results[i] = _refusal(changes[i], found.get(changes[i].key))
    return Applied(results, claimed, held)


async def reclaimed(conn: asyncpg.Connection, claim: Claim) -> list[Intent]:
    """The places a claim's statement refused (rows it locked whose lease another claimer
    committed after its snapshot) claimed again, each time in a statement of its own (a newer
    snapshot), so a claim of N returns N while N are claimable. A failure here keeps what was
    claimed: each statement is its own savepoint, and the leases it took stay or go with it."""
    claimed: list[Intent] = []
    for _ in range(RECLAIMS):
        try:
            async with conn.transaction():
                rows = await conn.fetch(SQL["cycle"], *cycle_arguments([], [], claim))
        except asyncpg.PostgresError as exc:
            if isinstance(exc, UNAVAILABLE):
                raise
            log.warning("claiming %d refused place(s) again failed (%s: %s)", claim.limit, type(exc).__name__, exc)
            break
        claimed += [READ.intent(row) for row in rows if row["seq"] is not None]
        if not rows[0]["refused"]:
            break
        claim = replace(claim, limit=rows[0]["refused"])
    return claimed


def held_back(found: str | None) -> list[Held]:
    """The cycle's ``held`` column (JSON rows: destination, held paused, in_flight and rate, and
    when to look again, as epoch seconds) as what the claim held back, by limit. The time is
    read as ``timestamps.from_epoch`` keeps it, whatever the function answered (its 0016 clamps
    it; 0013 answered year 33715 for a rate of 1e-12, and the read failed every cycle); PostgreSQL
    writes an infinite or NaN float in JSON as a string."""
    held: list[Held] = []
    for destination, *counts, retry_at in json.loads(found or "[]"):
        at = _epoch(retry_at)
        held += [Held(destination, limit, n, at if limit is not Limit.IN_FLIGHT else None)
                 for limit, n in zip((Limit.PAUSED, Limit.IN_FLIGHT, Limit.RATE), counts, strict=True) if n]
    return held


def _epoch(value: object) -> datetime | None:
    """A held row's time: a JSON number, or PostgreSQL's text for an infinite float ("Infinity"),
    as epoch seconds read by ``from_epoch``; None (unknown: the poll bounds the wait) for none,
    NaN or anything else."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(seconds) else from_epoch(seconds)


def statements(rounds: Sequence[Mapping[str, Sequence[int]]], claim: Claim | None) -> int:
    """How many statements ``apply_rounds`` sends (the refusals' reads and the claim's second asks aside)."""
    rounds = list(rounds) or [{}]
    return sum(sum((move not in CYCLE) + (move in LOCKED_FIRST) for move in round_)
               + (any(move in CYCLE for move in round_) or (r == len(rounds) - 1 and claim is not None))
               for r, round_ in enumerate(rounds))
