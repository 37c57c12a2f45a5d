"""The mypyc-compiled engine: it runs where it was built from the sources beside
it, the sources run otherwise, and both give the same verdicts byte for byte."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import streams.engine
from bench.fleet_trace import generate_lines
from builders import run_cli
from streams.engine import compiled

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-trace.jsonl"
CONFIG = ROOT / "bench" / "fleet-config.json"
PROBE = "import streams.engine, streams.engine.detectors as d; print(streams.engine.MODE); print(d.__file__)"


def _probe(tree: Path, **env: str) -> tuple[str, str]:
    """(MODE, the file detectors was loaded from) in a fresh interpreter importing `tree`."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    mode, loaded = done.stdout.splitlines()
    return mode, loaded


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the installed build (packages, compiled modules, record) to tamper with."""
    for package in ("streams", "schemas"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    for runtime in ROOT.glob("loopwarden_engine__mypyc*"):
        shutil.copy(runtime, tmp_path)
    return tmp_path


def test_this_build_runs_the_compiled_engine() -> None:
    """Where a compiler is available (as here) the install compiles the engine and uses it."""
    assert streams.engine.MODE == "compiled (mypyc)"
    assert compiled.shadowed() == {"engine", "detectors", "hashing", "guard", "warnings"}
    assert not hasattr(streams.engine.apply, "__code__")  # a compiled function, not Python bytecode


def test_a_source_edited_after_the_build_runs_instead_of_the_stale_build(tree: Path) -> None:
    assert _probe(tree)[0] == "compiled (mypyc)"
    source = tree / "streams" / "engine" / "detectors.py"
    source.write_text(source.read_text() + "\n# edited after the build\n")
    mode, loaded = _probe(tree)
    assert mode == "Python sources: compiled from older sources (detectors.py changed since): reinstall to recompile"
    assert loaded == str(source)


def test_a_build_without_its_record_is_not_trusted(tree: Path) -> None:
    (tree / "streams" / "engine" / "compiled.json").unlink()
    mode, loaded = _probe(tree)
    assert mode.startswith("Python sources: no record of what was compiled (compiled.json:")
    assert loaded.endswith("detectors.py")


def test_the_sources_can_be_asked_for(tree: Path) -> None:
    mode, loaded = _probe(tree, LOOPWARDEN_NO_EXTENSIONS="1")
    assert mode == "Python sources: LOOPWARDEN_NO_EXTENSIONS is set"
    assert loaded.endswith("detectors.py")


def _replay(events: Path, **env: str) -> bytes:
    done = run_cli("--config", str(CONFIG), str(events), **env)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("hashes", ["raw", "precomputed"])
def test_compiled_and_source_engines_give_the_same_verdicts(tmp_path: Path, hashes: str) -> None:
    events = tmp_path / "fleet.jsonl"
    events.write_bytes(b"".join(generate_lines(300, 20_000, seed=7, hashes=hashes)) + SAMPLE.read_bytes())
    compiled_out = _replay(events)
    for decision in (b"allow", b"warn", b"block", b"abort"):
        assert b'"decision":"%s"' % decision in compiled_out
    assert _replay(events, LOOPWARDEN_NO_EXTENSIONS="1") == compiled_out
