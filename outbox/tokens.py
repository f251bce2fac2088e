"""API tokens: roles, scopes, and hashing (only a token's hash is ever stored), and the console
sessions opened with them (only a session id's hash is stored too)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from .fields import TokenLabel, TokenScope
from .model import Role

PREFIX = "obx_"


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as stored: its public id, role and scopes, never the token itself."""

    id: str
    role: Role
    scopes: tuple[str, ...]
    label: str | None
    created_at: datetime
    revoked_at: datetime | None

    @property
    def actor(self) -> str:
        """How events name whoever used this token."""
        return f"token:{self.id}"


    def may_act_in(self, scope: str) -> bool:
        """Whether this token may enqueue or read intents of ``scope``."""
        if self.role is Role.TENANT:
            return scope in self.scopes
        if self.role is not Role.PRODUCER:
            return True
        return "*" in self.scopes or scope in self.scopes


def new_token() -> tuple[str, str]:
    """A fresh ``(id, token)``; the id is public, the token is shown once."""
    token_id = secrets.token_hex(4)
    return token_id, f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"


def hash_token(token: str) -> str:
    """The stored form of a token. Tokens carry 256 random bits, so a fast hash suffices."""
    return hashlib.sha256(token.encode()).hexdigest()


#: The most console sessions one token holds at once: its next sign-in ends the oldest.
SESSIONS_PER_TOKEN = 20


def new_session_id() -> str:
    """A fresh console session id (256 random bits): the cookie's value, stored only hashed
    (``hash_token``), never an API credential."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A console sign-in as stored: the hash of its id, the token it was opened with, and when it
    ends. It is good only while unexpired and while that token is not revoked."""

    id_hash: str
    token_id: str
    created_at: datetime
    expires_at: datetime


class TokenSpec(BaseModel):
    """What an admin sends to create a token (``outbox tokens create`` over HTTP)."""

    model_config = ConfigDict(extra="forbid")

    role: Role = Field(description="producer, operator, admin or tenant")
    scopes: list[TokenScope] = Field(default_factory=list, max_length=100,
                              description="a producer's scopes ('*' for all); a tenant's one scope; none for "
                                          "operators and admins")
    label: TokenLabel | None = Field(default=None, description="what the token is for")
