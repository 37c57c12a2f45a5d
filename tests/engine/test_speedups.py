"""The C speed-ups (streams/engine/_speedups.c) against their definition, the
pure-Python stable JSON: the same bytes whenever they answer, and None (so the
Python path runs) for every input they could print differently."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.engine import hashing, stablejson
from streams.engine.stablejson import UNDEFINED, normalize_payload, python_stable_json

from streams.engine import _speedups as speedups

ROOT = Path(__file__).resolve().parents[2]

keys = st.text(max_size=8) | st.sampled_from(["\ue000", "\U0001f600", "\uffff", "a\u0000", 'q"', "é", "10", "9"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.sampled_from([2**53 - 1, -(2**53 - 1), 2**53, -(2**53), 10**16, 0])
    | st.text(max_size=40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.builds(lambda f: normalize_payload(f), st.floats(allow_nan=False, allow_infinity=False))
    | st.just(UNDEFINED)
)
json_like = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(json_like)
def test_answers_exactly_what_the_definition_gives_or_declines(value: Any) -> None:
    try:
        expected = python_stable_json(value)
    except (UnicodeEncodeError, msgspec.EncodeError, TypeError, ValueError):
        expected = None  # the definition refuses it: the C path must decline, not invent bytes
    fast = speedups.stable_json(value)
    assert fast is None or fast == expected
    digest = speedups.stable_digest(value)
    assert digest is None or digest == hashlib.sha256(expected).hexdigest()
    assert (fast is None) == (digest is None)


MARKED = (
    '<<<EXTERNAL_UNTRUSTED_CONTENT id="0123456789abcdef">>>x<<<END_EXTERNAL_UNTRUSTED_CONTENT id="0123456789abcdef">>>'
)


@settings(max_examples=400, deadline=None)
@given(json_like, st.booleans())
def test_outcome_digest_is_the_definitions_and_declines_every_marker(value: Any, marked: bool) -> None:
    """An outcome's digest: the C answer, where it gives one, is the Python
    definition's; a value holding a marker (in a key or a string) is declined,
    so its ids are made stable by the definition."""
    if marked:
        value = {MARKED: value, "text": [value, MARKED]}
    try:
        expected = hashing.python_outcome_digest(value)
    except (UnicodeEncodeError, msgspec.EncodeError, TypeError, ValueError):
        expected = None
    fast = speedups.outcome_digest(value)
    assert fast is None or fast == expected
    assert (fast is None) == (speedups.stable_digest(value) is None or marked)
    if expected is not None:
        assert hashing.outcome_digest(value) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
        | st.text(alphabet=st.characters(max_codepoint=0xDFFF, exclude_categories=["Cs"]), max_size=40),
        lambda inner: (
            st.lists(inner, max_size=5)
            | st.dictionaries(st.text(alphabet=st.characters(max_codepoint=0xD7FF), max_size=8), inner, max_size=6)
        ),
        max_leaves=30,
    )
)
def test_answers_every_ordinary_payload(value: Any) -> None:
    """What a decoded payload usually holds is never sent to the slow path."""
    assert speedups.stable_json(value) == python_stable_json(value)


@pytest.mark.parametrize(
    "value",
    [
        2**53,  # JavaScript rounds it
        -(2**60),
        1.5,  # a Python float, not the Raw the decoder makes
        {"\ue000": 1, "\U0001f600": 2},  # UTF-16 sorts these the other way round
        {"\U0001f600": 1},
        "\ud800",  # a lone surrogate has no UTF-8
        {1: "a"},  # keys a decoder never makes
        {"a": {"b": [1, 2, 3.0]}},
        bytearray(b"x"),
        msgspec.Raw,
    ],
    ids=repr,
)
def test_declines_what_it_could_print_differently(value: Any) -> None:
    assert speedups.stable_json(value) is None
    assert speedups.stable_digest(value) is None


def test_declines_nesting_beyond_its_depth() -> None:
    value: Any = 1
    for _ in range(600):
        value = [value]
    assert speedups.stable_json(value) is None


def test_escapes_and_sorting_at_every_width() -> None:
    text = 'plain "quoted" back\\slash \x00\x01\x1f\x7f\n\r\t\b\f é ż ✅ \U0001f600'
    value = {"é": text, "b": [text.encode("latin-1", "ignore").decode("latin-1")], "a": text * 40, "\x00": None}
    assert speedups.stable_json(value) == python_stable_json(value)
    assert speedups.stable_digest(value) == hashlib.sha256(python_stable_json(value)).hexdigest()


def test_engine_functions_use_the_speedups_and_fall_back() -> None:
    assert stablejson.stable_json is not stablejson.python_stable_json
    assert hashing.digest is not hashing.python_digest
    assert hashing.outcome_digest is not hashing.python_outcome_digest
    assert hashing.digest({"a": 2**60}) == hashing.python_digest({"a": 2**60})  # declined, then the Python path
    assert stablejson.stable_json({"\U0001f600": 1, "\uffff": 2}) == '{"\U0001f600":1,"\uffff":2}'.encode()


def test_sha256_comes_from_openssl_here() -> None:
    """On this kind of machine the extension links libcrypto; the hashlib build is
    the fallback for machines without OpenSSL's headers."""
    assert speedups.sha256 == "openssl"


def test_pure_python_path_passes_the_engine_suites() -> None:
    """The same tests with the C hashing and the compiled engine switched off: a
    machine without a C compiler gets the same hashes and verdicts."""
    env = dict(os.environ, LOOPWARDEN_NO_EXTENSIONS="1")
    suites = [
        "engine/test_stablejson.py",
        "engine/test_hashing.py",
        "engine/test_properties.py",
        "tools/test_replay_cli.py",
        "engine/test_engine.py",
        "engine/test_detectors.py",
        "engine/test_guard.py",
        "engine/test_warnings.py",
        "engine/test_spec7.py",
    ]
    assert (
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from streams.engine import MODE, stablejson; assert stablejson.speedups is None; assert MODE.startswith('Python sources')",
            ],
            env=env,
        ).returncode
        == 0
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *suites],
        cwd=Path(__file__).parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet=st.characters(max_codepoint=0xD7FF), max_size=6),
        st.integers(-(2**53 - 1), 2**53 - 1),
        min_size=17,
        max_size=60,
    )
)
def test_sorts_objects_with_many_keys(value: dict[str, int]) -> None:
    assert speedups.stable_json(value) == python_stable_json(value)
