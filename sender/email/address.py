"""Email addresses as a payload or a destination gives them: ``a@example.com`` or
``Name <a@example.com>``."""

from __future__ import annotations

import re
from email.utils import formataddr
from typing import Annotated

from pydantic import AfterValidator

#: A dot-atom address (RFC 5322 addr-spec without quoted local parts or domain literals), ASCII.
ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
ADDR_SPEC = re.compile(
    rf"{ATEXT}+(?:\.{ATEXT}+)*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?\.)+[A-Za-z][A-Za-z0-9-]{{0,62}}")
#: ``Display Name <addr-spec>``: the name plain (no controls, quotes or angle brackets) or quoted
#: (``"Doe, Jane"``, with backslash escapes).
MAILBOX = re.compile(r'(?:"(?P<quoted>(?:[^"\\\x00-\x1f\x7f]|\\[^\x00-\x1f\x7f]){0,200})"'
                     rf"|(?P<name>[^\x00-\x1f\x7f<>\"]{{0,200}}?))\s*<(?P<addr>{ADDR_SPEC.pattern})>")


def mailbox(value: str) -> tuple[str, str]:
    """``a@example.com`` or ``Name <a@example.com>`` as (display name, address); ValueError
    otherwise."""
    if ADDR_SPEC.fullmatch(value) and len(value) <= 254:
        return "", value
    found = MAILBOX.fullmatch(value)
    if found is None or len(found["addr"]) > 254:
        raise ValueError(f"{value!r} is not an email address (a@example.com or Name <a@example.com>)")
    quoted = found["quoted"]
    name = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else found["name"].strip()
    return name, found["addr"]


def written(value: str) -> str:
    """An address as a header holds it: the name quoted if it must be, RFC 2047 if not ASCII."""
    return formataddr(mailbox(value), charset="utf-8")


def _mailbox(value: str) -> str:
    mailbox(value)
    return value


#: A field holding one address, checked as ``mailbox`` reads it.
Mailbox = Annotated[str, AfterValidator(_mailbox)]
