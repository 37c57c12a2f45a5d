"""The pure loop-detection engine: no Kafka, no clock, no globals.

`apply(state, event, config) -> (state, verdicts)` is all there is; the Faust
agent, `loopwarden replay` and the audit tools all call it.
"""

from streams.engine.compiled import MODE
from streams.engine.engine import Outcome, apply

__all__ = ["MODE", "Outcome", "apply"]
