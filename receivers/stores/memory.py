"""The in-memory record store: for tests and single-process experiments."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

from ..records import (
    ClaimRequest,
    ClaimResult,
    ProbeResult,
    Record,
    StoredResponse,
    StoreUnavailable,
    decide_claim,
    decide_complete,
    decide_probe,
    decide_release,
)


class MemoryRecordStore:
    """Records in a dict: for tests and single-process experiments (nothing survives a restart)."""

    def __init__(self) -> None:
        #: The records as decided, by identity, as they are: a read is a lookup and a write a store
        #: (packing them into plain values, which the garbage collector does not track, cost more in
        #: conversions than the collector's traversal of them costs, even with 100,000 records).
        self._records: dict[str, Record] = {}
        self._lock = asyncio.Lock()
        self.available = True  # tests turn it off to see the middleware answer 503

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _read(self, identity: str) -> Record | None:
        return self._records.get(identity)

    def _keep(self, record: Record) -> None:
        self._records[record.identity] = record

    def _check(self) -> None:
        if not self.available:
            raise StoreUnavailable("the in-memory record store is switched off")

    async def claim(self, identity: str, fingerprint: str, *, fence: int | None, now: datetime,
                    lease_until: datetime, expires_at: datetime) -> ClaimResult:
        async with self._lock:
            self._check()
            result, new = decide_claim(self._read(identity), identity, fingerprint, fence=fence,
                                       now=now, lease_until=lease_until, expires_at=expires_at)
            if new is not None:
                self._keep(new)
            return result

    async def complete(self, identity: str, epoch: int, response: StoredResponse, *,
                       expires_at: datetime) -> bool:
        async with self._lock:
            self._check()
            new = decide_complete(self._read(identity), epoch, response, expires_at)
            if new is not None:
                self._keep(new)
            return new is not None

    async def release(self, identity: str, epoch: int) -> bool:
        async with self._lock:
            self._check()
            new = decide_release(self._read(identity), epoch)
            if new is not None:
                self._keep(new)
            return new is not None

    async def claim_many(self, requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                         expires_at: datetime) -> list[ClaimResult]:
        async with self._lock:
            self._check()
            return self._claim_all(requests, now, lease_until, expires_at)

    async def complete_many(self, done: Sequence[tuple[str, int, StoredResponse]], *,
                            expires_at: datetime) -> list[bool]:
        async with self._lock:
            self._check()
            return self._complete_all(done, expires_at)

    async def complete_and_claim(self, done: Sequence[tuple[str, int, StoredResponse]],
                                 requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                                 expires_at: datetime) -> tuple[list[bool], list[ClaimResult]]:
        async with self._lock:
            self._check()
            return self._complete_all(done, expires_at), self._claim_all(requests, now, lease_until, expires_at)

    def _claim_all(self, requests: Sequence[ClaimRequest], now: datetime, lease_until: datetime,
                   expires_at: datetime) -> list[ClaimResult]:
        answers = []
        records = self._records
        for identity, fingerprint, fence in requests:
            result, new = decide_claim(records.get(identity), identity, fingerprint, fence=fence, now=now,
                                       lease_until=lease_until, expires_at=expires_at)
            if new is not None:
                records[identity] = new
            answers.append(result)
        return answers

    def _complete_all(self, done: Sequence[tuple[str, int, StoredResponse]], expires_at: datetime) -> list[bool]:
        answers = []
        records = self._records
        for identity, epoch, response in done:
            new = decide_complete(records.get(identity), epoch, response, expires_at)
            if new is not None:
                records[identity] = new
            answers.append(new is not None)
        return answers

    async def release_many(self, held: Sequence[tuple[str, int]]) -> list[bool]:
        async with self._lock:
            self._check()
            answers = []
            for identity, epoch in held:
                new = decide_release(self._read(identity), epoch)
                if new is not None:
                    self._keep(new)
                answers.append(new is not None)
            return answers

    async def probe(self, identity: str, fence: int, *, now: datetime, expires_at: datetime) -> ProbeResult:
        async with self._lock:
            self._check()
            result, new = decide_probe(self._read(identity), identity, fence, now=now,
                                       expires_at=expires_at)
            self._keep(new)
            return result

    async def get(self, identity: str) -> Record | None:
        return self._read(identity)

    async def purge(self, now: datetime) -> int:
        async with self._lock:
            gone = [k for k, record in self._records.items() if record.expires_at <= now]
            for key in gone:
                del self._records[key]
            return len(gone)
