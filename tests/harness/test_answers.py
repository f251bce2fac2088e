"""The framework-free core, alone: the stable action id, each outcome's answer, the policy."""

from __future__ import annotations

from typing import Any

import pytest

from outbox.client import Intent
from outbox.digest import payload_digest
from outbox.harness import (
    UNKNOWN,
    Action,
    ApprovalNeeded,
    Failed,
    Pending,
    Recovery,
    Returned,
    action_id,
    answer,
    runs_again,
)
from outbox.ids import ACTION_ID


def intent(status: str, *attempts: dict[str, Any], last_error: str | None = None) -> Intent:
    return Intent.of({"action_id": "call-1", "scope": "acme", "destination": "billing", "status": status,
                      "payload": {"n": 1}, "payload_digest": payload_digest({"n": 1}),
                      "attempt_count": len(attempts), "last_error": last_error, "attempts": list(attempts)})


def test_the_action_id_comes_from_the_conversation_and_the_tool_call_alone():
    first = action_id("conv-1", "call-a")
    assert first == action_id("conv-1", "call-a")  # after a crash, a restart, a resume
    assert ACTION_ID.fullmatch(first)
    assert len({first, action_id("conv-2", "call-a"), action_id("conv-1", "call-b")}) == 3
    assert action_id("a", "bc") != action_id("ab", "c")  # the parts are length-prefixed
    call = Action("conv-1", "call-a", "send", "billing", "acme", {"invoice": 42})
    assert call.action_id == first
    assert call.payload_digest == payload_digest({"invoice": 42})
    assert call.metadata()["outbox"]["payload_digest"] == call.payload_digest


def test_delivered_is_a_result_with_the_external_id_and_the_attempts():
    found = answer(intent("delivered", {"number": 1, "outcome": "retryable", "external_id": None},
                          {"number": 2, "outcome": "delivered", "external_id": "inv-7"}))
    assert found == Returned({"status": "delivered", "action_id": "call-1", "external_id": "inv-7", "attempts": 2})


def test_unknown_is_a_result_that_says_do_not_resend_with_the_evidence():
    attempt = {"number": 1, "submission": "maybe_submitted", "outcome": "unknown", "status_code": None,
               "error": "read timeout after 0.5 s"}
    found = answer(intent("unknown", attempt))
    assert isinstance(found, Returned)
    assert found.value["status"] == "unknown"
    assert found.value["message"] == UNKNOWN
    assert "may or may not have happened" in UNKNOWN and "Do not resend" in UNKNOWN
    assert found.value["evidence"] == [attempt]


def test_dead_revoked_and_cancelled_are_failures_that_invite_no_retry():
    dead = answer(intent("dead", {"number": 1}, last_error="rejected: receiver answered 400"))
    revoked = answer(intent("revoked", last_error="no live grant"))
    cancelled = answer(intent("cancelled"))
    assert isinstance(dead, Failed) and "will not help" in dead.message and "answered 400" in dead.message
    assert isinstance(revoked, Failed) and "authority" in revoked.message and "Nothing was sent" in revoked.message
    assert isinstance(cancelled, Failed) and "Nothing was sent" in cancelled.message


def test_held_asks_for_an_approval_of_the_digest_and_the_rest_is_pending():
    assert answer(intent("held")) == ApprovalNeeded("call-1", "acme", payload_digest({"n": 1}))
    for status in ("pending", "leased"):
        assert answer(intent(status)) == Pending("call-1", status)


@pytest.mark.parametrize(("policy", "safe", "unsafe"), [
    (Recovery.DECLARED, True, False), (Recovery.NEVER, False, False), (Recovery.ALWAYS, True, True)])
def test_the_policy_runs_again_only_what_it_says(policy: Recovery, safe: bool, unsafe: bool):
    assert runs_again(policy, retry_safe=True) is safe
    assert runs_again(policy, retry_safe=False) is unsafe
