"""The pure loop-detection engine: no Kafka, no clock, no globals.

`apply(state, event, config, policy=None) -> Outcome` is all there is: the run's new state
and its verdicts, plus what the operator log and the counters need. The
stream worker, `loopwarden replay` and the audit tools all call it.
"""

from streams.engine.compiled import MODE
from streams.engine.engine import Outcome, apply

__all__ = ["MODE", "Outcome", "apply"]
