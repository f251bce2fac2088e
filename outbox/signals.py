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
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """Wait for the next notify, at most ``timeout`` seconds; True if it came."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        return True
