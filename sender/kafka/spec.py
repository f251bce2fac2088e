"""A Kafka destination's settings (``KafkaSpec``: the cluster, the topic, how records are
produced) and its secrets: its records' signing secrets and, after them, its SASL password."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from outbox import DestinationSpec, OnUnknown

from .. import credentials, hosts

#: A topic name as Kafka allows it (``.`` and ``..`` are refused by the broker too).
TOPIC = re.compile(r"(?!\.{1,2}$)[A-Za-z0-9._-]{1,249}")
class KafkaSpec(DestinationSpec):
    """A Kafka destination: the cluster, the topic its records go to, and how they are produced."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["kafka"]
    bootstrap_servers: list[str] = Field(
        min_length=1, max_length=16, description="host:port of brokers to learn the cluster from")
    topic: str = Field(description="the topic every record of this destination is produced to")
    tls: StrictBool = Field(default=False, description="connect with TLS, verifying the brokers' certificates")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="authenticate with SASL as sasl_username with sasl_password")
    sasl_username: str | None = Field(default=None, min_length=1, max_length=256)
    sasl_password: str | None = Field(
        default=None, min_length=1, max_length=1024, exclude=True, repr=False, json_schema_extra={"writeOnly": True},
        description="write-only, kept with the destination's secrets (never shown). Omitted on update: the "
                    "current one stays")
    allow_insecure: StrictBool = Field(
        default=False, description="allow SASL without TLS (the password crosses the network in the clear)")
    enable_idempotence: StrictBool = Field(
        default=True, description="the idempotent producer: its own retries never append a record twice")
    acks: Literal["all", "leader"] = Field(
        default="all", description="all: every in-sync replica has the record before it counts as delivered")
    compression: Literal["none", "gzip"] = "none"
    linger_ms: StrictInt = Field(default=0, ge=0, le=1000, description="how long a batch may wait for more records")
    max_request_size: StrictInt = Field(default=1_048_576, ge=1024, le=64 * 1_048_576,
                                  description="the largest produce request; a larger record is rejected")
    on_unknown: OnUnknown = Field(
        default=OnUnknown.ALWAYS, description="consumers deduplicate (the receivers' idempotent consumer), so an "
                                              "unknown outcome is produced again, possibly as a second record")

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, servers: list[str]) -> list[str]:
        return [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                for host, port in (hosts.check_host_port(server) for server in servers)]

    @field_validator("topic")
    @classmethod
    def _topic(cls, topic: str) -> str:
        if not TOPIC.fullmatch(topic):
            raise ValueError(f"topic {topic!r} is not a Kafka topic name (1-249 of A-Z a-z 0-9 . _ -, "
                             "not '.' or '..')")
        return topic

    @field_validator("secret")
    @classmethod
    def _signing_secret(cls, secret: str | None) -> str | None:
        return credentials.signing_secret(secret, password="the SASL password as sasl_password")

    _password = field_validator("sasl_password")(credentials.password)

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSpec:
        if self.reconcile:
            raise ValueError("a Kafka broker cannot answer the reconcile probe; leave reconcile off")
        if self.enable_idempotence and self.acks != "all":
            raise ValueError("the idempotent producer needs acks: all")
        if (self.sasl_mechanism is None) != (self.sasl_username is None):
            raise ValueError("give sasl_mechanism and sasl_username together")
        if self.sasl_password is not None and self.sasl_mechanism is None:
            raise ValueError("sasl_password needs sasl_mechanism and sasl_username")
        if self.sasl_mechanism is not None and not self.tls and not self.allow_insecure:
            raise ValueError("SASL without tls sends the password in the clear; set tls, or allow_insecure")
        if not self.allow_private_network:
            for server in self.bootstrap_servers:
                address = hosts.ip_literal(server.rpartition(":")[0])
                if address is not None and not hosts.is_public(str(address)):
                    raise ValueError(f"bootstrap server {server} is not a public address (loopback, private, "
                                     "link-local or reserved): set allow_private_network to produce there")
        return self

    @property
    def security_protocol(self) -> str:
        return ("SASL_" if self.sasl_mechanism else "") + ("SSL" if self.tls else "PLAINTEXT")



def keep_secrets(held: tuple[str, ...], spec: KafkaSpec) -> tuple[str, ...]:
    """What a Kafka destination holds once ``spec`` replaces it (``credentials.kept``): its
    signing secrets, then its SASL password while it uses SASL."""
    return credentials.kept(held, spec, password=spec.sasl_password, uses_password=spec.sasl_mechanism is not None)
