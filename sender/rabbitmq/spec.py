"""A RabbitMQ destination's settings (``RabbitSpec``: the broker's URL, the exchange and routing key
each message is published with) and its secrets: its messages' signing secrets and, after them,
the password it connects with."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import unquote

from pydantic import ConfigDict, Field, StrictBool, field_validator, model_validator

from outbox import DestinationSpec, OnUnknown

from .. import credentials, hosts

#: ``amqp[s]://[user@]host[:port][/vhost]``: a password in it is refused (it has a field of its own).
URL = re.compile(r"(?P<scheme>amqps?)://(?:(?P<user>[^@/?#]*)@)?(?P<host>\[[^\]/?#@]*\]|[^:/?#@\[\]]*)"
                 r"(?::(?P<port>[0-9]{1,5}))?(?:/(?P<vhost>[^/?#]*))?")
#: An exchange's name as RabbitMQ allows it ("" is the default exchange).
EXCHANGE = re.compile(r"[A-Za-z0-9_.:-]{0,255}")
#: AMQP 0-9-1's short strings (exchange, routing key, user) hold at most this many bytes.
SHORT = 255
PORTS = {"amqp": 5672, "amqps": 5671}


class RabbitSpec(DestinationSpec):
    """A RabbitMQ destination: the broker, and where on it every message is published."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["rabbitmq"]
    url: str = Field(description="amqp://user@host:port/vhost, or amqps:// for TLS verifying the broker's "
                                 "certificate and name; without the password (give it as password)")
    exchange: str = Field(default="", description='the exchange every message is published to; "" is the default '
                                                  "exchange, where the routing key names the queue")
    routing_key: str = Field(default="", description="the routing key of every message (the queue's name on the "
                                                     "default exchange)")
    routing_key_from: Literal["ordering_key"] | None = Field(
        default=None, description="ordering_key: an intent's ordering key is its message's routing key, when it "
                                  "has one (routing_key otherwise)")
    password: str | None = Field(
        default=None, min_length=1, max_length=1024, exclude=True, repr=False, json_schema_extra={"writeOnly": True},
        description="write-only, kept with the destination's secrets (never shown). Omitted on update: the "
                    "current one stays")
    allow_insecure: StrictBool = Field(
        default=False, description="allow a password over amqp:// (it crosses the network in the clear)")
    on_unknown: OnUnknown = Field(
        default=OnUnknown.ALWAYS, description="consumers deduplicate (the receivers' idempotent consumer), so an "
                                              "unknown outcome is published again, possibly as a second message")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        found = URL.fullmatch(url)
        if found is None:
            raise ValueError(f"url {url!r} is not amqp://user@host:port/vhost (or amqps://), without query or "
                             "fragment")
        user = unquote(found["user"] or "")
        if ":" in user:
            raise ValueError("the url must not hold the password: give it as password")
        hosts.check_host(found["host"])  # raises HostRefused saying what is wrong with it
        port = int(found["port"] or PORTS[found["scheme"]])
        if not 0 < port < 65536:
            raise ValueError(f"url {url!r} has port {port}, outside 1-65535")
        if len(user.encode()) > SHORT or len(unquote(found["vhost"] or "").encode()) > SHORT:
            raise ValueError(f"the url's user and vhost are at most {SHORT} bytes each")
        return url

    @field_validator("exchange")
    @classmethod
    def _exchange(cls, exchange: str) -> str:
        if not EXCHANGE.fullmatch(exchange):
            raise ValueError(f"exchange {exchange!r} is not an exchange name (0-255 of A-Z a-z 0-9 _ . : -)")
        return exchange

    @field_validator("routing_key")
    @classmethod
    def _routing_key(cls, key: str) -> str:
        if len(key.encode()) > SHORT:
            raise ValueError(f"routing_key is at most {SHORT} bytes")
        return key

    @field_validator("secret")
    @classmethod
    def _signing_secret(cls, secret: str | None) -> str | None:
        return credentials.signing_secret(secret, password="the broker's password as password")

    _password = field_validator("password")(credentials.password)

    @model_validator(mode="after")
    def _consistent(self) -> RabbitSpec:
        if self.reconcile:
            raise ValueError("a RabbitMQ broker cannot answer the reconcile probe; leave reconcile off")
        if not self.exchange and not self.routing_key:
            raise ValueError('on the default exchange (exchange "") the routing_key names the queue: give it')
        if self.password is not None and not self.tls and not self.allow_insecure:
            raise ValueError("a password over amqp:// crosses the network in the clear; use amqps://, or set "
                             "allow_insecure")
        address = hosts.ip_literal(self.host)
        if not self.allow_private_network and address is not None and not hosts.is_public(str(address)):
            raise ValueError(f"the url's host {self.host} is not a public address (loopback, private, link-local or "
                             "reserved): set allow_private_network to publish there")
        return self

    @property
    def _parts(self) -> re.Match[str]:
        found = URL.fullmatch(self.url)
        assert found is not None  # (checked when validated)
        return found

    @property
    def scheme(self) -> str:
        return self._parts["scheme"]

    @property
    def tls(self) -> bool:
        return self.scheme == "amqps"

    @property
    def host(self) -> str:
        return hosts.check_host(self._parts["host"])

    @property
    def port(self) -> int:
        return int(self._parts["port"] or PORTS[self._parts["scheme"]])

    @property
    def username(self) -> str:
        return unquote(self._parts["user"] or "guest")

    @property
    def vhost(self) -> str:
        return unquote(self._parts["vhost"] or "") or "/"


def keep_secrets(held: tuple[str, ...], spec: RabbitSpec) -> tuple[str, ...]:
    """What a RabbitMQ destination holds once ``spec`` replaces it (``credentials.kept``): its
    signing secrets, then its password."""
    return credentials.kept(held, spec, password=spec.password, uses_password=True)
