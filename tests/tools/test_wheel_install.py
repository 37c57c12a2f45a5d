"""The package as the Docker image gets it: the built wheel, installed into a
fresh virtual environment, run from a directory outside the checkout. The
broker commands must find the pom and the server template in the package, and
`up --demo` the sample trace."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from helpers import reference

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding only the wheel built from this checkout. Its
    dependencies are reached through a path entry to the test environment's
    site-packages, which loads none of that environment's `.pth` files (so not
    the editable install of the checkout either), rather than fetched again."""
    base = tmp_path_factory.mktemp("wheel")
    wheels = base / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("loopwarden-*.whl")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)]
    done = subprocess.run(pip, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return env_dir


def run(env_dir: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOOPWARDEN_KAFKA_HOME", "LOOPWARDEN_CONFIG")}
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def test_commands_run_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    loopwarden = str(installed / "bin" / "loopwarden")
    for command in (["broker", "install", "--help"], ["up", "--help"], ["broker", "start", "--help"]):
        done = run(installed, tmp_path, loopwarden, *command)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout.startswith("usage: loopwarden"), done.stdout


def test_broker_data_comes_from_the_package(installed: Path, tmp_path: Path) -> None:
    code = "import streams.tools.broker as b; print(b.POM); print(b.TEMPLATE.is_file()); print(b.kafka_version())"
    done = run(installed, tmp_path, str(installed / "bin" / "python"), "-c", code)
    assert done.returncode == 0, done.stderr
    pom, template_found, version = done.stdout.split()
    assert Path(pom).is_relative_to(installed) and not Path(pom).is_relative_to(ROOT), pom
    assert template_found == "True"
    assert (
        version
        == (ROOT / "streams" / "tools" / "kafka" / "pom.xml").read_text().split("<kafka.version>")[1].split("<")[0]
    )


def test_a_broker_starts_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    """`broker install` resolves the pom from the package (the jars are already
    cached by the test session) and `broker start` fills in the packaged template."""
    loopwarden = str(installed / "bin" / "loopwarden")
    lib = run(installed, tmp_path, loopwarden, "broker", "install")
    assert lib.returncode == 0, lib.stderr
    assert any(Path(lib.stdout.strip()).glob("kafka_*.jar"))
    data = tmp_path / "kafka"
    started = run(installed, tmp_path, loopwarden, "broker", "start", "--data-dir", str(data))
    assert started.returncode == 0, started.stderr
    try:
        assert started.stdout.strip().startswith("127.0.0.1:")
        assert "listeners=PLAINTEXT://127.0.0.1:" in (data / "server.properties").read_text()
        status = run(installed, tmp_path, loopwarden, "broker", "status", "--data-dir", str(data))
        assert status.returncode == 0 and status.stdout.strip().endswith(f" {started.stdout.strip()} up")
    finally:
        stopped = run(installed, tmp_path, loopwarden, "broker", "stop", "--data-dir", str(data))
    assert stopped.returncode == 0, stopped.stderr


def test_the_demo_runs_from_the_wheel(installed: Path, tmp_path: Path, broker) -> None:
    """`up --demo` with no file publishes the sample trace the wheel carries
    (a file of its own, the checkout's examples/sample-trace.jsonl), and every
    verdict replay gives for it arrives."""
    loopwarden = str(installed / "bin" / "loopwarden")
    done = run(installed, tmp_path, loopwarden, "up", "--bootstrap", broker.bootstrap, "--demo", timeout=240)
    assert done.returncode == 0, done.stderr
    sample = ROOT / "examples" / "sample-trace.jsonl"
    (packaged,) = installed.glob("lib/python*/site-packages/streams/tools/sample-trace.jsonl")
    assert not packaged.is_symlink() and packaged.read_bytes() == sample.read_bytes()
    assert f"events of {packaged}" in done.stderr
    expected = reference(sample.read_bytes().splitlines(), None)
    assert f"all {len(expected)} verdicts arrived" in done.stderr
    assert len(done.stdout.splitlines()) == len(expected)
