"""The PostgreSQL store's named statements (``sql/postgres.sql``), with the shared pieces some of
them are built from filled in."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ...model import MOVES
from ..plumbing import Named, statements, with_ordering_rule

SQL = statements("postgres")
#: "Still leased at fence F" is one rule (``still_leased``) in each move that ends or renews a worker's lease.
_STILL_LEASED = re.compile(r"\{still_leased\[([\w.]+), ([\w.]+), ([\w.]+)\]\}")
SQL = {name: _STILL_LEASED.sub(lambda found: SQL["still_leased"].format(of=found[1], lease=found[2], fence=found[3]),
                               text) for name, text in SQL.items()}
#: The cycle's claim returns its intents as records under the leases it inserted (``leased_record``), and the moves
#: that start where no lease is held return theirs with the lease columns null (``unleased``).
_LEASED_RECORD = SQL["leased_record"].format(of="due", lease="leased")
SQL["cycle"] = SQL["cycle"].replace("{leased_record[due, leased]}", _LEASED_RECORD)
SQL = {**SQL, **{name: SQL[name].replace("{unleased}", SQL["unleased"])
                 for name in ("replay", "resolve", "cancel", "approve", "reject")}}
#: Where the cycle writes an attempt, the events it keeps (``{held_group[seq, entries]}``): one rule for both places.
_HELD_GROUP = re.compile(r"\{held_group\[([\w.]+), ([\w.]+)\]\}")
SQL["cycle"] = _HELD_GROUP.sub(lambda found: SQL["held_group"].format(seq=found[1], entries=found[2]), SQL["cycle"])
#: The statements that pick due intents, and the flow-limited claim's function, share one rule for ordered keys
#: (``claimable``), and so does waiting_behind (``in_the_way``).
SQL = with_ordering_rule(SQL, ("cycle", "next_due_at", "claim_limited_function"))
#: The cycle's start judges its lease running as moves.lease_running does (``lease_running``), on the row it locks.
_LEASE_RUNNING = SQL["lease_running"].format(of="lease", at="starting.started_at")
SQL = {**SQL, **{name: SQL[name].format(logged=SQL["logged"], limited=SQL["limited"].format(at=at),
                                         lease_running=_LEASE_RUNNING)
                  for name, at in (("cycle", "$claim_now"), ("next_due_at", "$1"))}}
#: The moves a worker's cycle applies in one statement (``cycle``), beside its claim.
CYCLE = ("settle", "start")
#: The moves that decide an intent is pending and holds no lease (cancel), each run after ``lock_intents`` in its
#: transaction: a claim leases without writing the intent's row, so only a statement begun after the row's lock
#: sees the lease of a claim that held the row first.
LOCKED_FIRST = ("cancel",)
#: The cycle's parameters are named (``changes.cycle_arguments`` fills them by name); ``SQL["cycle"]`` is it numbered.
CYCLE_SQL = Named.of(SQL["cycle"])
SQL["cycle"] = CYCLE_SQL.text
#: Each other move's block appends its events the same way (``logged``), and takes its changes' columns by name
#: (``changes.move_arguments`` fills them); ``SQL[move]`` is it numbered.
MOVE_SQL = {name: Named.of(SQL[name].format(logged=SQL["logged"])) for name in MOVES
            if name not in ("claim", "recover", *CYCLE)}
SQL = {**SQL, **{name: named.text for name, named in MOVE_SQL.items()}}


def where(filters: Iterable[tuple[str, str, Any]], params: list[Any]) -> str:
    """A listing's condition from its query's ``filters()`` (intents' and events' alike): each
    value appended to ``params`` as the next numbered parameter; a record's status as ``status_in``
    says it, through the index of the stored one."""
    clauses = []
    for column, operator, value in filters:
        params.append(value)
        n = len(params)
        clauses.append(SQL["status_in"].format(values=f"${n}::text[]") if (column, operator) == ("status", "in")
                       else f"{column} = ANY(${n}::text[])" if operator == "in"
                       else f"starts_with({column}, ${n})" if operator == "prefix"
                       else f"{column} {operator} ${n}")
    return " AND ".join(clauses) or "true"
