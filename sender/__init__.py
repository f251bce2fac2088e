"""The delivery worker: leases due intents, re-checks authority, sends, records outcomes."""

from .authority import (
    AllowAllAuthority,
    Authority,
    AuthorityRequest,
    CachedAuthority,
    CallableAuthority,
    Decision,
    GrantsAuthority,
    HttpPolicyAuthority,
    Verdict,
    authority_from_setting,
)
from .backoff import Backoff
from .channel import Channel, ChannelModule, SendResult
from .decision import Fate, Policy, decide
from .webhook import WebhookChannel, WebhookSpec
from .worker import Worker

__all__ = [
    "AllowAllAuthority",
    "Authority",
    "AuthorityRequest",
    "Backoff",
    "CachedAuthority",
    "CallableAuthority",
    "Channel",
    "ChannelModule",
    "Decision",
    "Fate",
    "GrantsAuthority",
    "HttpPolicyAuthority",
    "Policy",
    "SendResult",
    "Verdict",
    "WebhookChannel",
    "WebhookSpec",
    "Worker",
    "authority_from_setting",
    "decide",
]
