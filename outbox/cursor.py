"""Page cursors: the opaque token a listing hands back for the page after it, read the same way
by the HTTP API and the CLI."""

from __future__ import annotations

import base64
import binascii

#: The most one page of a listing holds (intents, events).
MAX_PAGE = 500


def encode_cursor(seq: int) -> str:
    """The cursor of the page that starts after the intent numbered ``seq``."""
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The seq ``cursor`` was made from; ValueError (with a message for the caller) if it was not
    made by ``encode_cursor``."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, value = text.partition(":")
        seq = int(value)
        if kind != "seq" or not 0 < seq < 2**63:  # a seq is a 64-bit row id in every store
            raise ValueError(kind)
        return seq
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError("cursor is malformed; pass next_cursor back unchanged") from None
