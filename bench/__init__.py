"""Benchmarks and trace generators for loopwarden (not shipped with the package).

- `bench.fleet_trace`: a deterministic, realistic fleet trace (importable, and a CLI).
- `bench.engine_bench`: in-process engine throughput and per-event latency.
- `bench/replay_bench.sh`: the whole `loopwarden replay` process, timed from outside.
- `bench.profile_engine`, `bench.ab_engine`: where the engine's time goes; A/B of two engine trees.
"""
