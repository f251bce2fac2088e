"""The PostgreSQL claim's second asks for places a concurrent lease took (``changes.reclaimed``):
bounded, and a failure among them kept visible, with what was claimed before it kept."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from outbox.store.postgres import changes
from outbox.store.protocol import Claim


class Refusing:
    """A connection whose every claim statement comes back with each place refused again, or
    fails (``failing``) after ``answered`` answers."""

    def __init__(self, failing: int | None = None) -> None:
        self.statements = 0
        self.failing = failing

    @contextlib.asynccontextmanager
    async def transaction(self) -> Iterator[None]:  # type: ignore[misc]
        yield None

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        self.statements += 1
        if self.failing is not None and self.statements > self.failing:
            raise asyncpg.exceptions.UniqueViolationError("duplicate key value violates unique constraint")
        return [{"seq": None, "refused": 3}]


async def test_a_claim_asks_again_at_most_reclaims_times_however_often_its_places_are_taken() -> None:
    conn = Refusing()
    now = datetime.now(UTC)
    assert await changes.reclaimed(conn, Claim("w1", now, now, 3)) == []  # type: ignore[arg-type]
    assert conn.statements == changes.RECLAIMS


async def test_a_failed_second_ask_is_logged_as_a_warning_and_ends_the_asking(caplog: pytest.LogCaptureFixture) -> None:
    conn = Refusing(failing=2)
    now = datetime.now(UTC)
    with caplog.at_level(logging.INFO, logger="outbox.store"):
        assert await changes.reclaimed(conn, Claim("w1", now, now, 3)) == []  # type: ignore[arg-type]
    assert conn.statements == 3
    [logged] = caplog.records
    assert logged.levelno == logging.WARNING and "UniqueViolationError" in logged.getMessage()
