"""The heartbeat that keeps a worker's leases.

A lease is confirmed by the store (its claim, then each renewal) until some time; a send starts
only on a lease confirmed a third of its length ahead, so a worker whose renewals fail sends
nothing and writes nothing, and the sweeper gives the intent back once the lease runs out.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from outbox import StoreUnavailable
from outbox.clock import Clock
from outbox.ids import KEY_SEPARATOR
from outbox.store.protocol import Delivery
from outbox.timestamps import later

from .leases import Lease, Leases, log_fields

log = logging.getLogger("outbox.sender")


class Heartbeat:
    """Renews the leases held every third of their length, and says whether one is confirmed
    far enough ahead to start a send on it."""

    def __init__(self, store: Delivery, clock: Clock, length: timedelta, worker: str, leases: Leases) -> None:
        self.store = store
        self.clock = clock
        self.length = length
        self.worker = worker
        self.leases = leases  # the worker's: renewed here, not changed

    def confirmed(self, lease: Lease, now: datetime) -> bool:
        """Whether the store confirmed this lease far enough ahead to start a send on it (a
        third of the lease). If not (renewals are failing), nothing is sent or written: the
        lease runs out and a sweeper gives the intent back, its attempt never started."""
        if lease.confirmed - now >= self.length / 3:
            return True
        log.warning("not sending: the lease is not confirmed (the database is not answering renewals); "
                    "it will be recovered when it expires", extra=log_fields(lease.intent, None, self.worker))
        return False

    async def run(self) -> None:
        """Renew until cancelled; a failed renewal is tried again at the next beat."""
        interval = self.length.total_seconds() / 3
        while True:
            await asyncio.sleep(interval)
            held = self.leases.renewable()
            if held:
                until = later(self.clock.now(), self.length.total_seconds())
                try:
                    lost = await self.store.renew_leases(held, until)
                except Exception as exc:  # the next beat tries again; sends wait for a confirmed lease
                    log.error("renewing %d leases failed (%s); trying again in %.1fs; no send starts on a lease "
                              "that is not confirmed", len(held), exc, interval,
                              exc_info=not isinstance(exc, StoreUnavailable))
                    continue
                gone = set(lost)  # (a lost lease is not confirmed: no send may start on it)
                self.leases.renewed([renewal for renewal in held if renewal[0] not in gone], until)
                fences = dict(held)
                for key in lost:
                    if not self.leases.holds(key, fences[key]):
                        continue  # it finished while we renewed
                    log.warning("lease lost; this worker's writes for it will be rejected",
                                extra={"action_id": key.rpartition(KEY_SEPARATOR)[2], "fence": fences[key],
                                       "worker": self.worker})
