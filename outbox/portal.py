"""The tenant portal's way in: a short-lived, single-use link an admin or a producer of the scope
mints for one of its users, which opens a portal session acting as that scope's tenant.

The link's token and the session's id are random and shown once (the link's URL, the session's
cookie); the store keeps their SHA-256 only (``tokens.hash_token``). Opening a link is one atomic
statement of the store, so of two concurrent openings one session starts and the other is
refused. A session lasts what its link said, bounded by ``portal_session_seconds``, and ends at
once when the token that minted the link is revoked.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class PortalLink:
    """A link as stored: its token's hash, the token that minted it, the scope it opens, what
    its session may do and how long it lasts, and until when it opens."""

    link_hash: str
    token_id: str
    scope: str
    read_only: bool
    session_seconds: int
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class PortalSession:
    """An open portal session: the one scope it acts in, whether it may change anything, and its end."""

    scope: str
    read_only: bool
    expires_at: datetime


#: Where a link opens (``outbox.app.portal``), its token as the query's ``link``.
OPEN_PATH = "/portal/open"


def link_path(link_token: str) -> str:
    """The portal's address that opens the link with this token, relative to the service."""
    return f"{OPEN_PATH}?link={link_token}"


def new_link_token() -> str:
    """A fresh link token (256 random bits), stored only hashed."""
    return secrets.token_urlsafe(32)
