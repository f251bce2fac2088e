"""Per-destination circuit breakers: a receiver that stops answering is paused.

Without them, a receiver that is down holds the send slots. Suppose every connect to it times
out after 10 s and it has a backlog of thousands. Each of its intents then holds a slot for the
whole timeout, and every other destination's intents wait behind them. Once ``threshold`` sends
in a row get no answer (refused, timed out, reset), its intents are given back unsent, due after
a pause, and the slots go to the others. When the pause ends, one send probes the receiver. If
it answers, sending resumes; if not, the next pause is twice as long, up to ``max_pause``.
A destination given new settings (a webhook's new URL) starts afresh. Whether a send got an
answer at all is the channel's to say (``SendResult.answered``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox import Destination, Outcome
from outbox.timestamps import later

from .channel import SendResult


@dataclass
class Circuit:
    """What one worker has seen of one destination (with these settings) lately."""

    settings: Mapping[str, Any]
    failures: int = 0  # sends in a row that got no answer
    pauses: int = 0  # pauses in a row; each is twice the one before
    until: datetime | None = None  # paused until then (None: closed)
    probe_at: datetime | None = None  # when the pause was over and one send went to find out

    def pause_seconds(self, first: float, longest: float) -> float:
        # (the doublings capped: after a thousand pauses in a row 2 ** pauses is too large for a float)
        return min(longest, first * 2 ** min(max(0, self.pauses - 1), 64))


class Circuits:
    """The circuits of every destination one worker sends to."""

    def __init__(self, threshold: int, pause_seconds: float, max_pause_seconds: float = 300.0) -> None:
        self.threshold = threshold  # 0: never pause
        self.pause_seconds = pause_seconds
        self.max_pause_seconds = max_pause_seconds
        self._circuits: dict[str, Circuit] = {}

    def _circuit(self, destination: Destination) -> Circuit | None:
        circuit = self._circuits.get(destination.id)
        if circuit is not None and circuit.settings != destination.settings:  # moved: what we saw is moot
            del self._circuits[destination.id]
            return None
        return circuit

    def hold(self, destination: Destination, now: datetime) -> tuple[datetime, str] | None:
        """None if a send to the destination may go now; else when its intent should be looked
        at again (spread over the pause, so they do not all come back at once) and why."""
        circuit = self._circuit(destination)
        if circuit is None or circuit.until is None:
            return None
        pause = circuit.pause_seconds(self.pause_seconds, self.max_pause_seconds)
        probing = circuit.probe_at is not None and now < later(circuit.probe_at, pause)
        if now >= circuit.until and not probing:  # (a probe that never sent expires with a pause)
            circuit.probe_at = now  # this send finds out whether it answers again
            return None
        resume = max(circuit.until, now)
        due = later(resume, random.uniform(0, pause))
        return due, (f"destination {destination.id!r} is not answering ({circuit.failures} sends in a row "
                     f"got no answer); its sends are paused until {resume.isoformat()}")

    def paused_until(self, destination_id: str) -> datetime | None:
        """When this worker's pause of the destination ends (None: not paused), for the console."""
        circuit = self._circuits.get(destination_id)
        return None if circuit is None else circuit.until

    @property
    def paused(self) -> int:
        """How many destinations are paused or being probed now."""
        return sum(1 for circuit in self._circuits.values() if circuit.until is not None)

    def record(self, destination: Destination, result: SendResult, now: datetime) -> tuple[int, str] | None:
        """Count a send's result; returns what changed (the circuit opened or closed) as a log
        level and message, if anything did."""
        if self.threshold <= 0:
            return None
        circuit = self._circuit(destination)
        if result.answered:  # whatever it said: forget
            if circuit is None:
                return None
            del self._circuits[destination.id]
            return (logging.INFO, f"destination {destination.id!r} answers again; its sends resume"
                    ) if circuit.until is not None else None
        if result.outcome not in (Outcome.RETRYABLE, Outcome.UNKNOWN):
            return None  # refused by us (the SSRF guard), not by the receiver's silence
        if circuit is None:
            circuit = self._circuits[destination.id] = Circuit(destination.settings)
        circuit.failures += 1
        circuit.probe_at = None
        if circuit.failures < self.threshold or (circuit.until is not None and now < circuit.until):
            return None
        circuit.pauses += 1
        pause = circuit.pause_seconds(self.pause_seconds, self.max_pause_seconds)
        circuit.until = later(now, pause)
        return logging.WARNING, (f"destination {destination.id!r} stopped answering ({circuit.failures} sends "
                                 f"in a row got no answer: {result.error}); its sends are paused for {pause:.0f}s")
