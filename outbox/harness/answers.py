"""What the model is told about an effect, from the outbox's record of it.

Each settled status maps to one answer, and nothing is inferred beyond the record: ``delivered``
is a result with the receiver's id for the work; ``unknown`` is a result (not an error) that
says the effect may or may not have happened and must not be sent again, with the attempts as
the evidence; ``dead``, ``revoked`` and ``cancelled`` are failures that do not invite a retry;
``held`` asks for an approval of the exact payload digest; anything else is still on its way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..client import Intent

#: What an ``unknown`` result says, word for word: the model must neither assume the effect nor resend it.
UNKNOWN = ("This action may or may not have happened: it was sent, and no answer says whether it took effect. "
           "Do not resend it. Tell the user it is unconfirmed; an operator can find out and settle it.")
#: What a call the harness lost track of says (it stopped while the call ran, and no record exists).
UNRECORDED = ("This call may or may not have happened: the process running it stopped before its result "
              "was recorded. Do not call it again to find out.")


@dataclass(frozen=True)
class Returned:
    """A result the model reads as the call's return value."""

    value: Mapping[str, Any]


@dataclass(frozen=True)
class Failed:
    """A failure the model reads: the call is over and did not take effect; not a retry invitation."""

    message: str


@dataclass(frozen=True)
class ApprovalNeeded:
    """The intent waits for a person's approval of this exact payload digest."""

    action_id: str
    scope: str
    payload_digest: str


@dataclass(frozen=True)
class Pending:
    """Not settled yet: the call stays deferred."""

    action_id: str
    status: str


Answer = Returned | Failed | ApprovalNeeded | Pending


def evidence(intent: Intent) -> list[dict[str, Any]]:
    """Each attempt's facts, as recorded: what was submitted, what came back, what went wrong."""
    return [{key: attempt.get(key) for key in ("number", "submission", "outcome", "status_code", "error")}
            for attempt in intent.attempts]


def external_id(intent: Intent) -> str | None:
    """What the receiver said identifies the work: the latest attempt that recorded one."""
    return next((a["external_id"] for a in reversed(intent.attempts) if a.get("external_id")), None)


def answer(intent: Intent) -> Answer:
    """The model's answer for an intent as the outbox records it now (with its attempts)."""
    status = intent.status
    attempts = intent.data.get("attempt_count", len(intent.attempts))
    why = intent.data.get("last_error") or ""
    if status == "delivered":
        return Returned({"status": "delivered", "action_id": intent.action_id, "external_id": external_id(intent),
                         "attempts": attempts})
    if status == "unknown":
        return Returned({"status": "unknown", "action_id": intent.action_id, "message": UNKNOWN,
                         "attempts": attempts, "evidence": evidence(intent)})
    if status == "dead":
        return Failed(f"Not done, and it will not be: the outbox gave up on {intent.action_id} after {attempts} "
                      f"attempt(s) ({why or 'no reason recorded'}). Sending it again will not help; tell the user.")
    if status == "revoked":
        return Failed(f"Not done: authority to do this was withdrawn before it was sent ({why or 'no grant'}). "
                      "Nothing was sent. Do not try again unless the user restores the authority.")
    if status == "cancelled":
        return Failed(f"Not done: {intent.action_id} was cancelled before it was sent. Nothing was sent.")
    if status == "held":
        return ApprovalNeeded(intent.action_id, intent.scope, intent.payload_digest)
    return Pending(intent.action_id, status)


def unrecorded() -> Returned:
    """The answer for a call with no recorded result that the recovery policy will not run again."""
    return Returned({"status": "unknown", "message": UNRECORDED})
