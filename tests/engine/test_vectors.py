"""The golden vectors for local hashing (tests/vectors/hashing.json) are what the
engine computes today: regenerate them with `python -m tests.vectors.generate`
after a change to hashing. The OpenClaw plugin's tests check its hashing
against the same file."""

from __future__ import annotations

import json

from tests.vectors.generate import CASES, OUT, render


def test_committed_vectors_equal_a_fresh_generation():
    assert OUT.read_text(encoding="utf-8") == render(), "stale: run python -m tests.vectors.generate"


def test_every_case_has_a_unique_name_and_an_args_hash():
    cases = json.loads(OUT.read_text(encoding="utf-8"))["cases"]
    assert len({case["name"] for case in cases}) == len(cases) == len(CASES)
    assert all(case["expected"]["args_hash"].startswith(case["tool"] + ":") for case in cases)


def test_reordered_keys_hash_alike_and_a_veto_has_no_hash():
    by_name = {case["name"]: case["expected"] for case in json.loads(OUT.read_text(encoding="utf-8"))["cases"]}
    assert (
        by_name["key order does not matter"]["args_hash"]
        == by_name["key order does not matter (same args reordered)"]["args_hash"]
    )
    assert by_name["loop-guard veto has no hash"]["result_hash"] is None
    assert by_name["another guard's veto is hashed"]["result_hash"] is not None
    assert by_name["unknown tool: pattern 1"]["unknown_tool_name"] == "frobnicate.v2"
