"""A record as the SQL stores keep it: one row per identity, named SQL per dialect
(``receivers/sql/<dialect>.sql``), and what both dialects share to write and read a row."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from ..queries import Queries
from ..records import Record, StoredResponse

#: The SQL stores' named statements (``sqlite`` and ``postgres``), in the receivers package.
QUERIES = Queries("receivers")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def table_name(name: str) -> str:
    """``name`` if it is a plain SQL identifier (it is written into the statements), else ValueError."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"table name {name!r} is not a plain SQL identifier")
    return name


def stored_response(status: int | None, headers: str | None, body: bytes | None, stored: Any) -> StoredResponse | None:
    """The stored response of a row's response columns (None when it has none)."""
    if status is None:
        return None
    pairs = tuple((k, v) for k, v in json.loads(headers or "[]"))
    return StoredResponse(status, pairs, bytes(body) if stored and body is not None else None)


def columns(r: Record) -> tuple[Any, ...]:
    """The record's columns after ``identity``, in table order (times as the dialect wants)."""
    response = r.response
    return (
        r.fingerprint, r.state.value, r.epoch, r.min_fence, r.lease_expires_at, r.expires_at,
        response.status if response else None,
        json.dumps([list(pair) for pair in response.headers]) if response else None,
        response.body if response else None,
        bool(response and response.body is not None),
    )


#: The identity a claim request, a completion or a release tuple starts with, for ``distinct_runs``
#: (an ``itemgetter``: called once per record of a batch).
identity_of: Callable[[tuple[Any, ...]], str] = itemgetter(0)
