"""``receivers.verify_signature`` against the reference ``standardwebhooks`` library and our own
sender's signatures: rotation, tampering, wrong secrets and the timestamp tolerance."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook

from receivers import InvalidSignature, verify_signature
from receivers.wire import sign

OLD = "whsec_" + base64.b64encode(bytes(range(32))).decode()
NEW = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()
OTHER = "whsec_" + base64.b64encode(b"\x07" * 24).decode()
NOW = 1_900_000_000
BODY = b'{"invoice":42,"note":"caf\xc3\xa9"}'
MSG = "invoice-42-send"


def reference_headers(secret: str, *, msg_id: str = MSG, at: int = NOW, body: bytes = BODY) -> dict[str, str]:
    """Headers as a Standard Webhooks sender using the reference library would send them."""
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(at, UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(at), "webhook-signature": signature}


def our_headers(*secrets: str, msg_id: str = MSG, at: int = NOW, body: bytes = BODY) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(at), "webhook-signature": sign(secrets, msg_id, at, body)}


def test_accepts_signatures_made_by_the_standardwebhooks_library() -> None:
    verify_signature(OLD, reference_headers(OLD), BODY, now=NOW)
    verify_signature([OLD], reference_headers(OLD), BODY, now=NOW)
    # a secret of 24 bytes too (the smallest the registry takes)
    verify_signature(OTHER, reference_headers(OTHER), BODY, now=NOW)


def test_accepts_signatures_made_by_our_sender_and_the_reference_agrees() -> None:
    headers = our_headers(OLD)
    verify_signature(OLD, headers, BODY, now=NOW)
    assert headers["webhook-signature"] == reference_headers(OLD)["webhook-signature"]
    # and the reference verifier accepts ours (its clock is the real one: sign for now)
    import time

    current = int(time.time())
    assert Webhook(OLD).verify(BODY, our_headers(OLD, at=current), json_parse=False) is None


def test_header_names_are_case_insensitive() -> None:
    headers = {name.title(): value for name, value in our_headers(OLD).items()}
    assert "Webhook-Signature" in headers
    verify_signature(OLD, headers, BODY, now=NOW)


def test_rotation_several_secrets_and_several_signatures() -> None:
    both = our_headers(NEW, OLD)  # the sender during a rotation: one signature per secret
    assert len(both["webhook-signature"].split()) == 2
    verify_signature([NEW, OLD], both, BODY, now=NOW)
    verify_signature([NEW], both, BODY, now=NOW)  # a receiver that already moved on
    verify_signature([OLD], both, BODY, now=NOW)  # a receiver that has not yet
    verify_signature([NEW, OLD], our_headers(OLD), BODY, now=NOW)  # a sender that has not yet
    verify_signature([OLD, NEW], reference_headers(NEW), BODY, now=NOW)
    # a garbage signature next to a good one does not spoil it; other versions are ignored
    mixed = dict(both, **{"webhook-signature": "v1,AAAA v1a,xyz " + reference_headers(NEW)["webhook-signature"]})
    verify_signature(NEW, mixed, BODY, now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature([OTHER], both, BODY, now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature([], both, BODY, now=NOW)


def test_a_tampered_body_id_or_timestamp_is_rejected() -> None:
    headers = our_headers(OLD)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, headers, BODY.replace(b"42", b"43"), now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, headers, BODY + b" ", now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, {**headers, "webhook-id": "invoice-43-send"}, BODY, now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, {**headers, "webhook-timestamp": str(NOW + 1)}, BODY, now=NOW)


def test_a_wrong_secret_is_rejected() -> None:
    with pytest.raises(InvalidSignature):
        verify_signature(OTHER, our_headers(OLD), BODY, now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature(NEW, reference_headers(OLD), BODY, now=NOW)


def test_a_timestamp_outside_the_tolerance_is_rejected() -> None:
    headers = our_headers(OLD)
    verify_signature(OLD, headers, BODY, now=NOW + 300)  # at the edge: accepted
    verify_signature(OLD, headers, BODY, now=NOW - 300)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, headers, BODY, now=NOW + 301)  # too old: a replayed capture
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, headers, BODY, now=NOW - 301)  # too far in the future
    verify_signature(OLD, headers, BODY, tolerance_seconds=10, now=NOW + 10)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, headers, BODY, tolerance_seconds=10, now=NOW + 10.5)


def test_missing_or_malformed_headers_are_rejected() -> None:
    headers = our_headers(OLD)
    for name in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        with pytest.raises(InvalidSignature):
            verify_signature(OLD, {k: v for k, v in headers.items() if k != name}, BODY, now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, {**headers, "webhook-timestamp": "soon"}, BODY, now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, {**headers, "webhook-signature": "v2," + headers["webhook-signature"][3:]},
                         BODY, now=NOW)
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, {**headers, "webhook-signature": ""}, BODY, now=NOW)


@pytest.mark.parametrize("offered", ["v1,\u00e9t\u00e9", "v1,AAAA v1,\u00ff"], ids=["latin-1", "after-a-valid-one"])
def test_a_signature_with_non_ascii_characters_is_invalid_not_a_crash(offered: str) -> None:
    """Servers hand header values over as latin-1 text (ASGI, WSGI), so any byte can arrive."""
    headers = {**our_headers(OLD), "webhook-signature": offered}
    with pytest.raises(InvalidSignature):
        verify_signature(OLD, headers, BODY, now=NOW)
