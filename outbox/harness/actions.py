"""A tool call as an outbox intent: the action id it is known by, its payload and its scope.

The action id is derived from the conversation and the tool call id alone, so the call keeps it
through a crash, a restart from stored history and any number of resumes: enqueueing it again
finds the same intent instead of making a second one. The payload is the call's arguments as
the model sent them, so the digest an approval binds to is the digest of what was shown.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..digest import payload_digest

#: The key under which a deferred call's metadata carries its intent's identities.
METADATA_KEY = "outbox"
#: How derived action ids begin, so an operator can tell a tool call's intent in a listing.
PREFIX = "call-"


def action_id(conversation_id: str, tool_call_id: str) -> str:
    """The stable action id of one tool call of one conversation. Each part is length-prefixed,
    so ``("a", "bc")`` and ``("ab", "c")`` never meet."""
    parts = b"".join(len(p.encode()).to_bytes(4, "big") + p.encode() for p in (conversation_id, tool_call_id))
    return PREFIX + hashlib.sha256(parts).hexdigest()[:40]


@dataclass(frozen=True)
class Action:
    """One effect a tool call asks for: to ``destination``, on ``scope``'s authority, carrying the
    call's ``arguments`` as the payload."""

    conversation_id: str
    tool_call_id: str
    tool_name: str
    destination: str
    scope: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    @property
    def action_id(self) -> str:
        return action_id(self.conversation_id, self.tool_call_id)

    @property
    def payload_digest(self) -> str:
        """What the outbox records for this payload, and what an approval of it names."""
        return payload_digest(dict(self.arguments))

    def metadata(self) -> dict[str, Any]:
        """The identities a deferred call carries, under METADATA_KEY, to be matched later."""
        return {METADATA_KEY: {"action_id": self.action_id, "scope": self.scope, "destination": self.destination,
                               "conversation_id": self.conversation_id, "payload_digest": self.payload_digest}}
