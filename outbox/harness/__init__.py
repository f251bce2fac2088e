"""Agent tool calls as outbox intents, and their outcomes as the tool results a model reads.

The core here is framework-free: ``Action`` (a call with its stable action id), ``Effects``
(submit, learn the outcome, approve, recover), the answers it gives (``answers``) and the
recovery policy. ``outbox.harness.pydantic_ai`` adapts it to Pydantic AI (the ``pydantic-ai``
extra); nothing here imports a framework.
"""

from .actions import METADATA_KEY, Action, action_id
from .answers import UNKNOWN, UNRECORDED, Answer, ApprovalNeeded, Failed, Pending, Returned, answer
from .backends import Backend, Local, Served
from .effects import ArgumentsChanged, Effects
from .recovery import Recovery, runs_again

__all__ = [
    "METADATA_KEY",
    "UNKNOWN",
    "UNRECORDED",
    "Action",
    "Answer",
    "ApprovalNeeded",
    "ArgumentsChanged",
    "Backend",
    "Effects",
    "Failed",
    "Local",
    "Pending",
    "Recovery",
    "Returned",
    "Served",
    "action_id",
    "answer",
    "runs_again",
]
