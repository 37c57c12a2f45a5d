"""Differential check of `loopwarden replay` against the gateway's own loop detector.

A seeded fleet trace (bench/fleet_trace.py) goes through `openclaw_harness.mjs`, which drives the
detector module of the published `openclaw` package as the gateway does and writes the trace as the
gateway would have lived it (its vetoes in place of the results of the calls it blocked); that
realised trace then goes through `loopwarden replay` with the default config, rolling detectors on,
and recovery off (spec section 8.3 ends runs where the module's runner, not its detector, would).
Per tool call, loopwarden must give the reference's decision, detector and count. The allowed
differences are spec sections 7.4 and 8.2: where loopwarden is stricter, the harness must show that
the reference's own module, with one of the two 7.4 rules applied to its source or with 8.2's
latches kept around it (or only with them together), gives loopwarden's verdict on the same history.
Everything else is a divergence.

    python tests/reference/refdiff.py --seeds 1-5 --runs 300 --events 20000 [--keep DIR] [--json F [--shrink]]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("openclaw_harness.mjs")
NODE_SCRIPTS = ROOT / "infra" / "node"
CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
"""The current gateway exposes only `enabled`; its thresholds are the defaults."""
POLICY = {"recovery": {"enabled": False}}
"""The detector's behaviour with section 8's turns and latches, without the runner's recovery."""

MIX = {
    "healthy": 0.25,
    "poll": 0.06,
    "ping_pong": 0.06,
    "unknown_tool": 0.06,
    "generic_repeat": 0.06,
    "retry_progress": 0.04,
    "compaction_loop": 0.03,
    "exec_flags": 0.1,
    "argument_churn": 0.1,
    "unchanged_write": 0.08,
    "untrusted_fetch": 0.08,
    "stuck_retry": 0.08,
}
"""Every loop the gateway knows, section 7's included, with healthy runs around them."""

COMPARED = ("decision", "detector", "count")
VARIANTS = ("raw", "precomputed")
"""loopwarden reads the realised trace with its payloads, and hashed at the gateway (spec 7.5)."""
RULES = {
    "unknownSkip": "unknown_tool_streak_skips_vetoes",
    "pingPongSkip": "ping_pong_evidence_skips_vetoes",
    "latch": "latch_holds_until_another_call_runs",
}
_SEVERITY = {"allow": 0, "warn": 1, "block": 2, "abort": 3}


class Unreachable(Exception):
    """npm cannot reach its registry, so the reference package cannot be had."""


def _script(name: str) -> str:
    done = subprocess.run([str(NODE_SCRIPTS / name)], capture_output=True, text=True)
    if done.returncode != 0:
        if not _registry_reachable():
            raise Unreachable(
                f"npm cannot reach the registry, so openclaw cannot be installed ({name}: {done.stderr.strip()[-300:]})"
            )
        raise RuntimeError(f"{name} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def _registry_reachable() -> bool:
    """`npm ping`; a machine without npm at all is broken, not offline, and fails here."""
    try:
        return subprocess.run(["npm", "ping"], capture_output=True, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@dataclass(frozen=True)
class Reference:
    node: str
    openclaw: Path


def install() -> Reference:
    """Node and the pinned openclaw package, through the project's own install scripts."""
    node = _script("ensure-node.sh")
    return Reference(node, Path(_script("ensure-openclaw.sh")) / "node_modules" / "openclaw")


def _key(verdict: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(verdict.get(k) for k in COMPARED)


def _brief(verdict: dict[str, Any] | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {k: verdict.get(k) for k in ("decision", "level", "detector", "count", "warning_key")}


@dataclass
class Result:
    seed: int
    variant: str = "raw"
    verdicts: int = 0
    agreed: int = 0
    by_rule: Counter[str] = field(default_factory=Counter)
    aborts: int = 0
    seen: Counter[str] = field(default_factory=Counter)
    """The reference's verdicts by decision/detector: what the trace exercised."""
    divergences: list[dict[str, Any]] = field(default_factory=list)
    harness_notes: list[str] = field(default_factory=list)


def _rule_of(ref: dict[str, Any], lw: dict[str, Any], ruled_keys: set[tuple[str, str]]) -> str | None:
    """Which rule (7.4's two, 8.2's latches), applied alone to the reference, turns its verdict into loopwarden's.

    A detection that is the same under the rules and only delivered differently (warn or a quiet
    allow) counts when a rule changed an earlier verdict of this run under the same warning key:
    only that moves the key's bucket apart.
    """
    spec = ref["modes"]["spec"]
    if _key(spec) != _key(lw) or _SEVERITY[lw["decision"]] < _SEVERITY[ref["decision"]]:
        return None
    if _same_detection(ref, spec):
        return "warning_bucket_after_rule" if (ref["run_id"], ref["warning_key"]) in ruled_keys else None
    for mode, rule in RULES.items():
        if _key(ref["modes"][mode]) == _key(lw):
            return rule
    return "rules_together"


def compare(
    seed: int,
    scenario_of: Callable[[str], str],
    reference: list[dict[str, Any]],
    loopwarden: list[dict[str, Any]],
    compactions: dict[str, int] | None = None,
) -> Result:
    """`compactions`: each run's first compaction seq; only after one may loopwarden abort."""
    result = Result(seed)
    compactions = compactions or {}
    mine = {(v["run_id"], v["seq"]): v for v in loopwarden}
    ruled_keys: set[tuple[str, str]] = set()  # (run, warning key) where a 7.4 rule changed a verdict
    for ref in reference:
        result.verdicts += 1
        result.seen[_label(ref)] += 1
        run, seq = ref["run_id"], ref["seq"]
        lw = mine.pop((run, seq), None)
        if lw is not None and _key(lw) == _key(ref):
            result.agreed += 1
            continue
        scenario = scenario_of(run)
        if lw is not None and lw["decision"] == "abort" and seq > compactions.get(run, seq):
            result.aborts += 1  # the post-compaction guard is not part of the detector module
            continue
        rule = None if lw is None else _rule_of(ref, lw, ruled_keys)
        if rule is not None:
            result.by_rule[rule] += 1
            ruled_keys.update((run, v["warning_key"]) for v in (ref, ref["modes"]["spec"]) if v.get("warning_key"))
            continue
        result.divergences.append(
            {
                "seed": seed,
                "variant": result.variant,
                "run_id": run,
                "seq": seq,
                "scenario": scenario,
                "tool_name": ref["tool_name"],
                "class": (scenario, _label(ref), _label(lw), "spec:" + _label(ref["modes"]["spec"])),
                "openclaw": _brief(ref),
                "openclaw_with_7.4_and_8.2": _brief(ref["modes"]["spec"]),
                "loopwarden": _brief(lw),
            }
        )
    for (run, seq), lw in mine.items():
        if lw.get("tool_name") is not None and lw.get("error") is None:
            result.divergences.append(
                {
                    "seed": seed,
                    "run_id": run,
                    "seq": seq,
                    "class": ("extra loopwarden verdict",),
                    "loopwarden": _brief(lw),
                }
            )
    return result


def _same_detection(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("level", "detector", "count", "warning_key"))


def _label(verdict: dict[str, Any] | None) -> str:
    if verdict is None:
        return "none"
    return f"{verdict['decision']}/{verdict['detector']}" if verdict.get("detector") else verdict["decision"]


def run_seed(
    ref: Reference,
    seed: int,
    runs: int,
    events: int,
    workdir: Path,
    loopwarden: Path = ROOT,
    variants: tuple[str, ...] = VARIANTS,
) -> list[Result]:
    """One seeded fleet trace; the files stay in `workdir` for reproducing a divergence."""
    from bench.fleet_trace import generate_lines, run_scenarios

    trace = workdir / f"trace-{seed}.jsonl"
    with trace.open("wb") as out:
        out.writelines(generate_lines(runs, events, seed, "raw", MIX))
    scenarios = run_scenarios(runs, seed, MIX)
    return judge(ref, seed, trace, workdir, lambda run: scenarios[int(run.rsplit("-", 1)[1])], loopwarden, variants)


def judge(
    ref: Reference,
    seed: int,
    trace: Path,
    workdir: Path,
    scenario_of: Callable[[str], str],
    loopwarden: Path = ROOT,
    variants: tuple[str, ...] = VARIANTS,
) -> list[Result]:
    """A trace through the reference, then its realised events through loopwarden (the tree at
    `loopwarden`) twice: with the payloads, and hashed at the gateway as a locally hashing client
    sends them (spec 7.5)."""
    realised = workdir / f"realised-{seed}.jsonl"
    config = workdir / "config.json"
    config.write_text(json.dumps(CONFIG))
    policy = workdir / "policy.json"
    policy.write_text(json.dumps(POLICY))
    harness = _run(
        f"openclaw harness, seed {seed}",
        [ref.node, str(HARNESS), "--openclaw", str(ref.openclaw), "--realised", str(realised), str(trace)],
    )
    (workdir / f"openclaw-{seed}.jsonl").write_bytes(harness.stdout)
    reference = _lines(harness.stdout)
    compactions: dict[str, int] = {}
    hashed = workdir / f"realised-{seed}-precomputed.jsonl"
    with realised.open("rb") as raw, hashed.open("w") as out:
        open_calls: dict[tuple[str, str], Any] = {}
        for line in raw:
            event = json.loads(line)
            if event["type"] == "compaction":
                compactions.setdefault(event["run_id"], event["seq"])
            out.write(json.dumps(_hashed(event, open_calls)) + "\n")
    results = []
    for variant, events_file in (("raw", realised), ("precomputed", hashed)):
        if variant not in variants:
            continue
        replay = _run(
            f"loopwarden replay, seed {seed} {variant}",
            [
                sys.executable,
                "-m",
                "streams.cli",
                "replay",
                "--config",
                str(config),
                "--policy",
                str(policy),
                str(events_file),
            ],
            cwd=loopwarden,
        )
        (workdir / f"loopwarden-{seed}-{variant}.jsonl").write_bytes(replay.stdout)
        result = compare(seed, scenario_of, reference, _lines(replay.stdout), compactions)
        result.variant = variant
        result.harness_notes = [line for line in harness.stderr.decode().splitlines() if line]
        results.append(result)
    return results


def _run(what: str, command: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(command, capture_output=True, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr.decode()[-2000:]}")
    return done


def _hashed(event: dict[str, Any], open_calls: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """The event as a gateway that hashes locally sends it: hashes in place of the payloads."""
    from bench.fleet_trace import precompute_call, precompute_result

    key = (event.get("run_id"), event.get("tool_call_id"))
    if event["type"] == "tool_call":
        fields, open_calls[key] = precompute_call(event["tool_name"], event.pop("args", None))
        event.update(fields)
    elif event["type"] == "tool_result":
        event.update(
            precompute_result(
                event["tool_name"], open_calls.pop(key, None), event.pop("result", None), event.pop("error", None)
            )
        )
    return event


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def reproducer(workdir: Path, divergence: dict[str, Any]) -> list[str]:
    """The realised events of the diverging run up to the diverging call: a trace that shows it alone."""
    lines = []
    with (workdir / f"realised-{divergence['seed']}.jsonl").open() as events:
        for line in events:
            event = json.loads(line)
            if event["run_id"] == divergence["run_id"] and event["seq"] <= divergence["seq"]:
                lines.append(line.rstrip("\n"))
    return lines


def shrink(ref: Reference, workdir: Path, divergence: dict[str, Any], loopwarden: Path = ROOT) -> list[str]:
    """A short trace that still ends in this divergence: the diverging run's realised events up to
    the call, with chunks of halving size (down to single events) dropped while the last call still
    diverges alike."""
    events = reproducer(workdir, divergence)
    scratch = workdir / "shrink"
    scratch.mkdir(exist_ok=True)
    target = divergence["class"][1:]

    def diverges(candidate: list[str]) -> bool:
        trace = scratch / "trace.jsonl"
        trace.write_text("".join(line + "\n" for line in candidate))
        (result,) = judge(
            ref,
            divergence["seed"],
            trace,
            scratch,
            lambda _: divergence["scenario"],
            loopwarden,
            (divergence["variant"],),
        )
        found = result.divergences
        return any(d["seq"] == divergence["seq"] and d["class"][1:] == target for d in found)

    body, last = events[:-1], events[-1]
    chunk = max(1, len(body) // 2)
    while chunk >= 1:
        start = 0
        while start < len(body):
            candidate = body[:start] + body[start + chunk :]
            if diverges(candidate + [last]):
                body = candidate
            else:
                start += chunk
        chunk //= 2
    return body + [last]


def summary(results: list[Result]) -> str:
    out = []
    for variant in dict.fromkeys(r.variant for r in results):
        mine = [r for r in results if r.variant == variant]
        out.append(
            f"{variant}, seeds {', '.join(str(r.seed) for r in mine)}: {sum(r.verdicts for r in mine)} tool-call verdicts, "
            f"{sum(r.agreed for r in mine)} identical, {sum(r.aborts for r in mine)} post-compaction aborts (not in the module), "
            f"{sum(sum(r.by_rule.values()) for r in mine)} stricter by spec 7.4 or 8.2, {sum(len(r.divergences) for r in mine)} divergent"
        )
        rules: Counter[str] = sum((r.by_rule for r in mine), start=Counter())
        out += [f"  {rule}: {n}" for rule, n in sorted(rules.items())]
        classes = Counter(d["class"] for r in mine for d in r.divergences)
        first = {}
        for d in (d for r in mine for d in r.divergences):
            first.setdefault(d["class"], d)
        for cls, n in classes.most_common():
            d = first[cls]
            out.append(f"  DIVERGENCE x{n} {' | '.join(cls)}  e.g. seed {d['seed']} {d['run_id']} seq {d['seq']}")
    out += [f"  {note}" for note in sorted({note for r in results for note in r.harness_notes})]
    return "\n".join(out)


def _seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=_seeds, default=[1])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--keep", type=Path, help="directory for the traces, verdicts and reproducers")
    parser.add_argument("--json", type=Path, help="write every divergence here, one JSON object per line")
    parser.add_argument(
        "--shrink",
        action="store_true",
        help="with --json: cut the first divergence of each class down to a short trace",
    )
    parser.add_argument(
        "--variants", type=lambda text: tuple(text.split(",")), default=VARIANTS, help="raw,precomputed"
    )
    parser.add_argument(
        "--loopwarden", type=Path, default=ROOT, help="the loopwarden tree whose replay is judged (default this one)"
    )
    args = parser.parse_args(argv)
    ref = install()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="refdiff-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = [
        result
        for seed in args.seeds
        for result in run_seed(ref, seed, args.runs, args.events, workdir, args.loopwarden, args.variants)
    ]
    print(summary(results))
    if args.json:
        shrunk: set[tuple[str, ...]] = set()
        with args.json.open("w") as out:
            for r in results:
                for d in r.divergences:
                    events = reproducer(workdir, d)
                    if args.shrink and d["class"] not in shrunk:
                        shrunk.add(d["class"])
                        events = shrink(ref, workdir, d, args.loopwarden)
                    out.write(json.dumps({**d, "class": list(d["class"]), "reproducer": events}) + "\n")
                    out.flush()  # shrinking takes minutes per class
    print(f"files in {workdir}")
    return 1 if any(r.divergences for r in results) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    sys.exit(main())
