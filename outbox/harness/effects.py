"""The harness's side of an effect, framework-free: submit a tool call as an intent, learn its
outcome, approve or refuse it, and answer it after a crash. A framework adapter turns the
answers (``answers.Answer``) into its own tool results; this module knows none of them.
"""

from __future__ import annotations

from ..client import Intent
from ..errors import IntentConflict
from .actions import Action
from .answers import Answer, ApprovalNeeded, Pending, answer, unrecorded
from .backends import Backend
from .recovery import Recovery, runs_again


class ArgumentsChanged(IntentConflict):
    """The call's arguments are not those the outbox recorded (or an approval was asked for):
    its digest differs, so it is not the same operation, and nothing is approved or answered."""


class Effects:
    """Tool calls as intents in ``backend``. A submitted call waits up to ``wait_seconds`` for
    its outcome before it is deferred (0: defer at once unless already settled)."""

    def __init__(self, backend: Backend, *, wait_seconds: float = 0.0) -> None:
        self.backend = backend
        self.wait_seconds = wait_seconds

    async def submit(self, action: Action) -> Answer:
        """Enqueue the call (the same intent however often it is submitted) and answer it."""
        intent = await self.backend.enqueue(action)
        if intent.status == "held" or (intent.status == "pending" and self.wait_seconds <= 0):
            return answer(intent)
        return answer(await self.backend.wait(action.action_id, action.scope, self.wait_seconds))

    async def outcome(self, action_id: str, scope: str, *, wait: float = 0.0) -> Answer:
        """The answer for an intent already submitted, after waiting up to ``wait`` seconds."""
        return answer(await self.backend.wait(action_id, scope, wait))

    async def approve(self, approval: ApprovalNeeded, action: Action, *, reason: str) -> Intent:
        """Approve the held intent for exactly the payload the approval was asked for. Raises
        ArgumentsChanged, and approves nothing, when ``action``'s arguments are not that payload;
        the outbox refuses too when its intent carries another digest."""
        if action.payload_digest != approval.payload_digest or action.action_id != approval.action_id:
            raise ArgumentsChanged(
                f"the approval was asked for payload {approval.payload_digest} of {approval.action_id}, but the call "
                f"now carries {action.payload_digest}: nothing was approved; ask for approval again")
        return await self.backend.approve(approval.action_id, approval.scope, approval.payload_digest, reason)

    async def reject(self, approval: ApprovalNeeded, *, reason: str) -> Intent:
        """Refuse the held intent: the outbox cancels it and never sends it."""
        return await self.backend.reject(approval.action_id, approval.scope, reason)

    async def recovered(self, action: Action, policy: Recovery) -> Answer | None:
        """The answer for a call a crash left unanswered: from the outbox's record when it has one
        that is settled; None when the call is to run again (the record is still on its way, or
        there is none and ``policy`` runs effect tools again); else "unknown". Raises
        ArgumentsChanged when the record holds other arguments than the stored call."""
        intent = await self.backend.find(action.action_id, action.scope)
        if intent is None:
            return None if runs_again(policy, retry_safe=True) else unrecorded()
        if intent.payload_digest != action.payload_digest:
            raise ArgumentsChanged(f"{action.action_id} was recorded with payload {intent.payload_digest}, but the "
                                   f"stored call carries {action.payload_digest}")
        found = answer(intent)
        return None if isinstance(found, Pending | ApprovalNeeded) else found
