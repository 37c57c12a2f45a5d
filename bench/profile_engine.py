"""Where the engine's time goes: cProfile (deterministic) or pyinstrument
(sampling, if installed) over one stage of the engine bench.

    .venv/bin/python -m bench.profile_engine --variant raw --stage decode+apply
    .venv/bin/python -m bench.profile_engine --variant precomputed --stage apply --top 25
    .venv/bin/python -m bench.profile_engine --variant raw --stage apply --tool pyinstrument

cProfile adds a fixed cost to every Python call, so it over-weights small
functions called often; read its shares as "where the calls are" and confirm
with pyinstrument or by timing a change. The .prof file (for snakeviz or
pstats) goes to bench/out/.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys

from bench.engine_bench import OUT_DIR, THROUGHPUT, _engine, load_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_engine", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("raw", "precomputed"), default="raw")
    parser.add_argument("--stage", choices=tuple(THROUGHPUT), default="decode+apply")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", help="read the trace from this file instead of generating it")
    parser.add_argument("--tool", choices=("cprofile", "pyinstrument"), default="cprofile")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sort", default="tottime")
    args = parser.parse_args(argv)
    lines = load_lines(args.trace, args.variant, args)
    decode_event = _engine()[0]
    events = [decode_event(line) for line in lines] if args.stage == "apply" else []
    run = THROUGHPUT[args.stage]
    run(lines, events)  # warm-up: imports, caches
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    stem = f"profile-{args.variant}-{args.stage.replace('+', '-')}"
    if args.tool == "pyinstrument":
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0002)
        profiler.start()
        seconds = run(lines, events)[0]
        profiler.stop()
        print(profiler.output_text(unicode=True, color=False, show_all=False))
        (OUT_DIR / f"{stem}.html").write_text(profiler.output_html())
    else:
        profiler = cProfile.Profile()
        profiler.enable()
        seconds = run(lines, events)[0]
        profiler.disable()
        path = OUT_DIR / f"{stem}.prof"
        profiler.dump_stats(str(path))
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.strip_dirs().sort_stats(args.sort).print_stats(args.top)
    print(f"{args.variant} {args.stage}: {len(lines)} events in {seconds:.2f}s under the profiler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
