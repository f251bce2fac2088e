"""sender.hosts: which hosts a destination may name, judged as the HTTP client reads them.

Pure functions: every address here, 10.0.0.1 and 169.254.169.254 included, is only a string.
"""

from __future__ import annotations

import ipaddress
import re

import pytest
from yarl import URL

from sender import hosts
from sender.hosts import HostRefused

# Spellings the client (yarl's IDNA/UTS-46 mapping, or the C resolver) reads as an IP address.
DISGUISED = {
    "１２７.０.０.１": "127.0.0.1",  # full-width digits
    "127。0。0。1": "127.0.0.1",  # ideographic full stops
    "127．0．0．1": "127.0.0.1",  # full-width full stops
    "127｡0｡0｡1": "127.0.0.1",  # half-width ideographic full stops
    "①②⑦.0.0.1": "127.0.0.1",  # circled digits
    "１６９.２５４.１６９.２５４": "169.254.169.254",
    "169。254。169。254": "169.254.169.254",
    "１０.０.０.１": "10.0.0.1",
    "10。0。0。1": "10.0.0.1",
}


@pytest.mark.parametrize(("host", "address"), DISGUISED.items())
def test_an_address_in_other_characters_is_refused_and_says_what_it_is_read_as(host, address):
    with pytest.raises(HostRefused, match=re.escape(f"read as the address '{address}'")):
        hosts.check_host(host)
    assert hosts.normalise(host) == address
    assert URL(f"http://{host}/").raw_host == address  # what aiohttp would connect to


@pytest.mark.parametrize("host", [
    "2130706433", "127.1", "0177.0.0.1", "0x7f000001", "0X7F000001", "0", "0x7f.1", "127.000.000.001",
    "010.0.0.1", "167772161", "10.1", "0xa9fea9fe", "169.254.43518", "1.2.3.4.5", "example.123", "x.0x",
])
def test_a_numeric_host_not_written_as_a_canonical_dotted_quad_is_refused(host):
    with pytest.raises(HostRefused, match="looks like an IPv4 address but is not written as one"):
        hosts.check_host(host)


@pytest.mark.parametrize(("host", "words"), [
    ("", "empty"),
    ("a..example", "empty label"),
    (".example", "empty label"),
    ("example.com.", "empty label"),
    ("127.0.0.1.", "empty label"),
    ("a" * 64 + ".example", "1-63 letters"),
    (".".join(["a" * 63] * 4), "longer than 253"),
    ("under_score.example", "letters, digits and inner hyphens"),
    ("-lead.example", "inner hyphens"),
    ("trail-.example", "inner hyphens"),
    ("sp ace.example", "inner hyphens"),
    ("ex%41mple.com", "inner hyphens"),
    ("user@example.com", "inner hyphens"),
    ("xn--zz.example", "not a valid IDNA A-label"),
    ("ｅｘａｍｐｌｅ.com", "read as 'example'"),  # full-width letters
    ("ＬＯＣＡＬＨＯＳＴ", "read as 'localhost'"),
    ("e\u200bvil.example", "read as 'evil'"),  # a zero-width space IDNA would drop
    ("bü\u00adcher.example", "read as 'bücher'"),  # a soft hyphen, likewise
    ("münchen。de", "read as a full stop"),
    ("[::1", "unbalanced"),
    ("[fe80::1%25eth0]", "zone identifiers"),
    ("fe80::1%eth0", "zone identifiers"),
    ("[v1.fe]", "not an IPv6 address"),
    ("[::１]", "ASCII"),
    ("[127.0.0.1]", "not an IPv6 address"),
])
def test_anything_else_that_is_no_ordinary_hostname_is_refused(host, words):
    with pytest.raises(HostRefused, match=re.escape(words)):
        hosts.check_host(host)


@pytest.mark.parametrize(("host", "normalised"), [
    ("example.com", "example.com"),
    ("Billing.Example.COM", "billing.example.com"),
    ("a-b.c0.example", "a-b.c0.example"),
    ("1e3.example", "1e3.example"),  # a digit-led label is fine; only a numeric last label is not
    ("123.example", "123.example"),
    ("localhost", "localhost"),
    ("bücher.example", "xn--bcher-kva.example"),  # IDN: sent as its A-label
    ("BÜCHER.example", "xn--bcher-kva.example"),
    ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ("例え.テスト", "xn--r8jz45g.xn--zckzah"),
    ("faß.de", "xn--fa-hia.de"),
    ("a" * 63 + ".example", "a" * 63 + ".example"),
    (".".join(["a" * 63] * 3 + ["a" * 61]), ".".join(["a" * 63] * 3 + ["a" * 61])),  # 253 characters
    # IP addresses written canonically are hosts too; whether they may be reached is is_public's say.
    ("127.0.0.1", "127.0.0.1"),
    ("10.0.0.1", "10.0.0.1"),
    ("169.254.169.254", "169.254.169.254"),
    ("0.0.0.0", "0.0.0.0"),
    ("203.0.113.7", "203.0.113.7"),
    ("[::1]", "::1"),
    ("::1", "::1"),
    ("[2001:DB8:0:0::1]", "2001:db8::1"),
    ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
])
def test_ordinary_hostnames_and_canonical_addresses_are_kept_as_the_client_will_send_them(host, normalised):
    assert hosts.check_host(host) == normalised
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    assert URL(f"http://{bracketed}/").raw_host == normalised  # the same as aiohttp's view


@pytest.mark.parametrize(("url", "host"), [
    ("https://billing.example.com/webhooks", "billing.example.com"),
    ("https://Bücher.example:8443/x?y=1#z", "xn--bcher-kva.example"),
    ("http://[::1]:8080/", "::1"),
    ("http://127.0.0.1:8080/hook", "127.0.0.1"),
    ("http://user:pw@example.com/", "example.com"),  # credentials are DestinationSpec's business
    ("http://example.com:/", "example.com"),  # an empty port is the scheme's default
])
def test_url_host_gives_the_host_a_url_is_connected_to(url, host):
    assert hosts.url_host(url) == host


@pytest.mark.parametrize(("url", "words"), [
    ("http://１２７.０.０.１:8080/", "read as the address '127.0.0.1'"),
    ("http://127。0。0。1:8080/", "read as the address '127.0.0.1'"),
    ("http://１６９.２５４.１６９.２５４/latest/meta-data/", "read as the address '169.254.169.254'"),
    ("http://10。0。0。1/", "read as the address '10.0.0.1'"),
    ("http://2130706433:8080/", "looks like an IPv4 address"),
    ("http://0x7f000001/", "looks like an IPv4 address"),
    ("http://0/", "looks like an IPv4 address"),
    ("http://127.0.0.1:８０/", "port '８０'"),  # yarl would read full-width digits as port 80
    ("http://example.com:99999/", "port '99999'"),
    ("http://example.com:0/", "port '0'"),
    ("http://example.com:+80/", "port '+80'"),
    ("http://[::1/", "cannot be parsed"),
    ("http:///path", "no host"),
])
def test_url_host_refuses_what_check_host_refuses_and_bad_ports(url, words):
    with pytest.raises(HostRefused, match=re.escape(words)):
        hosts.url_host(url)


@pytest.mark.parametrize(("value", "default_port", "expected"), [
    ("kafka-1.example:9092", None, ("kafka-1.example", 9092)),
    ("[2001:db8::1]:9092", None, ("2001:db8::1", 9092)),
    ("smtp.example", 25, ("smtp.example", 25)),
    ("[::1]", 25, ("::1", 25)),
    ("10.0.0.1:9092", None, ("10.0.0.1", 9092)),  # well formed; is_public decides if it may be reached
])
def test_host_port_for_other_channels(value, default_port, expected):
    assert hosts.check_host_port(value, default_port=default_port) == expected


@pytest.mark.parametrize(("value", "words"), [
    ("kafka.example", "no port"),
    ("kafka.example:", "port ''"),
    ("kafka.example:65536", "port '65536'"),
    ("::1:9092", "in brackets"),
    ("[::1]9092", "expected ':port'"),
    ("[::1:9092", "without closing"),
    ("１２７.０.０.１:9092", "read as the address '127.0.0.1'"),
    ("0x7f000001:9092", "looks like an IPv4 address"),
])
def test_host_port_refusals(value, words):
    with pytest.raises(HostRefused, match=re.escape(words)):
        hosts.check_host_port(value)


def test_a_refusal_is_a_value_error_so_validators_report_it():
    assert issubclass(HostRefused, ValueError)


@pytest.mark.parametrize(("address", "public"), [
    ("8.8.8.8", True), ("203.0.114.1", True), ("2606:4700::1111", True), ("[2606:4700::1111]", True),
    ("2001:4860:4860::8888", True),
    ("127.0.0.1", False), ("127.255.255.254", False), ("10.0.0.1", False), ("10.1.2.3", False),
    ("172.16.0.1", False), ("192.168.0.1", False), ("169.254.169.254", False), ("100.64.0.1", False),
    ("0.0.0.0", False), ("255.255.255.255", False), ("224.0.0.1", False), ("240.0.0.1", False),
    ("::1", False), ("::", False), ("fe80::1", False), ("fe80::1%eth0", False), ("fc00::1", False),
    ("ff02::1", False), ("2001:db8::1", False),
    # IPv6 carrying an IPv4 address is judged by it
    ("::ffff:10.0.0.1", False), ("::ffff:169.254.169.254", False), ("::ffff:8.8.8.8", True),
    ("::127.0.0.1", False), ("2002:7f00:1::", False), ("2002:a9fe:a9fe::", False), ("2002:808:808::", True),
    ("64:ff9b::a00:1", False), ("64:ff9b::a9fe:a9fe", False), ("64:ff9b::808:808", True), ("64:ff9b:1::1", False),
    ("64:ff9b::c000:a", False), ("2002:c000:9::", False), ("::ffff:192.0.0.9", False),  # and by IANA's blocks
])
def test_is_public(address, public):
    assert hosts.is_public(address) is public


#: An address from every block of IANA's IPv4 and IPv6 special-purpose address registries (and
#: IPv4 multicast), written by hand from the registries. None may be reached, the blocks the
#: registries call globally reachable included (anycast services found on the local network).
REGISTRY = [
    "0.1.2.3", "0.0.0.0", "10.255.0.1", "100.127.255.254", "127.0.0.2", "169.254.0.1", "172.31.255.255",
    "192.0.0.100", "192.0.0.1", "192.0.0.8", "192.0.0.9", "192.0.0.10", "192.0.0.170", "192.0.0.171",
    "192.0.2.1", "192.31.196.1", "192.52.193.1", "192.88.99.1", "192.168.255.1", "192.175.48.1",
    "198.19.0.1", "198.51.100.1", "203.0.113.254", "239.255.255.250", "250.1.2.3", "255.255.255.255",
    "::1", "::", "::ffff:7f00:1", "64:ff9b:1::808:808", "100::1", "100:0:0:1::1", "2001:1ff::1",
    "2001:0:4136:e378::1", "2001:1::1", "2001:1::2", "2001:1::3", "2001:2::1", "2001:3::1", "2001:4:112::1",
    "2001:10::1", "2001:20::1", "2001:30::1", "2001:db8:ffff::1", "2002:c000:201::", "2620:4f:8000::1",
    "3fff::1", "3fff:fff::1", "5f00::1", "fd00::1", "febf::1",
]
#: Reserved by the IETF or otherwise outside 2000::/3, the only global unicast space; the SIIT
#: IPv4-translated form ::ffff:0:a.b.c.d reaches whatever a translator makes of it.
OUTSIDE_GLOBAL_UNICAST = ["::ffff:0:7f00:1", "[::ffff:0:7f00:1]", "::ffff:0:808:808", "::8.8.8.8", "::2",
                          "4000::1", "fec0::1", "ff0e::1", "1000::1", "e000::1"]


@pytest.mark.parametrize("address", REGISTRY)
def test_no_special_purpose_address_is_public(address):
    assert hosts.is_public(address) is False


def test_every_block_of_the_table_has_an_address_above():
    """A block added to SPECIAL_PURPOSE without an address of its own here would go untested."""
    def innermost(address: str) -> str:
        ip = ipaddress.ip_address(address)
        holding = [ipaddress.ip_network(block) for block, _ in hosts.SPECIAL_PURPOSE
                   if ip in ipaddress.ip_network(block)]
        return str(max(holding, key=lambda network: network.prefixlen))

    assert {innermost(a) for a in REGISTRY} == {block for block, _ in hosts.SPECIAL_PURPOSE}


@pytest.mark.parametrize("address", OUTSIDE_GLOBAL_UNICAST)
def test_ipv6_outside_global_unicast_is_not_public(address):
    assert hosts.is_public(address) is False


def test_is_public_takes_only_addresses():
    with pytest.raises(ValueError):
        hosts.is_public("localhost")
