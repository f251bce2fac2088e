"""A Redis Streams destination's settings (``RedisSpec``: the server, the stream, the dedupe) and
its secrets: its entries' signing secrets and, after them, the password it authenticates with."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from outbox import DestinationSpec, OnUnknown

from .. import credentials, hosts

#: A stream's key: printable ASCII without spaces or braces, so the dedupe keys' ``{stream}`` hash
#: tag is the whole name (the same cluster slot as the stream).
STREAM = re.compile(r"[!-z|~]{1,200}")
#: An ACL user name as AUTH takes it: visible ASCII.
USERNAME = re.compile(r"[!-~]{1,256}")
#: How long a resend is answered with the earlier entry, by default: a week.
DEDUPE_TTL_SECONDS = 7 * 24 * 3600


class RedisSpec(DestinationSpec):
    """A Redis destination: the server, the stream each intent is added to as one entry, and how
    long a resend is recognised."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["redis"]
    host: str = Field(max_length=253, description="the Redis server (a primary: entries are written there)")
    port: StrictInt = Field(default=6379, ge=1, le=65535)
    db: StrictInt = Field(default=0, ge=0, le=65535, description="the logical database (SELECT)")
    stream: str = Field(description="the stream key every entry of this destination is added to")
    tls: StrictBool = Field(default=False, description="connect with TLS, verifying the server's certificate "
                                                       "against host")
    username: str | None = Field(default=None, description="the ACL user to AUTH as (default: the default user)")
    password: str | None = Field(
        default=None, min_length=1, max_length=1024, exclude=True, repr=False, json_schema_extra={"writeOnly": True},
        description="write-only, kept with the destination's secrets (never shown). Omitted on update: the "
                    "current one stays")
    allow_insecure: StrictBool = Field(
        default=False, description="allow a password without TLS (it crosses the network in the clear)")
    max_len: StrictInt | None = Field(
        default=None, ge=1, description="trim the stream to about this many entries (XADD MAXLEN ~)")
    dedupe_ttl_seconds: StrictInt = Field(
        default=DEDUPE_TTL_SECONDS, ge=60, le=366 * 24 * 3600,
        description="how long the server answers a resend with the entry added first; after it a resend is a "
                    "second entry (the consumer's idempotency removes it)")
    wait_replicas: StrictInt | None = Field(
        default=None, ge=1, le=64, description="delivered only once this many replicas acknowledged the entry (WAIT)")
    wait_timeout_ms: StrictInt = Field(default=1000, ge=1, le=60_000,
                                       description="how long WAIT waits for the replicas")
    on_unknown: OnUnknown = Field(
        default=OnUnknown.ALWAYS, description="the server answers a resend within dedupe_ttl_seconds with the "
                                              "entry added first, so an unknown outcome is sent again")

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        return hosts.check_host(host)

    @field_validator("stream")
    @classmethod
    def _stream(cls, stream: str) -> str:
        if not STREAM.fullmatch(stream):
            raise ValueError(f"stream {stream!r} is not a stream key this channel writes (1-200 printable ASCII "
                             "characters without spaces, '{' or '}')")
        return stream

    @field_validator("username")
    @classmethod
    def _username(cls, username: str | None) -> str | None:
        if username is not None and not USERNAME.fullmatch(username):
            raise ValueError("username is 1-256 visible ASCII characters")
        return username

    @field_validator("secret")
    @classmethod
    def _signing_secret(cls, secret: str | None) -> str | None:
        return credentials.signing_secret(secret, password="the password as password")

    _password = field_validator("password")(credentials.password)

    @model_validator(mode="after")
    def _consistent(self) -> RedisSpec:
        if self.reconcile:
            raise ValueError("a Redis server cannot answer the reconcile probe; leave reconcile off")
        if self.password is not None and not self.tls and not self.allow_insecure:
            raise ValueError("a password without tls crosses the network in the clear; set tls, or allow_insecure")
        if not self.allow_private_network:
            address = hosts.ip_literal(self.host)
            if address is not None and not hosts.is_public(str(address)):
                raise ValueError(f"host {self.host} is not a public address (loopback, private, link-local or "
                                 "reserved): set allow_private_network to write there")
        return self


def keep_secrets(held: tuple[str, ...], spec: RedisSpec) -> tuple[str, ...]:
    """What a Redis destination holds once ``spec`` replaces it (``credentials.kept``): its signing
    secrets, then its password (always: AUTH needs no other setting to use it)."""
    return credentials.kept(held, spec, password=spec.password, uses_password=True)
