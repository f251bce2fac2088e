"""An idle worker hears of an intent enqueued in its own process at once, even when the enqueue
lands while it is still looking at the store before going to sleep."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

from outbox import DestinationSpec, Outbox, Settings, Status
from sender import Worker

from ..receiver import Receiver, Reply
from .conftest import SECRET


async def test_an_enqueue_during_the_workers_look_at_the_store_wakes_it(tmp_path: Path, receiver: Receiver):
    receiver.script("/hook", lambda request: Reply(200))
    settings = Settings(authority="allow-all", poll_seconds=10)
    async with await Outbox.open(f"sqlite:///{tmp_path / 'o.db'}", settings=settings) as box:
        await box.put_destination("hook", DestinationSpec(url=f"{receiver.url}/hook", secret=SECRET,
                                                          allow_private_network=True))
        next_due_at = box.store.next_due_at
        looked = asyncio.Event()

        async def enqueue_meanwhile(*args: Any, **kwargs: Any) -> datetime | None:
            found = await next_due_at(*args, **kwargs)  # nothing is due: the worker will sleep a poll
            if not looked.is_set():
                await box.enqueue(destination="hook", scope="acme", action_id="late", payload={})
                looked.set()
            return found

        box.store.next_due_at = enqueue_meanwhile  # type: ignore[method-assign]
        worker = Worker(box)
        running = asyncio.create_task(worker.run())
        try:
            async with asyncio.timeout(5):  # well under the 10 s poll
                await looked.wait()
                while (await box.get("late", scope="acme")).status is not Status.DELIVERED:
                    await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await running
