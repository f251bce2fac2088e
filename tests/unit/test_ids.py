import uuid

import pytest

from outbox import InvalidInput
from outbox.ids import ACTION_ID, DESTINATION_ID, SCOPE, check, uuid7


def test_uuid7_is_version_7_and_rfc_variant():
    value = uuid.UUID(uuid7())
    assert value.version == 7
    assert value.variant == uuid.RFC_4122


def test_uuid7_sorts_by_creation_millisecond():
    import time

    first = uuid7()
    time.sleep(0.002)
    assert uuid7() > first


def test_generated_ids_are_valid_action_ids():
    assert check(ACTION_ID, uuid7(), "action_id")


@pytest.mark.parametrize("bad", ["", "a/b", "-lead", "a b", "x" * 201, "é"])
def test_malformed_action_ids_are_refused_with_the_pattern(bad):
    with pytest.raises(InvalidInput, match="action_id .* is malformed"):
        check(ACTION_ID, bad, "action_id")


def test_scopes_may_hold_slashes_but_destinations_are_lowercase_slugs():
    assert check(SCOPE, "acme/eu", "scope")
    with pytest.raises(InvalidInput):
        check(DESTINATION_ID, "Billing", "destination")
