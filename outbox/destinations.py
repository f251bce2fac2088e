"""The destination registry's record: where a channel delivers, and what the receiver declares.

Producers name a destination by id, never a raw URL, so the registry is the one place that
decides where effects may go and holds the secrets to sign them.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationInfo, field_validator

from . import hosts
from .clock import iso
from .model import Channel, OnUnknown

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh Standard Webhooks signing secret (``whsec_`` + 32 random bytes, base64)."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


@dataclass(frozen=True, slots=True)
class Destination:
    """A registered destination. ``secrets`` is never serialized by the API or logged."""

    id: str
    channel: Channel
    url: str
    secrets: tuple[str, ...]
    idempotent: bool
    retention_seconds: int
    on_unknown: OnUnknown
    timeout_seconds: float
    requires_approval: bool
    allow_private_network: bool
    disabled: bool
    created_at: datetime
    updated_at: datetime
    reconcile: bool = False

    def public(self) -> dict[str, Any]:
        """The destination as the API shows it: everything but the secrets."""
        return {
            "id": self.id,
            "channel": self.channel.value,
            "url": self.url,
            "signing_secrets": len(self.secrets),
            "idempotent": self.idempotent,
            "retention_seconds": self.retention_seconds,
            "on_unknown": self.on_unknown.value,
            "timeout_seconds": self.timeout_seconds,
            "requires_approval": self.requires_approval,
            "allow_private_network": self.allow_private_network,
            "disabled": self.disabled,
            "reconcile": self.reconcile,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
        }

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"Destination(id={self.id!r}, channel={self.channel.value!r}, url={self.url!r})"


class DestinationSpec(BaseModel):
    """What an admin sends to register or replace a destination."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["webhook"] = "webhook"
    url: str = Field(max_length=2048, description="http(s) URL the webhook is POSTed to")
    secret: str | None = Field(
        default=None,
        description="whsec_ signing secret; write-only. Omitted on update: the current one stays.",
    )
    drop_previous_secrets: StrictBool = Field(
        default=False,
        description="keep only the newest secret: the end of a rotation, once the receiver has the new one",
    )
    idempotent: StrictBool = Field(
        default=False, description="the receiver deduplicates on Idempotency-Key"
    )
    retention_seconds: int = Field(
        default=86_400, ge=60, le=90 * 86_400, description="how long the receiver keeps keys"
    )
    on_unknown: OnUnknown = OnUnknown.DECLARED
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    requires_approval: StrictBool = False
    allow_private_network: StrictBool = Field(
        default=False, validate_default=True, description="allow loopback and private addresses (off: SSRF guard)"
    )
    disabled: StrictBool = False
    reconcile: StrictBool = Field(
        default=False,
        description="the receiver answers the reconcile probe (the receivers' idempotency middleware)",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url!r} must be an absolute http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("url must not carry credentials; put them in the secret")
        hosts.url_host(url)  # a HostRefused (ValueError) says what is wrong with the host
        return url

    @field_validator("allow_private_network")
    @classmethod
    def _public_unless_allowed(cls, allowed: bool, info: ValidationInfo) -> bool:
        # Here, after url, so a literal address the sender would refuse is refused now; a name is
        # judged by what it resolves to when the request is made.
        url: str | None = info.data.get("url")  # absent when the url itself was refused
        if allowed or url is None:
            return allowed
        address = hosts.ip_literal(hosts.url_host(url))
        if address is not None and not hosts.is_public(str(address)):
            raise ValueError(f"the url's host {urlsplit(url).hostname} is not a public address (loopback, private, "
                             "link-local or reserved): set allow_private_network (--allow-private-network) to send "
                             "there")
        return allowed

    @field_validator("secret")
    @classmethod
    def _whsec(cls, secret: str | None) -> str | None:
        if secret is None:
            return None
        if not secret.startswith(SECRET_PREFIX):
            raise ValueError(f"secret must start with {SECRET_PREFIX!r}")
        try:
            raw = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
        except ValueError:
            raise ValueError("secret must be whsec_ followed by base64") from None
        if not 24 <= len(raw) <= 64:
            raise ValueError("secret must hold 24 to 64 bytes")
        return secret
