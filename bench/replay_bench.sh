#!/usr/bin/env bash
# Times the WHOLE `loopwarden replay` process (start-up, imports, decode, engine,
# verdict output) on the 200,000-event fleet traces, raw and precomputed.
#
#   bash bench/replay_bench.sh                     # 5 timed runs per case, after 1 warm-up
#   RUNS=9 EVENTS=200000 bash bench/replay_bench.sh
#   HYPERFINE=1 bash bench/replay_bench.sh         # wall time from hyperfine instead
#
# Each run is timed with /usr/bin/time (wall, user+sys CPU, peak RSS); the table
# gives MEDIANS over RUNS. With HYPERFINE=1 (apt-get install hyperfine) the wall
# figures come from hyperfine's runs instead. On a shared machine, quote the CPU
# column: it leaves out the time the process waited for a core.
# Also: the import time of the replay path (python -X importtime), which must
# not import the stream stack (faust, aiokafka, kafka, rocksdict).
# Results: a table on stdout and bench/out/replay-<UTC time>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOOPWARDEN=${LOOPWARDEN:-.venv/bin/loopwarden}
RUNS=${RUNS:-5}
EVENTS=${EVENTS:-200000}
SEED=${SEED:-1}
TRACE_RUNS=${TRACE_RUNS:-5000}
HYPERFINE=${HYPERFINE:-0}
CONFIG=bench/fleet-config.json
OUT=bench/out
mkdir -p "$OUT"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

for variant in raw precomputed; do
  trace="$OUT/fleet-$variant-$EVENTS-s$SEED.jsonl"
  if [ ! -s "$trace" ]; then
    echo "generating $trace"
    "$PY" -m bench.fleet_trace --runs "$TRACE_RUNS" --events "$EVENTS" --seed "$SEED" --hashes "$variant" -o "$trace"
  fi
done
RAW="$OUT/fleet-raw-$EVENTS-s$SEED.jsonl"
PRE="$OUT/fleet-precomputed-$EVENTS-s$SEED.jsonl"

# Same verdicts from both variants (the precomputed hashes are the engine's own).
"$LOOPWARDEN" replay --config "$CONFIG" "$RAW" > "$WORK/raw.verdicts"
"$LOOPWARDEN" replay --config "$CONFIG" "$PRE" > "$WORK/pre.verdicts"
if cmp -s "$WORK/raw.verdicts" "$WORK/pre.verdicts"; then SAME=true; else SAME=false; fi
VERDICTS=$(wc -l < "$WORK/raw.verdicts")
echo "verdicts: $VERDICTS lines; raw and precomputed identical: $SAME"
head -n 1 "$RAW" > "$WORK/one.jsonl"

time_case() {  # name, command (run by sh -c; its output goes to /dev/null)
  local name=$1 cmd=$2
  sh -c "$cmd" >/dev/null  # warm-up (page cache, .pyc)
  : > "$WORK/$name.runs"
  for _ in $(seq "$RUNS"); do
    /usr/bin/time -f "%e %U %S %M" -a -o "$WORK/$name.runs" sh -c "$cmd" >/dev/null
  done
  if [ "$HYPERFINE" = 1 ] && command -v hyperfine >/dev/null 2>&1; then
    hyperfine --style none --warmup 1 --runs "$RUNS" --export-json "$WORK/$name.hf.json" "$cmd" >/dev/null
  fi
}

time_case startup "$LOOPWARDEN replay --config $CONFIG $WORK/one.jsonl"
time_case precomputed "$LOOPWARDEN replay --config $CONFIG $PRE"
time_case raw "$LOOPWARDEN replay --config $CONFIG $RAW"

# Import time of the replay path, and what it imports.
"$PY" -X importtime -c "import sys; from streams.cli import main; sys.exit(main(['replay', '--config', '$CONFIG', '$WORK/one.jsonl']))" \
  > /dev/null 2> "$WORK/importtime.txt"
"$PY" -X importtime -c "pass" 2> "$WORK/importtime-bare.txt"

"$PY" - "$WORK" "$OUT/replay-$STAMP.json" "$EVENTS" "$SAME" "$VERDICTS" "$RUNS" <<'PYEOF'
import json, os, platform, re, statistics, sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
events, same, verdicts, runs = int(sys.argv[3]), sys.argv[4] == "true", int(sys.argv[5]), int(sys.argv[6])


def timed(name):
    rows = [line.split() for line in (work / f"{name}.runs").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if len(r) == 4 and not r[0].startswith("Command")]
    walls = [float(r[0]) for r in rows]
    cpus = [float(r[1]) + float(r[2]) for r in rows]
    rss = [int(r[3]) for r in rows]
    timer = "/usr/bin/time"
    hf = work / f"{name}.hf.json"
    if hf.exists():
        walls, timer = json.loads(hf.read_text())["results"][0]["times"], "hyperfine"
    return walls, cpus, rss, timer


def imports(path):
    mods, total = [], 0
    for line in path.read_text().splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            mods.append(m.group(4))
            if len(m.group(3)) == 1:  # top-level import: its cumulative time
                total += int(m.group(2))
    return mods, total


record = {"bench": "replay-process", "events": events, "runs": runs, "verdicts": verdicts,
          "raw_equals_precomputed": same, "python": sys.version.split()[0], "platform": platform.platform(),
          "cpu_count": os.cpu_count(), "cases": {}}
print(f"\n{'case':<12} {'wall med s':>10} {'min..max s':>15} {'events/s wall':>14} {'cpu med s':>10} "
      f"{'events/s cpu':>13} {'peak RSS MiB':>13}  wall timer")
for name in ("startup", "precomputed", "raw"):
    walls, cpus, rss, timer = timed(name)
    wall, cpu, peak = statistics.median(walls), statistics.median(cpus), statistics.median(rss)
    n = 0 if name == "startup" else events
    record["cases"][name] = {"wall_s": walls, "cpu_s": cpus, "peak_rss_kib": rss, "wall_median_s": wall,
                             "cpu_median_s": cpu, "peak_rss_median_kib": peak, "events": n, "wall_timer": timer,
                             "events_per_s_wall": n / wall if n else None, "events_per_s_cpu": n / cpu if n else None}
    rate_w = f"{n / wall:,.0f}" if n else "-"
    rate_c = f"{n / cpu:,.0f}" if n and cpu else "-"
    print(f"{name:<12} {wall:>10.3f} {min(walls):>7.3f}..{max(walls):<7.3f} {rate_w:>14} {cpu:>10.2f} {rate_c:>13} "
          f"{peak / 1024:>13.1f}  {timer}")

mods, total_us = imports(work / "importtime.txt")
_, bare_us = imports(work / "importtime-bare.txt")
stack = re.compile(r"(faust|aiokafka|kafka|rocksdict|mode|aiohttp|yarl|croniter|venusian|opentracing)(\.|$)")
heavy = sorted({m for m in mods if stack.match(m)})
slowest = sorted(
    ((int(m.group(2)), m.group(4)) for line in (work / "importtime.txt").read_text().splitlines()
     if (m := re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( )(\S+)$", line))), reverse=True)[:8]
record["imports"] = {"modules": len(mods), "cumulative_us": total_us, "bare_interpreter_us": bare_us,
                     "stream_stack_modules": heavy, "slowest_top_level": slowest}
print(f"\nreplay path: {len(mods)} modules imported, {total_us / 1000:.1f} ms of imports under -X importtime "
      f"(bare interpreter: {bare_us / 1000:.1f} ms); stream stack imported: {', '.join(heavy) if heavy else 'none'}")
print("slowest top-level imports (cumulative ms): " + ", ".join(f"{name} {us / 1000:.1f}" for us, name in slowest))
out.write_text(json.dumps(record, indent=1))
print(f"record: {out}")
PYEOF
