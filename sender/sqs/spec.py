"""An SQS destination's settings (``SqsSpec``: the queue, where its API is, the access key) and
its secrets: its messages' signing secrets and, after them, the secret access key (with the
session token, when one is given), and the enqueue check of a payload against SQS's limits."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, StrictBool, field_validator, model_validator

from outbox import DestinationSpec, InvalidInput, OnUnknown, canonical_json

from .. import credentials, hosts

#: The largest message SQS takes: its body and its attributes' names, types and values together.
MAX_MESSAGE = 256 * 1024
#: What the payload may use of it: the rest is room for the attributes (``envelope.headers``).
MAX_BODY = MAX_MESSAGE - 4096
#: The characters SQS takes in a message (its SendMessage reference); anything else is refused.
UNSENDABLE = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}")
ACCOUNT = re.compile(r"[0-9]{12}")
#: A queue name: 1-80 letters, digits, hyphens and underscores, a FIFO queue's ending in ``.fifo``.
QUEUE = re.compile(r"(?=.{1,80}$)[A-Za-z0-9_-]+(?:\.fifo)?")
ACCESS_KEY_ID = re.compile(r"[A-Z0-9]{16,128}")
SECRET_KEY = re.compile(r"[A-Za-z0-9/+=]{16,128}")
#: An AWS queue URL's host, and the region it names.
AWS_HOST = re.compile(r"sqs\.([a-z0-9-]+)\.amazonaws\.com")
SESSION_TOKEN = re.compile(r"[A-Za-z0-9/+=]{16,8192}")


class SqsSpec(DestinationSpec):
    """An SQS destination: the queue its messages go to, and the API and key it sends them with."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["sqs"]
    region: str = Field(description="the queue's AWS region (eu-west-1)", max_length=32)
    queue_url: str | None = Field(
        default=None, max_length=512,
        description="the queue's URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME); or queue_name and account_id")
    queue_name: str | None = Field(default=None, description="the queue's name (NAME.fifo: a FIFO queue)")
    account_id: str | None = Field(default=None, description="the 12-digit account that owns queue_name")
    endpoint_url: str | None = Field(
        default=None, max_length=256,
        description="the SQS API to send to, for ElasticMQ, LocalStack or a VPC endpoint (default: the "
                    "region's, https://sqs.REGION.amazonaws.com)")
    allow_insecure: StrictBool = Field(
        default=False, description="allow an http:// endpoint_url (requests and their signatures in the clear)")
    access_key_id: str = Field(description="the access key the requests are signed with")
    secret_access_key: str | None = Field(
        default=None, exclude=True, repr=False, json_schema_extra={"writeOnly": True},
        description="write-only, kept with the destination's secrets (never shown). Omitted on update: the "
                    "current one stays")
    session_token: str | None = Field(
        default=None, exclude=True, repr=False, json_schema_extra={"writeOnly": True},
        description="write-only: a temporary key's session token, given with its secret_access_key")
    on_unknown: OnUnknown = Field(
        default=OnUnknown.ALWAYS,
        description="an unknown outcome is sent again: a FIFO queue drops the copy (the deduplication id) within "
                    "its five minutes; later, or on a standard queue, the consumer drops it by its idempotency-key")

    @field_validator("region")
    @classmethod
    def _region(cls, region: str) -> str:
        return _matching(REGION, region, "region", "an AWS region such as eu-west-1")

    @field_validator("queue_url")
    @classmethod
    def _queue_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        path = parts.path.split("/")
        if (parts.scheme not in ("http", "https") or parts.query or parts.fragment or parts.username
                or len(path) != 3 or not ACCOUNT.fullmatch(path[1]) or not QUEUE.fullmatch(path[2])):
            raise ValueError(f"queue_url {url!r} is not an SQS queue URL (https://host/ACCOUNT/NAME, ACCOUNT 12 "
                             "digits, NAME 1-80 of A-Z a-z 0-9 - _, ending .fifo for a FIFO queue)")
        hosts.url_host(url)  # a HostRefused (ValueError) says what is wrong with the host
        return url

    @field_validator("queue_name")
    @classmethod
    def _queue_name(cls, name: str | None) -> str | None:
        return None if name is None else _matching(
            QUEUE, name, "queue_name", "1-80 of A-Z a-z 0-9 - _, ending .fifo for a FIFO queue")

    @field_validator("account_id")
    @classmethod
    def _account(cls, account: str | None) -> str | None:
        return None if account is None else _matching(ACCOUNT, account, "account_id", "12 digits")

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query or parts.fragment \
                or parts.username or parts.password:
            raise ValueError(f"endpoint_url {url!r} must be http(s)://host[:port], without a path or credentials")
        hosts.url_host(url)
        return url.rstrip("/")

    @field_validator("access_key_id")
    @classmethod
    def _access_key(cls, key: str) -> str:
        return _matching(ACCESS_KEY_ID, key, "access_key_id", "16-128 of A-Z 0-9 (AKIA..., ASIA...)")

    @field_validator("secret_access_key")
    @classmethod
    def _secret_key(cls, key: str | None) -> str | None:
        if key is None:
            return None
        credentials.password(key)  # never in the signing secrets' form
        return _matching(SECRET_KEY, key, "secret_access_key", "16-128 of A-Z a-z 0-9 / + =")

    @field_validator("session_token")
    @classmethod
    def _token(cls, token: str | None) -> str | None:
        return None if token is None else _matching(SESSION_TOKEN, token, "session_token",
                                                    "16-8192 of A-Z a-z 0-9 / + =")

    @field_validator("secret")
    @classmethod
    def _signing_secret(cls, secret: str | None) -> str | None:
        return credentials.signing_secret(secret, password="the secret access key as secret_access_key")

    @model_validator(mode="after")
    def _consistent(self) -> SqsSpec:
        if self.reconcile:
            raise ValueError("an SQS queue cannot answer the reconcile probe; leave reconcile off")
        if (self.queue_url is None) == (self.queue_name is None):
            raise ValueError("give the queue as queue_url, or as queue_name and account_id")
        if (self.queue_name is None) != (self.account_id is None):
            raise ValueError("give queue_name and account_id together")
        if self.session_token is not None and self.secret_access_key is None:
            raise ValueError("give session_token with the secret_access_key it belongs to")
        aws = AWS_HOST.fullmatch(urlsplit(self.queue_url or "").hostname or "")
        if aws and self.endpoint_url is None and aws.group(1) != self.region:
            raise ValueError(f"queue_url names a queue in {aws.group(1)}, but region is {self.region}: the requests "
                             "go to the region's API")
        if self.endpoint_url is not None and self.endpoint_url.startswith("http:") and not self.allow_insecure:
            raise ValueError("an http:// endpoint_url sends every request in the clear; use https, or set "
                             "allow_insecure")
        if self.endpoint_url is not None and not self.allow_private_network:
            address = hosts.ip_literal(hosts.url_host(self.endpoint_url))
            if address is not None and not hosts.is_public(str(address)):
                raise ValueError(f"endpoint_url's host {address} is not a public address (loopback, private, "
                                 "link-local or reserved): set allow_private_network to send there")
        return self

    @property
    def endpoint(self) -> str:
        """Where the requests go: ``endpoint_url``, else the region's SQS API."""
        return self.endpoint_url or f"https://sqs.{self.region}.amazonaws.com"

    @property
    def url(self) -> str:
        """The queue's URL, as SQS names it in a request."""
        return self.queue_url or f"{self.endpoint}/{self.account_id}/{self.queue_name}"

    @property
    def fifo(self) -> bool:
        return self.url.endswith(".fifo")


def _matching(rule: re.Pattern[str], value: str, field: str, form: str) -> str:
    if not rule.fullmatch(value):
        raise ValueError(f"{field} {value!r} is not {form}" if field not in ("secret_access_key", "session_token")
                         else f"{field} is not {form}")  # (a secret is never repeated in an answer)
    return value


def keep_secrets(held: tuple[str, ...], spec: SqsSpec) -> tuple[str, ...]:
    """What an SQS destination holds once ``spec`` replaces it (``credentials.kept``): its signing
    secrets, then its key (the secret access key, and a session token after a space). Raises
    InvalidInput for a destination that would hold no key."""
    key = None if spec.secret_access_key is None else " ".join(filter(None, (spec.secret_access_key,
                                                                           spec.session_token)))
    kept = credentials.kept(held, spec, password=key, uses_password=True)
    if credentials.split(kept)[1] is None:
        raise InvalidInput("secret_access_key: an SQS destination needs the secret access key of its access_key_id")
    return kept


def key(secrets: tuple[str, ...]) -> tuple[str, str | None] | None:
    """The secret access key and session token a destination holds, or None."""
    held = credentials.split(secrets)[1]
    if held is None:
        return None
    secret, _, token = held.partition(" ")
    return secret, token or None


def check_payload(payload: Any) -> None:
    """The enqueue check: a payload SQS could never take (too large, or holding characters it
    refuses) raises ValueError, so it is refused at enqueue rather than dead-lettered."""
    body = canonical_json(payload)
    if len(body) > MAX_BODY:
        raise ValueError(f"its canonical JSON is {len(body)} bytes; an SQS message holds at most {MAX_BODY} "
                         f"(256 KiB less room for the message's attributes)")
    if found := UNSENDABLE.search(body.decode()):
        raise ValueError(f"it holds the character U+{ord(found.group()):04X}, which SQS does not take in a message")
