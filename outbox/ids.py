"""Identifiers: generated action and attempt ids, and the shapes accepted from callers."""

from __future__ import annotations

import os
import re
import time
import uuid

from .errors import InvalidInput

#: action_id travels as an Idempotency-Key, an URL path segment and a Message-ID local part,
#: so it is restricted to characters that are safe in all three.
ACTION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:~-]{0,199}$")
SCOPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:~/@-]{0,199}$")
DESTINATION_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def uuid7() -> str:
    """A time-ordered UUIDv7 (RFC 9562), so generated ids sort by creation time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return str(uuid.UUID(int=value))


def check(pattern: re.Pattern[str], value: str, what: str) -> str:
    """Return ``value`` if it matches ``pattern``; otherwise raise InvalidInput naming ``what``."""
    if not isinstance(value, str) or not pattern.match(value):
        raise InvalidInput(
            f"{what} {value!r} is malformed: expected 1-{_max_len(pattern)} characters "
            f"matching {pattern.pattern}"
        )
    return value


def _max_len(pattern: re.Pattern[str]) -> int:
    upper = re.search(r"\{0,(\d+)\}\$$", pattern.pattern)
    return int(upper.group(1)) + 1 if upper else 0
