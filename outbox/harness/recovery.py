"""The run's recovery policy for tool calls a crash left without a recorded result.

A call that went through the outbox is answered from its record: exact, never guessed. The
policy decides only for calls nothing recorded, as in the harness design this follows:

- ``declared`` (default): run again only the calls of tools declared retry-safe; every other
  call is answered "unknown" (it may or may not have happened), and the model decides knowing it;
- ``never``: every such call is answered "unknown";
- ``always``: every such call is run again (whoever chose it accepts a duplicate effect).

Effect tools are retry-safe by construction: running one again enqueues the same action id,
which the outbox answers with the intent it already has, never a second one.
"""

from __future__ import annotations

import enum


class Recovery(str, enum.Enum):
    """What to do with a call a crash left unanswered and nothing recorded."""

    DECLARED = "declared"  # run again only tools declared retry-safe; the rest are told "unknown"
    NEVER = "never"  # tell the model "unknown" for every one
    ALWAYS = "always"  # run every one again


def runs_again(policy: Recovery, *, retry_safe: bool) -> bool:
    """Whether an unanswered, unrecorded call is run again under ``policy``."""
    return policy is Recovery.ALWAYS or (policy is Recovery.DECLARED and retry_safe)
