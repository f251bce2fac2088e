"""Bulk replays started from the console: each runs ``operations.bulk_replay`` in the background
while its page shows how far it got. Progress lives in this process only; a replay interrupted
by a restart is simply started again (what was replayed no longer matches)."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from datetime import datetime

from ... import operations
from ...errors import OutboxError
from ...model import Intent
from ...outbox import Outbox
from ...store import IntentQuery

#: Finished replays kept for their pages, newest last.
KEEP = 50


@dataclass
class Job:
    """One bulk replay: what it matched when it started, and how far it got."""

    actor: operations.Actor
    started_at: datetime
    total: int
    done: int = 0
    replayed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    finished: bool = False
    error: str | None = None  # why it stopped before the end
    task: asyncio.Task[None] | None = None

    def step(self, _: Intent) -> None:
        self.done += 1


class Replays:
    """The bulk replays this console started, by id."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    async def start(self, box: Outbox, query: IntentQuery, actor: operations.Actor, *,
                    authorize: operations.Authorize | None, accept_duplicate_risk: bool) -> str:
        """Start replaying what ``query`` matches; returns the job's id. Raises OutboxError when
        the filter is not one a bulk replay takes."""
        chosen = operations.replay_filter(query)
        total = len([i async for i in operations.matching(box, chosen)])
        job = Job(actor, box.clock.now(), total)

        async def run() -> None:
            try:
                result = await operations.bulk_replay(box, chosen, actor, dry_run=False, authorize=authorize,
                                                       accept_duplicate_risk=accept_duplicate_risk,
                                                       progress=job.step)
                job.replayed, job.refused = result.replayed, result.refused
            except OutboxError as exc:  # the store went away: what was replayed stays replayed
                job.error = exc.message
            finally:
                job.finished = True

        job.task = asyncio.create_task(run())
        job_id = secrets.token_urlsafe(12)
        self._jobs[job_id] = job
        for old in [k for k, j in self._jobs.items() if j.finished][:-KEEP]:
            del self._jobs[old]
        return job_id
