"""Builds the optional compiled parts (the engine's and the event decoder's); everything else is declared in pyproject.toml.

- `streams/engine/_speedups.c`: stable JSON and its sha256 in one C call. It
  links OpenSSL's libcrypto where its headers are installed, and otherwise
  calls hashlib.
- `schemas/_scan.c`: the event decoder's depth bound, counted in one pass.
- The per-event engine modules (`COMPILED`), compiled by mypyc from the same
  Python sources. The sha256 of each compiled source is recorded in
  `streams/engine/compiled.json`, so that a build older than its source is
  never run (see `streams/engine/compiled.py`).

Where no C compiler is available, the build carries on without them and the
engine runs on its Python sources, with the same verdicts.
"""

import hashlib
import json
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SPEEDUPS = "streams.engine._speedups"
ENGINE = Path("streams/engine")
COMPILED = ("engine", "detectors", "hashing", "guard", "warnings")


def compiled_engine() -> list[Extension]:
    """mypyc's extensions for the engine, or none where mypyc is missing."""
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("mypyc is not installed: the engine will run on its Python sources")
        return []
    extensions = mypycify([str(ENGINE / f"{name}.py") for name in COMPILED], group_name="loopwarden_engine")
    for extension in extensions:
        extension.optional = True
    return extensions


class BuildExtensions(build_ext):
    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - any compiler or linker failure
            if ext.define_macros != [("LW_OPENSSL", "1")]:
                raise
            self.warn(f"{ext.name}: building without OpenSSL ({exc}); sha256 will come from hashlib")
            ext.define_macros, ext.libraries = [], []
            super().build_extension(ext)

    def run(self) -> None:
        super().run()
        built = {name: hashlib.sha256((ENGINE / f"{name}.py").read_bytes()).hexdigest() for name in COMPILED}
        target = Path(self.get_ext_fullpath("streams.engine.engine")).parent / "compiled.json"
        if all(Path(self.get_ext_fullpath(f"streams.engine.{name}")).exists() for name in COMPILED):
            target.write_text(json.dumps(built, indent=1, sort_keys=True) + "\n")
        elif target.exists():
            target.unlink()  # a record from an older build must not vouch for modules this one lacks


setup(
    ext_modules=[
        Extension(
            SPEEDUPS,
            sources=["streams/engine/_speedups.c"],
            define_macros=[("LW_OPENSSL", "1")],
            libraries=["crypto"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension("schemas._scan", sources=["schemas/_scan.c"], extra_compile_args=["-O2"], optional=True),
        *compiled_engine(),
    ],
    cmdclass={"build_ext": BuildExtensions},
)
