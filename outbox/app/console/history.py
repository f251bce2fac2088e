"""Where each of an intent's attempts went, as its console page shows it under its attempts
(``templates/history.html`` draws the attempts, their errors and replies, and the timeline)."""

from __future__ import annotations

from dataclasses import dataclass

from ... import channels
from ...destinations import Destination
from ...model import Attempt, Event, EventKind


@dataclass(frozen=True)
class Went:
    """Where an attempt went: the target its ``attempt_started`` event recorded, or for an attempt
    started before attempts recorded it the destination's target as registered now (``recorded``
    false), and whether the destination changed since; no target when neither is known."""

    target: str | None
    recorded: bool
    changed: bool = False


def attempts(found: list[Attempt], events: list[Event], destination: Destination | None) -> list[tuple[Attempt, Went]]:
    """Each attempt, with where it went."""
    recorded = {e.data.get("attempt_id"): str(e.data["target"]) for e in events
                if e.kind is EventKind.ATTEMPT_STARTED and "target" in e.data}

    def went(a: Attempt) -> Went:
        if a.attempt_id in recorded:
            return Went(recorded[a.attempt_id], recorded=True)
        if destination is None:
            return Went(None, recorded=False)
        return Went(channels.target(destination), recorded=False, changed=destination.updated_at > a.started_at)

    return [(a, went(a)) for a in found]
