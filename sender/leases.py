"""The leases a worker holds: what it knows of each (the heartbeat, ``sender.heartbeat``,
keeps them confirmed)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from outbox import Attempt, Destination, Intent

from .authority import Decision


class Unread:
    """A destination not read yet (the cache had none fresh enough)."""


UNREAD = Unread()


@dataclass(eq=False, slots=True)
class Lease:
    """An intent this worker holds, from its claim until its last change is applied."""

    intent: Intent
    confirmed: datetime  # until when the store last confirmed the lease (claim or renewal)
    picked: bool = False  # taken to be sent, its lease found confirmed then
    destination: Destination | Unread | None = UNREAD  # read for its checks by a fetch
    decision: Decision | None = None  # the authority's answer a fetch got, used once
    not_before: float = 0.0  # (monotonic) its checks wait until then: the store failed a read
    final: bool = False  # its last change is buffered, or it was let go


def log_fields(intent: Intent, attempt: Attempt | None, worker: str) -> dict[str, object]:
    """The identities a log record about ``intent`` carries (see outbox.logs)."""
    return {"action_id": intent.action_id, "attempt_id": attempt.attempt_id if attempt else None,
            "fence": intent.fence, "worker": worker, "destination": intent.destination}
