"""Email addresses as a payload or a destination gives them: ``a@example.com`` or
``Name <a@example.com>``, read by the email package's RFC 5322 header parser.

The parser reads what a mail client would; on top of its grammar the outbox refuses what it
cannot send or what could change the message: a line break or other control character (a
header injection), more than one address or a group, an address written with comments or
spaces inside it, a quoted local part, an address beyond ASCII (messages are sent without
SMTPUTF8), and a domain that is not a host name of two labels or more as ``sender.hosts``
judges one (no IP address, no domain literal). The name may be any text the parser reads
without a defect, quoted (``"Doe, Jane"``) or not, beyond ASCII too (written in RFC 2047);
obsolete forms RFC 5322 says must still be read (a period in a name: ``Dr. Who``) are read.
"""

from __future__ import annotations

from email.errors import ObsoleteHeaderDefect
from email.headerregistry import AddressHeader, HeaderRegistry
from email.utils import formataddr
from functools import lru_cache
from typing import Annotated

from pydantic import AfterValidator

from .. import hosts

#: The longest address (RFC 5321's path, less its angle brackets) and display name.
MAX_ADDRESS = 254
MAX_NAME = 200
#: The longest text read as one (a name, its quotes, the address): beyond it, nothing is parsed.
MAX_MAILBOX = 512

_HEADERS = HeaderRegistry()


@lru_cache(maxsize=4096)
def mailbox(value: str) -> tuple[str, str]:
    """``a@example.com`` or ``Name <a@example.com>`` as (display name, address); ValueError
    otherwise. Cached: the parser takes about 0.1 ms, and a message reads each of its addresses
    several times (validated, as an envelope recipient, in its header)."""
    refused = ValueError(f"{value!r} is not an email address (a@example.com or Name <a@example.com>)")
    if len(value) > MAX_MAILBOX or _controls(value):
        raise refused
    try:
        header = _HEADERS("to", value)
    except Exception:  # on some malformed text the parser fails (IndexError, AttributeError, TypeError...)
        raise refused from None
    assert isinstance(header, AddressHeader)  # the registry's class for "to"
    if (len(header.addresses) != 1 or header.groups[0].display_name is not None
            or not all(isinstance(defect, ObsoleteHeaderDefect) for defect in header.defects)):
        raise refused
    [found] = header.addresses
    address = found.addr_spec
    written = value == address or value.endswith(f"<{address}>")  # no comment, space or route inside it
    if (not written or address != f"{found.username}@{found.domain}"  # (the parser quotes a local part that needs it)
            or not address.isascii() or len(address) > MAX_ADDRESS
            or len(found.display_name) > MAX_NAME or _controls(found.display_name)
            or not _host_name(found.domain)):
        raise refused
    return found.display_name, address


def _controls(text: str) -> bool:
    """Whether ``text`` holds a control character (CR and LF among them)."""
    return any(char < " " or char == "\x7f" for char in text)


def _host_name(domain: str) -> bool:
    """Whether ``domain`` is a host name of two labels or more, by the rule every channel's hosts follow."""
    if "." not in domain or domain.startswith("[") or hosts.ip_literal(domain) is not None:
        return False
    try:
        hosts.check_host(domain)
    except hosts.HostRefused:
        return False
    return True


def written(value: str) -> str:
    """An address as a header holds it: the name quoted if it must be, RFC 2047 if not ASCII."""
    return formataddr(mailbox(value), charset="utf-8")


def _mailbox(value: str) -> str:
    mailbox(value)
    return value


#: A field holding one address, checked as ``mailbox`` reads it.
Mailbox = Annotated[str, AfterValidator(_mailbox)]
