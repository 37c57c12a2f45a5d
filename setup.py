"""Builds the optional C speed-ups of the engine's hashing (streams/engine/_speedups.c).

Everything else is declared in pyproject.toml. The extension links OpenSSL's
libcrypto for sha256 where its headers are installed, and otherwise calls
hashlib; where no C compiler is available at all, the build carries on without
it and the engine runs on its pure-Python path, with the same verdicts.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SPEEDUPS = "streams.engine._speedups"


class BuildSpeedups(build_ext):
    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - any compiler or linker failure
            if ext.define_macros != [("LW_OPENSSL", "1")]:
                raise
            self.warn(f"{ext.name}: building without OpenSSL ({exc}); sha256 will come from hashlib")
            ext.define_macros, ext.libraries = [], []
            super().build_extension(ext)


setup(
    ext_modules=[
        Extension(
            SPEEDUPS,
            sources=["streams/engine/_speedups.c"],
            define_macros=[("LW_OPENSSL", "1")],
            libraries=["crypto"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildSpeedups},
)
