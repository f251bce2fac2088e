"""Identifiers: generated action and attempt ids, and the shapes accepted from callers.

Every pattern here is applied with ``re.fullmatch``: ``$`` would also accept a trailing newline,
which then breaks a ``Location`` header, a log line or a request header far from the check.
"""

from __future__ import annotations

import os
import re
import time

from .errors import InvalidInput

#: action_id travels in an Idempotency-Key, an URL path segment and a Message-ID local part,
#: so it is restricted to characters that are safe in all three (never ``/``: see KEY_SEPARATOR).
ACTION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~-]{0,199}")
SCOPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~/@-]{0,199}")
DESTINATION_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
#: An intent's ordering key: 1-255 visible ASCII characters, as an Idempotency-Key is (it may
#: become a Kafka record's key, and is shown in logs and pages).
ORDERING_KEY = re.compile(r"[!-~]{1,255}")
#: A token's label: any printable text (it is shown in `outbox tokens list`).
TOKEN_LABEL = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
#: A token's public id (``tokens.new_token`` makes eight hex digits).
TOKEN_ID = re.compile(r"[0-9a-f]{1,8}")

#: The key receivers deduplicate on is ``scope/action_id``: an action id never holds ``/``, so
#: the last ``/`` splits it unambiguously even when the scope holds some.
KEY_SEPARATOR = "/"
#: Receivers accept keys of at most this many characters (the Idempotency-Key draft's common limit).
MAX_KEY_LENGTH = 255


def uuid7() -> str:
    """A time-ordered UUIDv7 (RFC 9562), so generated ids sort by creation time (formatted
    here: ``uuid.UUID`` would check and copy the value again, a few microseconds an attempt)."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    digits = f"{value:032x}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def intent_key(scope: str, action_id: str) -> str:
    """The key an intent is known by to receivers and in the store: unique across scopes, so
    two tenants may use the same action id without meeting."""
    return f"{scope}{KEY_SEPARATOR}{action_id}"


def check(pattern: re.Pattern[str], value: str, what: str) -> str:
    """Return ``value`` if it matches ``pattern`` whole; otherwise raise InvalidInput naming ``what``."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidInput(
            f"{what} {value!r} is malformed: expected 1-{_max_len(pattern)} characters "
            f"matching {pattern.pattern}"
        )
    return value


def _max_len(pattern: re.Pattern[str]) -> int:
    upper = re.search(r"\{[01],(\d+)\}$", pattern.pattern)
    if upper is None:
        return 0
    return int(upper.group(1)) + (1 if "{0," in upper.group(0) else 0)
