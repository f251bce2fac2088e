"""Crash points, for the fault tests only: the worker kills itself with SIGKILL at a named step.

A test sets ``crash_at`` (``OUTBOX_CRASH_AT``) to check that a worker dying at that step, with
no cleanup at all, loses nothing and misreports nothing once another worker recovers. Unset (the
default), each point is one comparison against None and changes nothing.
"""

from __future__ import annotations

import os
import signal
from typing import Literal

#: The steps a worker can be made to die at.
CrashPoint = Literal[
    "after_claim",  # the claim committed
    "after_attempt_start",  # the attempt's start committed
    "after_request",  # the request written (its last byte handed to the socket or producer), no answer read
    "after_answer",  # the channel's send returned with its answer, the outcome not yet handed to the store
    "before_outcome",  # the outcome decided and handed to the store, not yet written
    "mid_group_commit",  # an outcome written inside its transaction, before COMMIT
]

#: The point this process dies at, or None (set once, when a worker starts).
armed: str | None = None


def arm(point: str | None) -> None:
    """Die at ``point`` from now on (None or "": never)."""
    global armed
    armed = point or None


def crash_point(name: CrashPoint) -> None:
    """SIGKILL this process if it was armed at ``name``: a real crash, no cleanup."""
    if armed == name:
        os.kill(os.getpid(), signal.SIGKILL)
