import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox import InvalidInput, canonical_json, payload_digest
from outbox.digest import MAX_NESTING


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


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53) - 2, max_value=2**53 + 2)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20)


@settings(max_examples=2000, deadline=None)
@given(json_values)
def test_canonical_json_is_rfc8785s_bytes_or_its_refusal_for_every_value(value):
    """The fast path (the standard library's encoder) writes what rfc8785 writes, for keys of any
    script, escapes, integers at the I-JSON edge and floats; what rfc8785 refuses is refused."""
    try:
        expected = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError):
        with pytest.raises(InvalidInput):
            canonical_json(value)
    else:
        assert canonical_json(value) == expected


@pytest.mark.parametrize("value", [{"k": "\ud800"}, ["\udfff"], {"\ud800": 1}])
def test_a_lone_surrogate_is_refused_on_either_path(value):
    with pytest.raises(InvalidInput, match="surrogate|canonicalizable"):
        canonical_json(value)


def nested(depth: int, leaf: object) -> object:
    value = leaf
    for n in range(depth):
        value = [value] if n % 2 else {"k": value}
    return value


@pytest.mark.parametrize("leaf", [1, 1.5, "x"])
def test_the_nesting_limit_is_the_same_on_either_path(leaf):
    assert canonical_json(nested(MAX_NESTING, leaf)) == rfc8785.dumps(nested(MAX_NESTING, leaf))
    with pytest.raises(InvalidInput, match="deeper than"):
        canonical_json(nested(MAX_NESTING + 1, leaf))
