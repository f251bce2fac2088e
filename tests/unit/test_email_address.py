"""The addresses an email payload or destination may give, as the email package's RFC 5322 parser
reads them, less what the outbox cannot send or what could change the message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sender.email import mailbox


@pytest.mark.parametrize(("value", "read"), [
    ("ann@example.org", ("", "ann@example.org")),
    ("Ann <ann@example.org>", ("Ann", "ann@example.org")),
    ("Ann<ann@example.org>", ("Ann", "ann@example.org")),
    ("<ann@example.org>", ("", "ann@example.org")),
    ('"Doe, Jane" <jane@example.org>', ("Doe, Jane", "jane@example.org")),
    ('"a \\"b\\"" <a@example.org>', ('a "b"', "a@example.org")),
    ("José Pérez <jose@example.org>", ("José Pérez", "jose@example.org")),
    ("Dr. Who <who@example.org>", ("Dr. Who", "who@example.org")),  # obsolete, but RFC 5322 says read it
    ("O'Brien <ob@example.org>", ("O'Brien", "ob@example.org")),
    ("a+tag/x=y@mail.example.co.uk", ("", "a+tag/x=y@mail.example.co.uk")),
    ("a@xn--bcher-kva.example", ("", "a@xn--bcher-kva.example")),
])
def test_an_address_is_read_as_its_name_and_address(value, read):
    assert mailbox(value) == read


@pytest.mark.parametrize("value", [
    "ann", "not an address", "", "@example.org", "ann@",
    # a header injection, in the address, the name, or hidden in an encoded word
    "a@example.com\r\nBcc: x@evil.example", "Ann\r\n <a@example.org>", "Ann <a@example.org>\n",
    "=?utf-8?q?=0D=0ABcc:_x@evil.example?= <a@example.org>", "Ann\x00 <a@example.org>", "a\tb <a@example.org>",
    # more than one address, or a group
    "a@example.com, b@example.com", "Doe, Jane <jane@example.org>", "team: a@example.com;",
    # an address written with comments, spaces or a route inside it, or something after it
    "a@example.com (work)", "a @ example.com", "Ann < a@example.org >", "<@relay.example:a@example.org>",
    " a@example.org", "Ann <a@example.org> x", "Ann <a@example.org", "Ann <<a@example.org>>",
    # what SMTP without SMTPUTF8 cannot carry, or a domain that is not a host name
    '"a b"@example.com', "a..b@example.com", ".a@example.com", "a.@example.com", "jösé@example.org",
    "a@exämple.org", "a@localhost", "a@[192.0.2.1]", "a@192.0.2.1", "a@example.", "a@-x.example", "a@b_c.example",
    "x" * 250 + "@example.com", "N" * 201 + " <a@example.org>",
])
def test_what_the_outbox_cannot_send_as_written_is_not_an_address(value):
    with pytest.raises(ValueError, match="is not an email address"):
        mailbox(value)


#: Pieces of text the parser reads specially: its delimiters, line breaks, and encoded words.
PIECES = st.sampled_from([*'ab@.<>"\\(),:;[] =?é\r\n\t', "=?utf-8?q?", "=?utf-8?b?", "?=", "=0D", "DQo=",
                          "x@y.example"])


@given(st.lists(PIECES, max_size=16).map("".join))
def test_any_text_is_read_or_refused_as_not_an_address(value: str):
    """The email package's parser raises IndexError, AttributeError and the like on some malformed
    text (a lone ``"``): never past ``mailbox``, which says the text is not an address."""
    try:
        name, address = mailbox(value)
    except ValueError as exc:
        assert "is not an email address" in str(exc)
    else:
        assert address.isascii() and "\r" not in name and "\n" not in name
