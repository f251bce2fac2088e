import pytest

from outbox import InvalidInput, canonical_json, payload_digest


def test_key_order_and_whitespace_do_not_change_the_digest():
    assert payload_digest({"b": 1, "a": [1, 2]}) == payload_digest({"a": [1, 2], "b": 1})


def test_digest_is_sha256_of_rfc8785_bytes():
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    assert payload_digest({}) == "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def test_dropping_a_null_field_changes_the_digest():
    assert payload_digest({"a": 1, "b": None}) != payload_digest({"a": 1})


def test_a_string_and_a_number_differ():
    assert payload_digest({"a": 1}) != payload_digest({"a": "1"})


def test_integers_outside_i_json_are_refused_with_advice():
    with pytest.raises(InvalidInput, match="I-JSON.*string"):
        canonical_json({"id": 2**60})


def test_nan_is_refused():
    with pytest.raises(InvalidInput, match="NaN"):
        canonical_json({"x": float("nan")})
