"""The SQLite store's named statements (``sql/sqlite.sql``), and its values as it stores and reads
them: times as integer microseconds (``to_us``, ``from_us``), JSON as text."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ...model import Attempt, Event, Status
from ..plumbing import from_us, statements, to_us, with_ordering_rule
from ..records import Reader, attempt_values, plain_data

#: The statements that pick due intents share one rule for ordered keys (``claimable``), and so does
#: waiting_behind (``in_the_way``).
_PICKING = ("due_seqs", "next_due_at", "flow_destinations", "flow_due_seqs", "unlimited_due_seqs")
SQL = with_ordering_rule(statements("sqlite"), _PICKING)
SQL = {**SQL, **{name: SQL[name].format(limited=SQL["limited"]) for name in _PICKING}}


def stored(value: Any) -> Any:
    """A column's value as SQLite stores it: times as ``to_us``, statuses by name."""
    if isinstance(value, datetime):
        return to_us(value)
    return value.value if isinstance(value, Status) else value


def where(filters: Iterable[tuple[str, str, Any]], params: list[Any]) -> str:
    """A listing's condition from its query's ``filters()`` (intents' and events' alike): each
    value appended to ``params`` as SQLite stores it."""
    clauses = []
    for column, operator, value in filters:
        if operator == "in":
            clauses.append(f"{column} IN ({', '.join('?' * len(value))})" if value else "0")
            params.extend(value)
        elif operator == "prefix":
            clauses.append(f"substr({column}, 1, length(?)) = ?")
            params.extend((value, value))
        else:
            clauses.append(f"{column} {operator} ?")
            params.append(stored(value))
    return " AND ".join(clauses) or "1"


#: Rows as records: times are integer microseconds (``from_us``), JSON is text.
READ = Reader(from_us)


def attempt_row(seq: int, a: Attempt) -> list[Any]:
    """An attempt as a ``put_attempts`` row."""
    attempt_id, *rest = attempt_values(a, to_us)
    return [attempt_id, seq, *rest]


def event_row(seq: int, e: Event) -> list[Any]:
    """An event as an ``insert_events`` row."""
    return [seq, e.kind, to_us(e.at), e.actor, e.reason, plain_data(e)]


def stored_row(seq: int, values: Sequence[Any]) -> list[Any]:
    """A move's row for its named block: the intent's seq, then ``moves.written``, stored."""
    return [seq, *map(stored, values)]
