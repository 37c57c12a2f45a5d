"""Stable JSON: keys sorted (by UTF-16 code units, as JavaScript sorts), compact,
numbers spelled as JavaScript prints them, strings escaped as JSON.stringify
escapes them. Expected values below were checked against JavaScript."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import sjson
from schemas.jsnumbers import FLOAT_HOOK, js_number
from streams.engine.stablejson import UNDEFINED, decode_payload, normalize_payload, stable_json


def test_keys_sorted_compact():
    assert stable_json({"b": 1, "a": "x", "c": None}) == b'{"a":"x","b":1,"c":null}'


def test_key_order_never_matters_nested():
    one = {"b": {"d": 1, "c": [{"z": 1, "y": {"q": 2, "p": 3}}]}, "a": [3, 1, 2]}
    two = {"a": [3, 1, 2], "b": {"c": [{"y": {"p": 3, "q": 2}, "z": 1}], "d": 1}}
    assert stable_json(one) == stable_json(two)
    assert stable_json(one) == b'{"a":[3,1,2],"b":{"c":[{"y":{"p":3,"q":2},"z":1}],"d":1}}'


def test_arrays_keep_their_order():
    assert stable_json([3, 1, 2]) != stable_json([1, 2, 3])
    assert stable_json([{"b": 1, "a": 2}]) == b'[{"a":2,"b":1}]'


def test_matches_independent_serialisation_for_plain_values():
    value = {"z": "ż ó ł", "a": {"k": [1, "two", True, None, {"y": False, "x": -5}]}, "m": ""}
    assert stable_json(value) == sjson(value).encode("utf-8")


def test_keys_sorted_by_utf16_code_units_like_javascript():
    # JavaScript sorts "\U0001F600" (surrogates D83D DE00) before "\uffff".
    value = {"\uffff": 1, "\U0001f600": 2, "a": 3, "B": 4, "é": 5, "10": 6, "9": 7}
    expected = '{"10":6,"9":7,"B":4,"a":3,"é":5,"\U0001f600":2,"\uffff":1}'
    assert stable_json(value) == expected.encode("utf-8")


def test_non_ascii_not_escaped_and_js_escapes_for_controls():
    value = '\u2028\x7f\x01/\b\f\n\r\t"\\\x1f ąę'
    expected = '"\u2028\x7f\\u0001/\\b\\f\\n\\r\\t\\"\\\\\\u001f ąę"'
    assert stable_json(value) == expected.encode("utf-8")


@pytest.mark.parametrize(
    ("text", "js"),
    [
        ("1.0", "1"),
        ("100.0", "100"),
        ("1E2", "100"),
        ("-0.0", "0"),
        ("0.1", "0.1"),
        ("1e-7", "1e-7"),
        ("1.5e-7", "1.5e-7"),
        ("-2.5e-10", "-2.5e-10"),
        ("0.000001", "0.000001"),
        ("1e20", "100000000000000000000"),
        ("1e21", "1e+21"),
        ("123456789012345678901234.5", "1.2345678901234569e+23"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("5e-324", "5e-324"),
        ("12345678901234567890", "12345678901234567000"),
        ("9007199254740993", "9007199254740992"),
        ("-9007199254740993", "-9007199254740992"),
        ("[1.10, 2.50e3]", "[1.1,2500]"),
    ],
)
def test_decoded_numbers_spelled_as_javascript(text, js):
    assert stable_json(decode_payload(text.encode())) == js.encode()


@pytest.mark.parametrize(
    ("text", "js"), [("1e400", '"Infinity"'), ("-1e400", '"-Infinity"'), ("[1e400]", '["Infinity"]')]
)
def test_overflowing_numbers_spelled_as_strings(text, js):
    # JSON.parse("1e400") is Infinity; the gateway's stable stringify writes a
    # non-finite number as the string of its name (not JSON.stringify's null).
    assert stable_json(decode_payload(text.encode())) == js.encode()


@pytest.mark.parametrize(
    ("value", "js"),
    [
        (1.0, "1"),
        (1e-7, "1e-7"),
        (1e21, "1e+21"),
        (0.5, "0.5"),
        (-0.0, "0"),
        (123456789.0, "123456789"),
        (1e16, "10000000000000000"),
    ],
)
def test_js_number(value, js):
    assert js_number(value) == js


def test_python_floats_must_be_normalised_first():
    """The engine's payloads come through the codec; Python values go through
    normalize_payload, which gives the JavaScript spelling."""
    assert stable_json(normalize_payload({"n": 1.0, "\U0001f600": 1, "\ue000": 2})) == (
        '{"n":1,"\U0001f600":1,"\ue000":2}'.encode("utf-8")
    )


def test_normalize_payload_gives_js_spelling():
    assert stable_json(normalize_payload({"x": 1.0, "y": [2.5, 3]})) == b'{"x":1,"y":[2.5,3]}'


def test_integer_and_float_that_are_equal_hash_alike():
    assert stable_json(decode_payload(b'{"n": 1.0}')) == stable_json(decode_payload(b'{"n": 1}'))


def test_big_integers_exact_path_keeps_key_order():
    assert stable_json({"b": 2**64, "a": 1}) == b'{"a":1,"b":18446744073709552000}'


def test_undefined_token():
    assert stable_json(UNDEFINED) == b"undefined"


# Every JSON float literal: sign, integer part, fraction, exponent, in all lengths.
_float_literals = st.from_regex(
    r"\A-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?\Z", fullmatch=True
).filter(lambda text: "." in text or "e" in text.lower())


@settings(max_examples=1000, deadline=None)
@given(_float_literals)
def test_float_literals_spelled_as_javascript_prints_their_value(text):
    """The hook passes the usual literal through unchanged; whatever it passes
    must be exactly JavaScript's spelling of the value."""
    value = float(text)
    expected = js_number(value) if math.isfinite(value) else f'"{js_number(value)}"'
    assert bytes(FLOAT_HOOK(text)).decode() == expected


@pytest.mark.parametrize(
    ("text", "js"),
    [
        ("0.0001", "0.0001"),
        ("0.00001", "0.00001"),
        ("0.0000001", "1e-7"),
        ("1.50", "1.5"),
        ("-0.0", "0"),
        ("-0.5", "-0.5"),
        ("123456789012345.6", "123456789012345.6"),
        ("12345678901234.56", "12345678901234.56"),
        ("0.30000000000000001", "0.3"),
        ("1.0000000000000001", "1"),
        ("9007199254740993.0", "9007199254740992"),
        ("1E2", "100"),
        ("1e21", "1e+21"),
        ("1e999", '"Infinity"'),
    ],
)
def test_float_literal_edges(text, js):
    assert bytes(FLOAT_HOOK(text)).decode() == js
    assert stable_json(decode_payload(f"[{text}]".encode())) == f"[{js}]".encode()


def test_byte_checks_see_astral_and_private_use_characters_in_values_too():
    # not keys: the exact path then runs for nothing, and must print the same
    value = {"b": "\ue000", "a": "\U0001f600", "c": [1, 2**60]}
    assert stable_json(value) == '{"a":"\U0001f600","b":"\ue000","c":[1,1152921504606847000]}'.encode()
    assert msgspec.json.encode(value, order="sorted") != stable_json(value)
