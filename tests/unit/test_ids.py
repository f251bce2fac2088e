import uuid

import pytest

from outbox import InvalidInput
from outbox.ids import ACTION_ID, DESTINATION_ID, SCOPE, TOKEN_LABEL, check, intent_key, uuid7


def test_uuid7_is_version_7_and_rfc_variant():
    for _ in range(1000):
        text = uuid7()
        value = uuid.UUID(text)
        assert value.version == 7
        assert value.variant == uuid.RFC_4122
        assert str(value) == text  # the canonical form: lower-case hex, dashed 8-4-4-4-12


def test_uuid7_sorts_by_creation_millisecond():
    import time

    first = uuid7()
    time.sleep(0.002)
    assert uuid7() > first


def test_generated_ids_are_valid_action_ids():
    assert check(ACTION_ID, uuid7(), "action_id")


@pytest.mark.parametrize("bad", ["", "a/b", "-lead", "a b", "x" * 201, "é", "nl-1\n", "nl-1\r\n"])
def test_malformed_action_ids_are_refused_with_the_pattern(bad):
    with pytest.raises(InvalidInput, match="action_id .* is malformed"):
        check(ACTION_ID, bad, "action_id")


def test_scopes_may_hold_slashes_but_destinations_are_lowercase_slugs():
    assert check(SCOPE, "acme/eu", "scope")
    with pytest.raises(InvalidInput):
        check(DESTINATION_ID, "Billing", "destination")


@pytest.mark.parametrize(("pattern", "what"), [(SCOPE, "scope"), (DESTINATION_ID, "destination"),
                                               (TOKEN_LABEL, "label")])
def test_a_trailing_newline_never_passes_an_id_check(pattern, what):
    with pytest.raises(InvalidInput, match="malformed"):
        check(pattern, "ok-1\n", what)


def test_the_message_names_the_length_limit():
    with pytest.raises(InvalidInput, match="1-200 characters"):
        check(ACTION_ID, "", "action_id")
    with pytest.raises(InvalidInput, match="1-200 characters"):
        check(TOKEN_LABEL, "", "label")


def test_an_intent_key_splits_at_its_last_slash():
    key = intent_key("acme/eu", "order-1")
    assert key == "acme/eu/order-1"
    assert key.rpartition("/") == ("acme/eu", "/", "order-1")
