"""The reads every dialect makes alike: one named statement, its rows read as records.

A dialect gives three ways to run a named statement (``_one``: its first row as a record or
None; ``_all``: every row as a record; ``_value``: its first row's first column, None for no
row), and a reader of its records (``records.Reader``); the store protocol's plain lookups are
then written once, here, whatever the SQL beneath them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from ..destinations import Destination
from ..grants import Grant
from ..keyring import Keyring
from ..model import Intent
from ..tokens import TokenInfo
from .records import Reader, Row

T = TypeVar("T")


class Lookups(ABC):
    """The plain lookups of ``Store``, over a dialect's ``_one``, ``_all`` and ``_value``."""

    #: How the dialect reads its rows as records.
    read: Reader
    keyring: Keyring | None

    @abstractmethod
    async def _one(self, name: str, args: Sequence[Any], record: Callable[[Row], T]) -> T | None:
        """Statement ``name`` with ``args``: its first row as ``record`` reads it, or None."""

    @abstractmethod
    async def _all(self, name: str, args: Sequence[Any], record: Callable[[Row], T]) -> list[T]:
        """Statement ``name`` with ``args``: every row, as ``record`` reads it."""

    @abstractmethod
    async def _value(self, name: str, args: Sequence[Any]) -> Any:
        """Statement ``name`` with ``args``: its first row's first column, or None for no row."""

    def _destination(self, row: Row) -> Destination:
        return self.read.destination(row, self.keyring)

    async def get_intent(self, key: str) -> Intent | None:
        return await self._one("intent_by_key", (key,), self.read.intent)

    async def intents_named(self, action_id: str) -> list[Intent]:
        return await self._all("intents_by_action", (action_id,), self.read.intent)

    async def waiting_behind(self, key: str) -> Intent | None:
        return await self._one("waiting_behind", (key,), self.read.intent)

    async def next_due_at(self, now: datetime | None = None) -> datetime | None:
        found: datetime | None = self.read.at(await self._value("next_due_at", (now,)))
        return found

    async def oldest_due_at(self, now: datetime) -> datetime | None:
        found: datetime | None = self.read.at(await self._value("oldest_due", (now,)))
        return found

    async def count_by_status(self) -> list[tuple[str, str, int]]:
        return await self._all("count_by_status", (), _count)

    async def get_grant(self, grant_id: str) -> Grant | None:
        return await self._one("grant_by_id", (grant_id,), self.read.grant)

    async def list_grants(self) -> list[Grant]:
        return await self._all("list_grants", (), self.read.grant)

    async def find_grant(self, scope: str, destination: str, now: datetime) -> Grant | None:
        return await self._one("matching_grant", (scope, destination, now), self.read.grant)

    async def get_destination(self, destination_id: str) -> Destination | None:
        return await self._one("destination_by_id", (destination_id,), self._destination)

    async def list_destinations(self, *, owner: str | None = None) -> list[Destination]:
        if owner is not None:
            return await self._all("owned_destinations", (owner,), self._destination)
        return await self._all("list_destinations", (), self._destination)

    async def token_by_hash(self, token_hash: str) -> TokenInfo | None:
        return await self._one("token_by_hash", (token_hash,), self.read.token)

    async def list_tokens(self) -> list[TokenInfo]:
        return await self._all("list_tokens", (), self.read.token)

    async def count_active_tokens(self, role: str) -> int:
        return int(await self._value("count_active_tokens", (role,)))

    async def console_session(self, id_hash: str, now: datetime) -> TokenInfo | None:
        return await self._one("console_session", (id_hash, now), self.read.token)


def _count(row: Any) -> tuple[str, str, int]:
    """A ``count_by_status`` row: status, channel, count."""
    return (row[0], row[1], row[2])
