"""A/B of two source trees of the engine, in ONE process, passes interleaved.

    .venv/bin/python -m bench.ab_engine --a /path/to/baseline-tree --b /path/to/candidate-tree
    .venv/bin/python -m bench.ab_engine --a . --b /tmp/candidate --stages apply --variants precomputed --pairs 11

A tree is a directory holding `streams/` and `schemas/` (a checkout, or a copy
with one change applied). Both are imported side by side (each with its own
codec, schemas and engine), and the passes run A, B, B, A, A, B ... so that a
slow spell of a shared machine hits both alike. For every pair the ratio B/A of
throughput is taken; the MEDIAN ratio is the figure to quote (min and max show
the spread). CPU time (time.process_time) is used for the ratio; the wall
figures are in the JSON record too.

Before timing, the verdicts of A and B on each trace are compared byte for
byte: a candidate that changes behaviour is reported and not timed.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import io
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.engine_bench import CONFIG, load_lines, write_record

STAGES = ("decode", "apply", "decode+apply", "replay")


TREE_MODULES = ("streams", "schemas", "loopwarden_engine__mypyc")
"""Top-level modules each tree brings (the last: its compiled engine's runtime, where it was built)."""


def _forget_tree_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in TREE_MODULES]:
        del sys.modules[name]


def _config_parser() -> Any:
    """The tree's config parser: schemas.configparse, or streams.engine.config in a tree older than that."""
    try:
        return importlib.import_module("schemas.configparse")
    except ModuleNotFoundError:
        return importlib.import_module("streams.engine.config")


class Engine:
    """One tree's codec, engine and replay, imported apart from the other tree's."""

    def __init__(self, tree: Path) -> None:
        _forget_tree_modules()
        sys.path.insert(0, str(tree))
        try:
            codec = importlib.import_module("schemas.codec")
            engine = importlib.import_module("streams.engine")
            config = _config_parser()
            replay = importlib.import_module("streams.tools.replay")
        finally:
            sys.path.remove(str(tree))
        runtime = sys.modules.get("loopwarden_engine__mypyc")
        for source in (engine.__file__, runtime and runtime.__file__):
            if source and not Path(source).resolve().is_relative_to(tree.resolve()):
                raise SystemExit(f"{tree}: {source} was imported, not the tree's own")
        self.tree = tree
        self.mode = getattr(engine, "MODE", "Python sources (a tree older than the compiled engine)")
        self.decode_event = codec.decode_event
        self.encode_verdict = codec.encode_verdict
        self.apply = engine.apply
        self.replay = replay.replay
        self.config = config.parse_config(CONFIG).config
        _forget_tree_modules()  # the next tree imports its own copies

    def verdicts(self, lines: list[bytes]) -> bytes:
        out = io.BytesIO()
        self.replay(lines, self.config, out, io.StringIO())
        return out.getvalue()

    def run(self, stage: str, lines: list[bytes], events: list[Any]) -> tuple[float, float]:
        decode_event, apply, config = self.decode_event, self.apply, self.config
        states: dict[str, Any] = {}
        get = states.get
        t0, c0 = time.perf_counter(), time.process_time()
        if stage == "decode":
            for line in lines:
                decode_event(line)
        elif stage == "apply":
            for event in events:
                states[event.run_id] = apply(get(event.run_id), event, config).state
        elif stage == "decode+apply":
            for line in lines:
                event = decode_event(line)
                states[event.run_id] = apply(get(event.run_id), event, config).state
        else:
            self.replay(lines, config, io.BytesIO(), io.StringIO())
        return time.perf_counter() - t0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab_engine", description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, type=Path, help="baseline tree")
    parser.add_argument("--b", required=True, type=Path, help="candidate tree")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--raw", help="raw trace file (default: generated)")
    parser.add_argument("--precomputed", help="precomputed trace file (default: generated)")
    parser.add_argument("--variants", default="precomputed,raw")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--pairs", type=int, default=7, help="A/B pairs per stage (median ratio reported)")
    parser.add_argument("--out", help="JSON record (default bench/out/ab-<UTC time>.json)")
    args = parser.parse_args(argv)
    engines = {"A": Engine(args.a), "B": Engine(args.b)}
    stages = [s for s in args.stages.split(",") if s]
    record: dict[str, Any] = {
        "a": str(args.a),
        "b": str(args.b),
        "a_engine": engines["A"].mode,
        "b_engine": engines["B"].mode,
        "pairs": args.pairs,
        "results": {},
    }
    print(f"A = {args.a} ({engines['A'].mode})\nB = {args.b} ({engines['B'].mode})")
    print(
        f"{'trace':<12} {'stage':<13} {'A events/s cpu':>15} {'B events/s cpu':>15} {'B/A median':>11} {'min..max':>12}"
    )
    for variant in [v for v in args.variants.split(",") if v]:
        lines = load_lines(getattr(args, variant, None), variant, args)
        if engines["A"].verdicts(lines) != engines["B"].verdicts(lines):
            print(f"{variant}: A and B give DIFFERENT verdicts; not timed")
            record["results"][variant] = "different verdicts"
            continue
        decoded = {k: ([e.decode_event(x) for x in lines] if "apply" in stages else []) for k, e in engines.items()}
        gc.collect()
        gc.freeze()
        for stage in stages:
            samples: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
            for i in range(args.pairs):
                order = ("A", "B") if i % 2 == 0 else ("B", "A")
                for key in order:
                    samples[key].append(engines[key].run(stage, lines, decoded[key]))
            n = len(lines)
            ratios = sorted(a_cpu / b_cpu for (_, a_cpu), (_, b_cpu) in zip(samples["A"], samples["B"], strict=True))
            a_rate = statistics.median(n / c for _, c in samples["A"])
            b_rate = statistics.median(n / c for _, c in samples["B"])
            print(
                f"{variant:<12} {stage:<13} {a_rate:>15,.0f} {b_rate:>15,.0f} {statistics.median(ratios):>10.2f}x "
                f"{ratios[0]:>5.2f}..{ratios[-1]:<5.2f}"
            )
            record["results"].setdefault(variant, {})[stage] = {
                "events": n,
                "a": samples["A"],
                "b": samples["B"],
                "a_events_per_cpu_s_median": a_rate,
                "b_events_per_cpu_s_median": b_rate,
                "speedup_median": statistics.median(ratios),
                "speedup_min": ratios[0],
                "speedup_max": ratios[-1],
            }
        gc.unfreeze()
        del decoded
    print(f"record: {write_record('ab', record, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
