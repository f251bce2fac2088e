"""The receivers' SQLite plumbing and named-SQL loader as the outbox's store uses them: SQLite
answering "not now" raises the outbox's StoreUnavailable (answered 503), and the statements are
the outbox's own, in ``outbox/store/sql/``. The only module of the store that imports the
receivers' SQLite pieces (the group committer, its set jobs, the microsecond times)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from receivers import sqlite_writer as _sqlite
from receivers.queries import Queries
from receivers.sqlite_writer import SetJob, from_us, to_us

from ..errors import StoreUnavailable
from ..lifecycle import OPEN, STOPPED, Status

SQLITE = _sqlite.Sqlite(StoreUnavailable)
connect, on_thread, unavailable = SQLITE.connect, SQLITE.on_thread, SQLITE.unavailable
queries = Queries(__package__)
__all__ = ["SQLITE", "GroupCommitter", "Named", "SetJob", "connect", "from_us", "on_thread", "queries", "statements",
           "to_us", "unavailable"]
#: Where a statement uses a rule about one intents row, ``{rule[row]}``, ``row`` naming the row: the payload
#: an intent of an event sends (``event_payload``), whether its lease's "leased" fact is recorded nowhere yet
#: (``unrecorded_lease``) and that fact as an attempt keeps it (``lease_entry``), and on PostgreSQL whether it
#: holds no lease (``holds_no_lease``).
_ROW_RULE = re.compile(r"\{(event_payload|unrecorded_lease|lease_entry|holds_no_lease)\[(\w+)\]\}")


def _listed(statuses: list[Status]) -> str:
    return ", ".join(f"'{status.value}'" for status in statuses)


def with_ordering_rule(sql: dict[str, str], into: tuple[str, ...]) -> dict[str, str]:
    """``sql`` with the ordering rule, ``in_the_way`` (its statuses lifecycle's OPEN and STOPPED),
    filled into ``claimable`` and ``waiting_behind``, and ``claimable`` into the statements named
    ``into``: what is in a key's way is written once per dialect, whoever asks."""
    # (listed as the partial index intents_ordering's predicate lists them, which SQLite matches term by term:
    # the open statuses in their lifecycle order, then the stopped by name)
    rule = _bare(sql["in_the_way"]).format(open=_listed([s for s in Status if s in OPEN]),
                                           stopped=_listed(sorted(STOPPED, key=lambda s: s.value)))
    done = {**sql, "claimable": _bare(sql["claimable"]).format(in_the_way=rule),
            "waiting_behind": sql["waiting_behind"].format(in_the_way=rule)}
    return {**done, **{name: done[name].replace("{claimable}", done["claimable"]) for name in into}}


def _bare(fragment: str) -> str:
    """A fragment's SQL without its comment lines, to fill into a statement's line."""
    return "\n".join(line for line in fragment.splitlines() if not line.lstrip().startswith("--"))


def statements(dialect: str) -> dict[str, str]:
    """A dialect's named statements (``sql/<dialect>.sql``), each ``{rule[row]}`` filled from its
    block ``rule`` for that row: one rule (where an intent's payload is stored, when a lease's
    fact is to be written) however many statements apply it."""
    sql = queries.load(dialect)
    return {name: _ROW_RULE.sub(lambda found: sql[found[1]].format(of=found[2]), text) for name, text in sql.items()}


_NAMED = re.compile(r"\$([a-z_][a-z0-9_]*)")
_NUMBERED = re.compile(r"\$(\d+)")


@dataclass(frozen=True, slots=True)
class Named:
    """A statement whose parameters are named in its SQL (``$settle_fence``) beside the numbered
    ones it shares with other statements (``$1``): each name is numbered after those, in order of
    first use, and ``arguments`` takes the values by name, so that a parameter added or removed
    cannot shift the others, and a name missing or unknown fails before the statement is sent."""

    text: str  # the SQL as sent: every name replaced by its number
    names: tuple[str, ...]
    numbered: int  # how many numbered parameters come first

    @classmethod
    def of(cls, sql: str) -> Named:
        """``sql`` with its names numbered (its comment lines, which may name them too, left out)."""
        sql = _bare(sql)
        numbered = max((int(n) for n in _NUMBERED.findall(sql)), default=0)
        names = tuple(dict.fromkeys(_NAMED.findall(sql)))
        number = {name: f"${numbered + i}" for i, name in enumerate(names, 1)}
        return cls(_NAMED.sub(lambda found: number[found[1]], sql), names, numbered)

    def arguments(self, numbered: Sequence[Any], named: Mapping[str, Any]) -> list[Any]:
        """The statement's parameters: ``numbered`` first, then ``named`` in the order of ``names``."""
        if len(numbered) != self.numbered or named.keys() != set(self.names):
            raise ValueError(f"the statement takes {self.numbered} numbered parameters and {sorted(self.names)}; "
                             f"given {len(numbered)} and {sorted(named)}")
        return [*numbered, *(named[name] for name in self.names)]


class GroupCommitter(_sqlite.GroupCommitter):
    """Group commit whose failed commits raise the outbox's StoreUnavailable."""

    sqlite = SQLITE
