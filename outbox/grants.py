"""Built-in authority grants: which scope may reach which destination, until when.

The outbox row grants nothing by existing; the sender asks for a live grant right before each
send, and a deleted or expired grant turns the next send into a ``revoked`` intent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from .fields import GrantTarget, Scope
from .timestamps import Timestamp


@dataclass(frozen=True, slots=True)
class Grant:
    """Scope ``scope`` may have effects made at ``destination`` ('*': any) until ``expires_at``."""

    id: str
    scope: str
    destination: str
    revision: int
    expires_at: datetime | None
    note: str | None
    created_at: datetime
    updated_at: datetime



class GrantSpec(BaseModel):
    """What an admin sends to create or replace a grant."""

    model_config = ConfigDict(extra="forbid")

    scope: Scope = Field(description="the scope allowed")
    destination: GrantTarget = Field(description="a destination id, or '*' for every destination")
    expires_at: Timestamp | None = Field(default=None, description="no sends after this")
    note: str | None = Field(default=None, max_length=500, description="why it was granted")
