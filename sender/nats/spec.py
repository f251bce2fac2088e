"""A NATS JetStream destination's settings (``NatsSpec``: the servers, the subject, how it
authenticates) and its secrets: its messages' signing secrets and, after them, its password or
token."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, field_validator, model_validator

from outbox import DestinationSpec, OnUnknown

from .. import credentials, hosts

#: The port a server written without one listens on (NATS' own default).
DEFAULT_PORT = 4222
#: A subject a message is published to: tokens of letters, digits, ``_`` and ``-`` separated by
#: ``.``; no wildcard (``*``, ``>``), and no ``$`` (``$JS.API...`` and ``$SYS`` would make the
#: message a JetStream or system request: a destination could delete or purge a stream).
SUBJECT = re.compile(r"(?!_INBOX(?:\.|$))[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
MAX_SUBJECT = 255
#: A stream's name as JetStream takes it (no ``.``, ``*``, ``>``, whitespace or path separators).
STREAM = re.compile(r"[A-Za-z0-9_-]{1,255}")
#: ``nats://host[:port]`` or ``host:port``; credentials in a URL are refused (they belong in the
#: write-only fields, not in settings that are shown).
_URL = re.compile(r"nats://(?P<rest>[^/?#@]+)")


class NatsSpec(DestinationSpec):
    """A NATS JetStream destination: the servers, the subject its messages are published to, and
    how the connection authenticates."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["nats"]
    servers: list[str] = Field(
        min_length=1, max_length=16, description="nats://host:port or host:port of the servers to connect to, "
                                                 "tried in order (the servers the cluster advertises are not used)")
    subject: str = Field(description="the subject every message of this destination is published to (no wildcards)")
    expected_stream: str | None = Field(
        default=None, description="the stream that must store the messages (Nats-Expected-Stream): another "
                                  "stream's answer is a refusal")
    tls: StrictBool = Field(default=False, description="connect with TLS, verifying the servers' certificates "
                                                       "against their names")
    auth: Literal["none", "password", "token"] = Field(
        default="none", description="password: as username with password; token: with token. Changing it, give "
                                    "the new one: the one held is kept otherwise")
    username: str | None = Field(default=None, min_length=1, max_length=256)
    password: str | None = Field(
        default=None, min_length=1, max_length=1024, exclude=True, repr=False, json_schema_extra={"writeOnly": True},
        description="write-only, kept with the destination's secrets (never shown). Omitted on update: the "
                    "current one stays")
    token: str | None = Field(
        default=None, min_length=1, max_length=1024, exclude=True, repr=False, json_schema_extra={"writeOnly": True},
        description="write-only, kept with the destination's secrets (never shown). Omitted on update: the "
                    "current one stays")
    allow_insecure: StrictBool = Field(
        default=False, description="allow a password or token without TLS (it crosses the network in the clear)")
    on_unknown: OnUnknown = Field(
        default=OnUnknown.ALWAYS, description="published again: JetStream drops a resend within the stream's "
                                              "duplicate window (Nats-Msg-Id); after it, consumers deduplicate "
                                              "(the idempotency-key header)")

    @field_validator("servers")
    @classmethod
    def _servers(cls, servers: list[str]) -> list[str]:
        found = []
        for server in servers:
            written = server
            if "://" in server:
                url = _URL.fullmatch(server)
                if url is None:
                    raise ValueError(f"server {server!r} is not nats://host:port or host:port (no credentials, "
                                     "path or query: give them as username, password or token)")
                written = url["rest"]
            host, port = hosts.check_host_port(written, default_port=DEFAULT_PORT if "://" in server else None)
            found.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        return found

    @field_validator("subject")
    @classmethod
    def _subject(cls, subject: str) -> str:
        if len(subject) > MAX_SUBJECT or not SUBJECT.fullmatch(subject):
            raise ValueError(f"subject {subject!r} is not a NATS subject to publish to (tokens of A-Z a-z 0-9 _ - "
                             f"separated by '.', at most {MAX_SUBJECT} characters, no wildcards, no $ and not "
                             "_INBOX)")
        return subject

    @field_validator("expected_stream")
    @classmethod
    def _stream(cls, stream: str | None) -> str | None:
        if stream is not None and not STREAM.fullmatch(stream):
            raise ValueError(f"expected_stream {stream!r} is not a stream name (1-255 of A-Z a-z 0-9 _ -)")
        return stream

    @field_validator("secret")
    @classmethod
    def _signing_secret(cls, secret: str | None) -> str | None:
        return credentials.signing_secret(secret, password="the password as password, or the token as token")

    _password = field_validator("password", "token")(credentials.password)

    @model_validator(mode="after")
    def _consistent(self) -> NatsSpec:
        if self.reconcile:
            raise ValueError("a NATS server cannot answer the reconcile probe; leave reconcile off")
        if (self.auth == "password") != (self.username is not None):
            raise ValueError("give auth: password and username together")
        if self.password is not None and self.auth != "password":
            raise ValueError("password needs auth: password and a username")
        if self.token is not None and self.auth != "token":
            raise ValueError("token needs auth: token")
        if self.auth != "none" and not self.tls and not self.allow_insecure:
            raise ValueError(f"auth: {self.auth} without tls sends the {self.auth} in the clear; set tls, or "
                             "allow_insecure")
        if not self.allow_private_network:
            for server in self.servers:
                address = hosts.ip_literal(server.rpartition(":")[0])
                if address is not None and not hosts.is_public(str(address)):
                    raise ValueError(f"server {server} is not a public address (loopback, private, link-local or "
                                     "reserved): set allow_private_network to publish there")
        return self


def keep_secrets(held: tuple[str, ...], spec: NatsSpec) -> tuple[str, ...]:
    """What a NATS destination holds once ``spec`` replaces it (``credentials.kept``): its
    signing secrets, then its password or token while it authenticates with one."""
    return credentials.kept(held, spec, password=spec.password or spec.token, uses_password=spec.auth != "none")
