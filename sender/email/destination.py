"""An email destination: the SMTP server its messages are handed to, how it is reached, and
who sends them."""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from outbox import DestinationSpec, OnUnknown

from .. import hosts
from .address import Mailbox, mailbox, written
from .headers import check_headers


class EmailSpec(DestinationSpec):
    """An email destination: the SMTP server its messages are handed to, and who sends them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    channel: Literal["email"]
    host: str = Field(max_length=253, description="the SMTP server (a relay or the recipients' MX)")
    port: StrictInt = Field(default=587, ge=1, le=65535)
    tls: Literal["starttls", "implicit", "none"] = Field(
        default="starttls", description="starttls (required, not opportunistic), implicit (port 465) or none")
    allow_insecure: StrictBool = Field(default=False, description="allow tls: none (the message and any password "
                                                                     "cross the network in the clear)")
    username: str | None = Field(default=None, max_length=256, description="AUTH user; the secret is its password")
    from_: Mailbox = Field(alias="from", description="the sender: a@example.com or Name <a@example.com>; its domain "
                                                 "names the Message-ID")
    reply_to: Mailbox | None = None
    headers: dict[str, str] = Field(default_factory=dict, description="added to every message")
    data_timeout_seconds: StrictFloat = Field(
        default=600.0, gt=0, le=3600, description="how long the reply to the end of a message may take (RFC 5321 "
                                                  "allows 10 minutes: servers scan before they queue); other "
                                                  "replies wait timeout_seconds")
    connections: StrictInt = Field(default=4, ge=1, le=256, description="connections to the server at most at once; "
                                                                  "each is reused for the next message")
    on_unknown: OnUnknown = Field(default=OnUnknown.NEVER, description="mail servers do not deduplicate: an "
                                                                       "unknown outcome waits for an operator")

    @cached_property
    def envelope_sender(self) -> str:
        """The address MAIL FROM names (read once per destination, not per message)."""
        return mailbox(self.from_)[1]

    @cached_property
    def from_header(self) -> str:
        """The From header as written."""
        return written(self.from_)

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        return hosts.check_host(host)

    @field_validator("headers")
    @classmethod
    def _default_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return check_headers(headers)

    @field_validator("secret")
    @classmethod
    def _password(cls, secret: str | None) -> str | None:
        if secret is not None and not 1 <= len(secret) <= 1024:
            raise ValueError("the secret (the AUTH password) must hold 1 to 1024 characters")
        return secret

    @model_validator(mode="after")
    def _consistent(self) -> EmailSpec:
        if self.tls == "none" and not self.allow_insecure:
            raise ValueError("tls: none sends in the clear; set allow_insecure to allow it")
        if self.reconcile:
            raise ValueError("an SMTP server cannot answer the reconcile probe; leave reconcile off")
        address = hosts.ip_literal(self.host)
        if address is not None and not hosts.is_public(str(address)) and not self.allow_private_network:
            raise ValueError(f"host {self.host} is not a public address (loopback, private, link-local or "
                             "reserved): set allow_private_network to send there")
        return self
