"""Whether this process runs the C and mypyc-compiled parts at all: the
engine's compiled modules and `_speedups`, and the event decoder's `_scan`.
Each is optional (an install without a C compiler lacks them) and gives the
same results as its Python definition; only the speed differs."""

from __future__ import annotations

import os

EXTENSIONS_OFF = bool(os.environ.get("LOOPWARDEN_NO_EXTENSIONS"))
"""`LOOPWARDEN_NO_EXTENSIONS=1`: run the Python definitions alone (to compare
with, or debug, the Python path)."""
