"""The header fields a payload or a destination may add to a message: any but those the
message sets itself or that mail systems read as who sent it or what checked it."""

from __future__ import annotations

import re

from receivers import wire

#: An RFC 5322 field name: printable ASCII but the colon.
HEADER_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]{1,76}")
#: Header values: no line breaks (header injection) or other controls but the tab.
HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]{0,900}")  # with its name, within a 998-character line
#: Headers the message sets itself: neither a payload nor a destination may set them.
OURS = frozenset(name.lower() for name in (
    "From", "Sender", "To", "Cc", "Bcc", "Subject", "Reply-To", "Message-ID", "Date", "MIME-Version",
    "Content-Type", "Content-Transfer-Encoding", "Return-Path", "Received",
    wire.IDEMPOTENCY_KEY, wire.ATTEMPT_ID, wire.FENCE, wire.PAYLOAD_DIGEST, "traceparent", "tracestate",
    # what mail systems read as who sent a message or what checked it: never a tenant's to say
    "Authentication-Results", "Received-SPF", "Delivered-To", "Return-Receipt-To"))
#: Families of headers that are likewise the message's or a mail system's own.
OURS_PREFIXES = ("resent-", "arc-", "dkim-", "content-", "list-id")


def check_headers(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` if each may be added as it is; ValueError naming the first that may not."""
    for name, value in headers.items():
        if not HEADER_NAME.fullmatch(name):
            raise ValueError(f"header name {name!r} is not a header field name")
        if name.lower() in OURS or name.lower().startswith(OURS_PREFIXES):
            raise ValueError(f"header {name!r} is set by the outbox or by mail systems and cannot be given")
        if not HEADER_VALUE.fullmatch(value):
            raise ValueError(f"header {name!r} holds a line break or control character, or is over 900 characters")
    return headers
