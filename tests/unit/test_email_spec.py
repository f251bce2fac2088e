"""What an email destination and an email payload must be, refused with the field named."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from outbox import OnUnknown
from sender.email import EmailPayload, EmailSpec, check_payload, message_id
from sender.email.message import WIRE, _body, _single

SPEC = {"channel": "email", "host": "smtp.example.com", "from": "Billing <billing@example.com>"}
MAIL = {"to": ["ann@example.org"], "text": "hi"}


def refused(spec: dict) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as error:
        EmailSpec.model_validate(spec)
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in error.value.errors()]


def test_defaults_are_starttls_on_587_and_an_unknown_waits_for_an_operator():
    spec = EmailSpec.model_validate(SPEC)
    assert (spec.port, spec.tls, spec.on_unknown) == (587, "starttls", OnUnknown.NEVER)
    assert spec.settings() == {"host": "smtp.example.com", "port": 587, "tls": "starttls", "allow_insecure": False,
                               "username": None, "from": "Billing <billing@example.com>", "reply_to": None,
                               "headers": {}, "data_timeout_seconds": 600.0, "connections": 4}


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"tls": "none"}, "", "set allow_insecure"),
    ({"reconcile": True}, "", "cannot answer the reconcile probe"),
    ({"host": "10.0.0.1"}, "", "not a public address"),
    ({"host": "１２７.０.０.１"}, "host", "read as the address '127.0.0.1'"),
    ({"host": "0x7f000001"}, "host", "looks like an IPv4 address"),
    ({"from": "billing"}, "from", "is not an email address"),
    ({"from": "a@example.com\r\nBcc: x@evil.example"}, "from", "is not an email address"),
    ({"headers": {"Message-ID": "<x@y>"}}, "headers", "set by the outbox"),
    ({"headers": {"X-A": "1\r\nBcc: x@evil.example"}}, "headers", "line break"),
    ({"port": 0}, "port", "greater than or equal to 1"),
    ({"tls": "maybe"}, "tls", "'starttls', 'implicit' or 'none'"),
    ({"url": "https://x.example/"}, "url", "Extra inputs"),
])
def test_a_destination_that_could_not_be_sent_to_safely_is_refused(change, field, words):
    [(where, message)] = refused({**SPEC, **change})
    assert where == field and words in message, message


@pytest.mark.parametrize("host", ["::ffff:0:7f00:1", "192.0.0.9", "198.18.0.1", "3fff::1", "5f00::1", "100:0:0:1::1"])
def test_a_special_purpose_address_needs_allow_private_network(host):
    """IANA's special-purpose blocks beyond the private ranges, and the SIIT form of 127.0.0.1."""
    [(where, message)] = refused({**SPEC, "host": host})
    assert where == "" and "not a public address" in message, message
    assert EmailSpec.model_validate({**SPEC, "host": host, "allow_private_network": True}).allow_private_network


def test_a_private_server_and_the_clear_are_allowed_when_said():
    spec = EmailSpec.model_validate({**SPEC, "host": "127.0.0.1", "tls": "none", "allow_insecure": True,
                                     "allow_private_network": True})
    assert (spec.host, spec.tls) == ("127.0.0.1", "none")


@pytest.mark.parametrize(("payload", "words"), [
    ({"text": "hi"}, "to: Field required"),
    ({"to": [], "text": "hi"}, "to: List should have at least 1 item"),
    ({"to": ["ann"], "text": "hi"}, "to.0: 'ann' is not an email address"),
    ({"to": ["ann@example.org"]}, "payload: give text or html"),
    ({**MAIL, "cc": [f"p{i}@example.org" for i in range(50)]}, "at most 50 recipients"),
    ({**MAIL, "subject": "Hi\r\nBcc: x@evil.example"}, "subject: String should match pattern"),
    ({**MAIL, "headers": {"From": "ceo@example.com"}}, "headers: header 'From' is set by the outbox"),
    ({**MAIL, "headers": {"Outbox-Fence": "9"}}, "headers: header 'Outbox-Fence' is set by the outbox"),
    ({**MAIL, "headers": {"Resent-From": "ceo@example.com"}}, "headers: header 'Resent-From' is set by the outbox"),
    ({**MAIL, "headers": {"DKIM-Signature": "v=1"}}, "headers: header 'DKIM-Signature' is set by the outbox"),
    ({**MAIL, "headers": {"Authentication-Results": "pass"}}, "header 'Authentication-Results' is set by the"),
    ({**MAIL, "headers": {"Content-Disposition": "inline"}}, "header 'Content-Disposition' is set by the outbox"),
    ({**MAIL, "headers": {"Bad Name": "x"}}, "headers: header name 'Bad Name'"),
    ({**MAIL, "attachments": [{"filename": "a.pdf", "content": "not base64!"}]},
     "attachments.0.content: content must be base64"),
    ({**MAIL, "attachments": [{"filename": "../a", "content": ""}]}, "attachments.0.filename"),
    ({**MAIL, "colour": "red"}, "colour: Extra inputs"),
    ([1, 2], "payload: Input should be a valid dictionary"),
])
def test_a_payload_is_refused_with_its_field_named(payload, words):
    with pytest.raises(ValueError) as error:
        check_payload(payload)
    assert words in str(error.value), str(error.value)


def test_a_full_payload_passes():
    check_payload({**MAIL, "to": ["Ann Example <ann@example.org>"], "cc": ["b@example.org"], "bcc": ["c@example.net"],
                   "subject": "Receipt", "html": "<p>hi</p>", "headers": {"X-Order": "42"},
                   "attachments": [{"filename": "r.pdf", "content_type": "application/pdf",
                                    "content": base64.b64encode(b"pdf").decode()}]})


@pytest.mark.parametrize(("key", "expected"), [
    ("acme/inv-42", "<acme/inv-42@example.com>"),
    ("acme:eu/inv.42", "<acme=3Aeu/inv.42@example.com>"),
    ("t@x/a..b.", "<t=40x/a=2E.b=2E@example.com>"),
])
def test_the_message_id_is_the_intent_key_as_a_dot_atom_at_the_senders_domain(key, expected):
    assert message_id(key, "Billing <billing@example.com>") == expected


#: Bodies as a payload may hold them: any line ends, lines opening with "From " or ".", long
#: lines, text beyond ASCII (none of which may be written as it is).
BODIES = st.lists(st.sampled_from(["a", "From me", ".", " ", "\t", "\r", "\n", "\r\n", "x" * 500, "é", "\x00"]),
                  max_size=12).map("".join)


@given(text=BODIES, subtype=st.sampled_from(["text", "html"]))
def test_a_message_of_one_plain_body_is_written_as_the_email_package_writes_it(text: str, subtype: str):
    payload = EmailPayload.model_validate({"to": ["ann@example.org"], "subject": "s", subtype: text})
    written = _single(payload)
    if written is not None:
        assert written == _body(payload).as_bytes(policy=WIRE)
    else:  # only a body that is not plain ASCII in lines SMTP carries is left to the email package
        assert not text.isascii() or any(len(line) > 998 for line in text.replace("\r", "\n").split("\n"))


def test_messages_of_several_parts_are_left_to_the_email_package():
    for extra in ({"html": "<p>hi</p>"}, {"attachments": [{"filename": "a.txt", "content_type": "text/plain",
                                                          "content": base64.b64encode(b"x").decode()}]}):
        assert _single(EmailPayload.model_validate({**MAIL, "subject": "s", **extra})) is None
