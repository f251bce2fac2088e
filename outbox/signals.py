"""In-process wake-ups: a worker hears of new intents, and a long poll of settled ones, at once.

Other processes are not told; they find changes by polling at a bounded interval.
"""

from __future__ import annotations

import asyncio


class Signal:
    """A broadcast: every waiter wakes on the next ``notify``."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake every waiter and every ticket taken so far (the next ticket is a fresh one: made
        when asked for, not at every notify, which a worker makes once per delivery)."""
        self._event.set()

    def ticket(self) -> asyncio.Event:
        """Hand this to ``wait`` to hear any notify from now on, including one that comes before
        the wait starts (a waiter that looks at the store first would otherwise miss it)."""
        if self._event.is_set():
            self._event = asyncio.Event()
        return self._event

    async def wait(self, timeout: float, since: asyncio.Event | None = None) -> bool:
        """Wait for the next notify (or the first since ``since`` was taken), at most ``timeout``
        seconds; True if it came."""
        try:
            await asyncio.wait_for((since or self.ticket()).wait(), timeout)
        except TimeoutError:
            return False
        return True
