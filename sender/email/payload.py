"""What an intent for an email destination carries (recipients, subject, bodies, attachments,
headers), checked at enqueue so that a message that could never be built is never queued."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .address import Mailbox, mailbox
from .headers import check_headers

#: Recipients of one message (to, cc and bcc together).
MAX_RECIPIENTS = 50
MAX_ATTACHMENTS = 10
MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}")


class Attachment(BaseModel):
    """A small file sent with the message; its base64 counts against the payload limit."""

    model_config = ConfigDict(extra="forbid")

    filename: str = Field(pattern=r"^[^\x00-\x1f\x7f/\\]{1,200}$")
    content_type: str = "application/octet-stream"
    content: str = Field(description="the file's bytes, base64")

    @field_validator("content_type")
    @classmethod
    def _media_type(cls, value: str) -> str:
        if not MEDIA_TYPE.fullmatch(value):
            raise ValueError(f"content_type {value!r} is not a media type (type/subtype)")
        return value

    @field_validator("content")
    @classmethod
    def _base64(cls, value: str) -> str:
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError("content must be base64") from None
        return value


class EmailPayload(BaseModel):
    """What an intent for an email destination carries: checked at enqueue (a 422 naming the
    field), so a message that could never be built is never queued."""

    model_config = ConfigDict(extra="forbid")

    to: list[Mailbox] = Field(min_length=1, max_length=MAX_RECIPIENTS)
    cc: list[Mailbox] = Field(default_factory=list, max_length=MAX_RECIPIENTS)
    bcc: list[Mailbox] = Field(default_factory=list, max_length=MAX_RECIPIENTS)
    subject: str = Field(default="", pattern=r"^[^\x00-\x08\x0a-\x1f\x7f]{0,900}$")
    text: str | None = None
    html: str | None = None
    attachments: list[Attachment] = Field(default_factory=list, max_length=MAX_ATTACHMENTS)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _extra_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return check_headers(headers)

    @model_validator(mode="after")
    def _whole(self) -> EmailPayload:
        if self.text is None and self.html is None:
            raise ValueError("give text or html (or both)")
        if len(self.recipients()) > MAX_RECIPIENTS:
            raise ValueError(f"at most {MAX_RECIPIENTS} recipients in to, cc and bcc together")
        return self

    def recipients(self) -> list[str]:
        """Every envelope recipient once, in order."""
        return list(dict.fromkeys(mailbox(v)[1] for v in (*self.to, *self.cc, *self.bcc)))


def check_payload(payload: Any) -> None:
    """The enqueue check: ValueError naming each refused field."""
    try:
        EmailPayload.model_validate(payload)
    except ValidationError as exc:
        raise ValueError("; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'payload'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors())) from None
