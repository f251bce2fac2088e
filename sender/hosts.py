"""The hosts a destination may name, judged the way the client that connects to them reads them.

One rule for every channel (a webhook URL's host today; SMTP hosts and Kafka bootstrap servers
use the same functions): a host is either

- an ordinary hostname: labels of ASCII letters, digits and inner hyphens (LDH), or IDN labels
  written as the Unicode the client maps them to, each label 1-63 characters as sent and at most
  253 characters in all, with no empty label and a last label that does not look like a number; or
- an IP address written canonically: four decimal numbers 0-255 in ASCII without leading zeros
  and separated by ``.``, or an IPv6 address (in brackets within a URL or ``host:port``).

Everything else is refused, because the client does not connect to the text it was given: yarl
(aiohttp's URL type) maps a non-ASCII host through IDNA/UTS-46, so ``１２７.０.０.１`` and
``127。0。0。1`` become ``127.0.0.1``, an IP literal that aiohttp connects to without asking any
resolver; and the C resolver reads ``2130706433``, ``127.1``, ``0177.0.0.1``, ``0x7f000001`` and
``0`` as loopback or "this host". A check of the text would let all of them through.

``normalise`` gives the host the client will use; ``check_host``, ``check_host_port`` and
``url_host`` apply the rule; ``is_public`` says whether an address may be reached by a
destination that does not allow the private network. All are pure: nothing is resolved or
connected to here.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

import idna

#: The longest hostname, as sent (RFC 1035: 255 octets on the wire, 253 characters written).
MAX_HOST = 253
#: The longest label, as sent (RFC 1035).
MAX_LABEL = 63

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# [0-9], not \d: \d matches every Unicode digit, and those are the forms refused here.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_CANONICAL_IPV4 = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
_LDH_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.IGNORECASE)
# What a URL parser or the C resolver reads as (part of) an IPv4 number: decimal, octal, hex.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*", re.IGNORECASE)
_PORT = re.compile(r"[0-9]{1,5}")
# The NAT64 well-known prefix (RFC 6052) carries an IPv4 address in its last 32 bits.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# The only IPv6 space IANA allocates as global unicast; the rest is reserved by the IETF
# (including the IPv4-compatible ::/96 and the SIIT IPv4-translated ::ffff:0:0:0/96, which a
# translator on the path may turn into any IPv4 address), unique-local, link-local, site-local
# or multicast.
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

#: Every block of IANA's IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and the RFC
#: each block names), and IPv4 multicast: none is a place for a destination outside the private
#: network. Blocks the registries call globally reachable are refused too: their anycast services
#: (PCP, TURN, DNS-SD registration) are found on the local network, and the rest (AS112, AMT,
#: ORCHIDv2, drone ids) serve no webhook, mail or broker. The IPv6 forms that carry an IPv4
#: address the connection reaches (IPv4-mapped, 6to4, and NAT64's 64:ff9b::/96, which is not
#: listed) are judged by that address instead (``is_public``).
SPECIAL_PURPOSE: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this network (RFC 791)"),
    ("0.0.0.0/32", "this host on this network (RFC 1122)"),
    ("10.0.0.0/8", "private use (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (RFC 6598)"),
    ("127.0.0.0/8", "loopback (RFC 1122)"),
    ("169.254.0.0/16", "link local, cloud metadata (RFC 3927)"),
    ("172.16.0.0/12", "private use (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments (RFC 6890)"),
    ("192.0.0.0/29", "IPv4 service continuity prefix (RFC 7335)"),
    ("192.0.0.8/32", "IPv4 dummy address (RFC 7600)"),
    ("192.0.0.9/32", "port control protocol anycast (RFC 7723)"),
    ("192.0.0.10/32", "traversal using relays around NAT anycast (RFC 8155)"),
    ("192.0.0.170/32", "NAT64/DNS64 discovery (RFC 7050)"),
    ("192.0.0.171/32", "NAT64/DNS64 discovery (RFC 7050)"),
    ("192.0.2.0/24", "documentation, TEST-NET-1 (RFC 5737)"),
    ("192.31.196.0/24", "AS112-v4 (RFC 7535)"),
    ("192.52.193.0/24", "automatic multicast tunneling (RFC 7450)"),
    ("192.88.99.0/24", "deprecated 6to4 relay anycast (RFC 7526)"),
    ("192.168.0.0/16", "private use (RFC 1918)"),
    ("192.175.48.0/24", "direct delegation AS112 service (RFC 7534)"),
    ("198.18.0.0/15", "benchmarking (RFC 2544)"),
    ("198.51.100.0/24", "documentation, TEST-NET-2 (RFC 5737)"),
    ("203.0.113.0/24", "documentation, TEST-NET-3 (RFC 5737)"),
    ("224.0.0.0/4", "multicast (RFC 5771)"),
    ("240.0.0.0/4", "reserved (RFC 1112)"),
    ("255.255.255.255/32", "limited broadcast (RFC 919)"),
    ("::1/128", "loopback (RFC 4291)"),
    ("::/128", "unspecified (RFC 4291)"),
    ("::ffff:0:0/96", "IPv4-mapped (RFC 4291)"),
    ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation (RFC 8215)"),
    ("100::/64", "discard-only (RFC 6666)"),
    ("100:0:0:1::/64", "dummy IPv6 prefix (RFC 9780)"),
    ("2001::/23", "IETF protocol assignments (RFC 2928)"),
    ("2001::/32", "Teredo (RFC 4380)"),
    ("2001:1::1/128", "port control protocol anycast (RFC 7723)"),
    ("2001:1::2/128", "traversal using relays around NAT anycast (RFC 8155)"),
    ("2001:1::3/128", "DNS-SD service registration protocol anycast (RFC 9665)"),
    ("2001:2::/48", "benchmarking (RFC 5180)"),
    ("2001:3::/32", "automatic multicast tunneling (RFC 7450)"),
    ("2001:4:112::/48", "AS112-v6 (RFC 7535)"),
    ("2001:10::/28", "deprecated ORCHID (RFC 4843)"),
    ("2001:20::/28", "ORCHIDv2 (RFC 7343)"),
    ("2001:30::/28", "drone remote ID entity tags (RFC 9374)"),
    ("2001:db8::/32", "documentation (RFC 3849)"),
    ("2002::/16", "6to4 (RFC 3056)"),
    ("2620:4f:8000::/48", "direct delegation AS112 service (RFC 7534)"),
    ("3fff::/20", "documentation (RFC 9637)"),
    ("5f00::/16", "segment routing SIDs (RFC 9602)"),
    ("fc00::/7", "unique local (RFC 4193)"),
    ("fe80::/10", "link-local unicast (RFC 4291)"),
)
_SPECIAL = tuple(ipaddress.ip_network(block) for block, _ in SPECIAL_PURPOSE)


class HostRefused(ValueError):
    """A host that is neither an ordinary hostname nor a canonical IP address; says why."""


def normalise(host: str) -> str:
    """``host`` as the client connects to it: an IP address in its compressed form (IPv6
    without brackets), an ASCII name lower-cased, anything else mapped through IDNA/UTS-46 to
    its ASCII form, as yarl does before aiohttp looks at it.

    Only maps: ``normalise("１２７.０.０.１") == "127.0.0.1"`` although that host is refused by
    ``check_host``. Raises ``HostRefused`` if IDNA cannot map it (yarl would fall back to
    Python's older IDNA codec; this module does not guess).
    """
    bare = _unbracketed(host)
    if (ip := ip_literal(bare)) is not None:
        return ip.compressed
    if bare.isascii():
        return bare.lower()
    try:
        mapped = idna.encode(bare, uts46=True).decode("ascii")
    except UnicodeError as exc:  # idna.IDNAError and its kin
        raise HostRefused(f"host {host!r} is not a valid internationalised hostname: {exc}") from None
    ip = ip_literal(mapped)
    return ip.compressed if ip is not None else mapped


def ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` is, if it is an IP address (IPv6 with or without brackets), else
    None. Only the forms Python's ``ipaddress`` accepts: ASCII, and canonical for IPv4."""
    try:
        return ipaddress.ip_address(_unbracketed(host))
    except ValueError:
        return None


def check_host(host: str) -> str:
    """Apply the rule to a bare host (a name, a dotted quad, an IPv6 address with or without
    brackets); returns it normalised, as the client will connect to it.

    Raises ``HostRefused`` saying what is wrong with it.
    """
    if not host:
        raise HostRefused("the host is empty")
    if host.startswith("[") or ":" in host:
        return _check_ipv6(host)
    if host.isascii() and _CANONICAL_IPV4.fullmatch(host):
        return host
    mapped = normalise(host)
    labels = mapped.split(".")
    if "" in labels:
        raise HostRefused(f"host {host!r} has an empty label (a leading, trailing or doubled dot)")
    if ip_literal(mapped) is not None or _NUMERIC_LABEL.fullmatch(labels[-1]):
        if host.isascii():
            raise HostRefused(f"host {host!r} looks like an IPv4 address but is not written as one: write "
                              "four decimal numbers 0-255 without leading zeros, separated by dots")
        raise HostRefused(f"host {host!r} is read as the address {mapped!r}: write IP addresses in ASCII "
                          "digits and dots")
    if len(mapped) > MAX_HOST:
        raise HostRefused(f"host {host!r} is longer than {MAX_HOST} characters")
    sent = [_check_label(host, label) for label in host.split(".")]
    if ".".join(sent) != mapped:  # a full stop other than "." inside a label, say
        raise HostRefused(f"host {host!r} is read as {mapped!r}: separate its labels with '.' only")
    return mapped


def check_host_port(value: str, *, default_port: int | None = None) -> tuple[str, int]:
    """Apply the rule to ``host:port`` (``[v6]:port`` for IPv6; ``port`` may be left out when a
    ``default_port`` is given); returns the normalised host and the port.

    Raises ``HostRefused`` saying what is wrong with it.
    """
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            raise HostRefused(f"{value!r} opens '[' without closing it")
        host, rest = value[:end + 1], value[end + 1:]
        if rest and not rest.startswith(":"):
            raise HostRefused(f"{value!r} has {rest!r} after the address; expected ':port'")
        port_text = rest[1:] if rest else None
    elif value.count(":") > 1:
        raise HostRefused(f"{value!r}: write an IPv6 address in brackets, with its port after them: [address]:port")
    else:
        host, colon, port_text_or_empty = value.partition(":")
        port_text = port_text_or_empty if colon else None
    if port_text is None:
        if default_port is None:
            raise HostRefused(f"{value!r} has no port; write host:port")
        port = default_port
    else:
        port = _check_port(value, port_text)
    return check_host(host), port


def url_host(url: str) -> str:
    """Apply the rule to the host of an absolute URL (and check its port, if written);
    returns the host normalised, as the client will connect to it.

    Raises ``HostRefused`` saying what is wrong with it.
    """
    try:
        netloc = urlsplit(url).netloc
    except ValueError as exc:  # unbalanced brackets, or characters that NFKC-map to a delimiter
        raise HostRefused(f"url {url!r} cannot be parsed: {exc}") from None
    authority = netloc.rpartition("@")[2]
    if authority.startswith("["):
        end = authority.find("]")
        host, rest = authority[:end + 1], authority[end + 1:]
    else:
        host, colon, port_text = authority.partition(":")
        rest = colon + port_text
    if not host:
        raise HostRefused(f"url {url!r} has no host")
    if rest:
        if not rest.startswith(":"):
            raise HostRefused(f"url {url!r} has {rest!r} after its host; expected ':port'")
        if rest != ":":  # "host:" is the scheme's default port
            _check_port(url, rest[1:])
    return check_host(host)


def is_public(address: str) -> bool:
    """Whether an IP address may be reached by a destination that does not allow the private
    network: in none of IANA's special-purpose blocks (``SPECIAL_PURPOSE``), so not loopback,
    private, link-local (cloud metadata at 169.254.169.254), shared, reserved, documentation,
    benchmarking, multicast or unspecified (``0.0.0.0`` reaches this host), and, for IPv6, in
    the global unicast space ``2000::/3``.

    An IPv6 address that carries an IPv4 address the connection reaches (IPv4-mapped
    ``::ffff:a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) is public only if that IPv4
    address is. Python's ``is_global`` is not used: its tables differ between Python versions.
    Accepts a ``%zone`` suffix and brackets; raises ``ValueError`` for anything that is not an
    IP address.
    """
    ip = ipaddress.ip_address(_unbracketed(address).split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        carried = ip.ipv4_mapped or ip.sixtofour
        if carried is None and ip in _NAT64:
            carried = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if carried is not None:
            return is_public(str(carried))
        if ip not in _GLOBAL_UNICAST:
            return False
    return not any(ip in block for block in _SPECIAL)


def _unbracketed(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _check_port(where: str, text: str) -> int:
    if not _PORT.fullmatch(text) or not 0 < int(text) < 65536:
        raise HostRefused(f"{where!r}: port {text!r} is not a number from 1 to 65535")
    return int(text)


def _check_ipv6(host: str) -> str:
    bare = _unbracketed(host)
    if bare.startswith("[") or bare.endswith("]"):
        raise HostRefused(f"host {host!r} has unbalanced brackets")
    if "%" in bare:
        raise HostRefused(f"host {host!r}: IPv6 zone identifiers are not allowed")
    if not bare.isascii():
        raise HostRefused(f"host {host!r}: write IPv6 addresses in ASCII")
    try:
        return ipaddress.IPv6Address(bare).compressed
    except ValueError:
        raise HostRefused(f"host {host!r} is not an IPv6 address") from None


def _check_label(host: str, label: str) -> str:
    """One label as sent (A-label for an IDN), or HostRefused."""
    if label.isascii():
        if not _LDH_LABEL.fullmatch(label):
            raise HostRefused(f"host {host!r}: label {label!r} is not 1-{MAX_LABEL} letters, digits and "
                              "inner hyphens")
        if label[2:4] == "--":  # reserved for A-labels (RFC 5891): must decode
            try:
                idna.decode(label)
            except UnicodeError as exc:  # idna.IDNAError and its kin
                raise HostRefused(f"host {host!r}: label {label!r} is not a valid IDNA A-label: {exc}") from None
        return label.lower()
    try:
        mapped = idna.uts46_remap(label, std3_rules=True, transitional=False)
        sent = idna.encode(label, uts46=True).decode("ascii")
    except UnicodeError as exc:  # idna.IDNAError and its kin
        raise HostRefused(f"host {host!r}: label {label!r} is not a valid IDN label: {exc}") from None
    if "." in mapped:
        raise HostRefused(f"host {host!r}: label {label!r} holds a character read as a full stop; separate "
                          "labels with '.' only")
    if mapped != label.lower() or not sent.startswith("xn--"):
        # Full-width or other look-alike forms of ASCII, or characters IDNA drops or rewrites:
        # the client would connect to a name other than the one written.
        raise HostRefused(f"host {host!r}: label {label!r} is read as {mapped!r}; write {mapped!r}")
    return sent
