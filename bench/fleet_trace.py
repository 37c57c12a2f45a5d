"""A realistic fleet trace for loopwarden: thousands of agent runs, interleaved
as concurrent agents would be, deterministic per seed.

API (kept small on purpose; integration tests may import it):

    from bench.fleet_trace import generate, generate_lines, run_scenarios, DEFAULT_MIX

    generate(runs, events, seed=1, hashes="raw", mix=None, concurrency=None) -> Iterator[dict]
        Exactly `events` event dicts, each a wire event (spec section 6) ready for
        `msgspec.json.encode`. Treat them as read-only: events of one run may
        share nested payload objects.
    generate_lines(...same arguments...) -> Iterator[bytes]
        The same events as JSON lines (compact, each ending with b"\\n").
    run_scenarios(runs, seed=1, mix=None) -> list[str]
        The scenario of each run by index (the five-digit tail of its run id).
    precompute_call(tool, args), precompute_result(tool, normalised_args, result, error)
        The fields a gateway that hashes locally sends instead of the payloads.

- `runs` runs, each with its events in order and `seq` strictly increasing;
  at most `concurrency` runs (default runs // 4) are in flight at once and the
  next event comes from one of them at random, so runs overlap as the agents
  of a fleet do.
- `mix` maps scenario names (see SCENARIOS) to weights; runs are split by
  largest remainder, so every scenario with a weight gets its share. Missing
  names weigh 0; `mix=None` is DEFAULT_MIX.
- `hashes="raw"`: tool calls carry `args`, results carry `result` or `error`
  payloads (a few hundred bytes to about 1 KB of JSON, nested objects, floats,
  unicode). `hashes="precomputed"`: the same trace with `args_hash` on calls
  (plus `args: {"action": ...}` for `process` and `message`, which the engine
  needs to classify the call) and `result_hash` (+ `unknown_tool_name`) on
  results, computed with the engine's own hashing, so both variants give the
  same verdicts.
- Loop scenarios are shaped for the default thresholds (warning 10, critical
  20, unknown tool 10, guard window 3): the call the engine blocks is answered
  by the gateway's own veto result (`details.deniedReason: "tool-loop"`), as a
  gateway would do. Replayed with stricter thresholds, the engine may block
  calls the trace answers with real results; the verdicts are then still
  deterministic, but raw and precomputed may differ for `process`/`message`.
- Same arguments, same trace (per Python version: `random.Random` with string
  seeds); a run's content does not depend on `concurrency` or on other runs.

CLI:

    python -m bench.fleet_trace --runs 5000 --events 200000 --seed 1 --hashes raw -o bench/out/fleet-raw.jsonl
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

SCENARIOS: tuple[str, ...] = (
    "healthy",  # varied tools, progress, a few errors, parallel calls, sometimes a compaction
    "poll",  # process poll/log or command_status returning the same output
    "ping_pong",  # A, B, A, B with stable results
    "unknown_tool",  # retries of a tool that does not exist ("Unknown tool: bash")
    "generic_repeat",  # identical call, identical result: warned at 10, blocked at 20
    "retry_progress",  # identical call, changing results: warnings, never a block
    "compaction_loop",  # identical calls, compaction, the same again: abort (or recovery)
    # the loops of spec section 7 (weight 0 in DEFAULT_MIX, so the benchmark trace stays as it was)
    "exec_flags",  # a failing command retried with other flags; time stamps, pids, durations vary
    "argument_churn",  # one tool cycled through a few argument variants that all fail alike
    "unchanged_write",  # the same write again and again, each answered `changed: false`
    "untrusted_fetch",  # the same page, wrapped in external-content markers with a fresh id each time
    "stuck_retry",  # a loop the model keeps retrying long after its first block
)
DEFAULT_MIX: Mapping[str, float] = {
    "healthy": 0.70,
    "poll": 0.06,
    "ping_pong": 0.04,
    "unknown_tool": 0.04,
    "generic_repeat": 0.07,
    "retry_progress": 0.04,
    "compaction_loop": 0.05,
}

_BASE_TS = 1_750_000_000.0
_encode = msgspec.json.Encoder().encode

# ---------------------------------------------------------------- vocabulary

_WORDS = (
    "the request handler retries the upstream call after a timeout and logs the "
    "response body before parsing the payload into a typed record while the worker "
    "pool drains pending jobs from the queue and the scheduler updates each lease "
    "config value cache entry build step deploy pipeline test fixture migration "
    "schema index query latency budget rollout canary metric alert dashboard "
    "tenant invoice customer report summary draft review comment branch commit"
).split() + [
    "café",
    "naïve",
    "Zürich",
    "façade",
    "Ångström",
    "résumé",
    "東京",
    "数据库",
    "配置",
    "ошибка",
    "сервер",
    "–",
    "…",
    "✓",
    "→",
    "🚀",
    "📦",
    "✅",
]
_EXTS = (".py", ".ts", ".md", ".json", ".yaml", ".go", ".rs", ".sql")
_DIRS = (
    "src/billing",
    "src/api/handlers",
    "web/app/components",
    "services/ingest",
    "infra/terraform/modules",
    "docs/guide",
    "tests/integration",
    "pkg/queue",
)
_NAMES = ("client", "invoice", "router", "schema", "worker", "config", "index", "utils", "models", "retry")
_COMMANDS = (
    "npm test -- --runInBand",
    "pytest -q tests/unit",
    "go test ./...",
    "cargo build --release",
    "git status --short",
    "ls -la",
    "kubectl get pods -n staging",
    "docker compose ps",
    "make lint",
    "terraform plan -no-color",
    "rg -n 'TODO' src",
    "python manage.py migrate --plan",
)
_HOSTS = ("docs.example.com", "api.example.org", "status.example.net", "wiki.example.com")
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
_AGENTS = ("safe-runner", "ops", "research", "support-bot", "coder")
_CHANNELS = ("slack", "telegram", "discord", "whatsapp")
_UNKNOWN_TOOLS = ("bash", "shell", "str_replace_editor", "python", "search_files", "run_terminal_cmd")


def _prose(rng: random.Random, size: int) -> str:
    out: list[str] = []
    length = 0
    words = _WORDS
    while length < size:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
        sentence = sentence[0].upper() + sentence[1:] + "."
        out.append(sentence)
        length += len(sentence) + 1
    return " ".join(out)


def _path(rng: random.Random) -> str:
    return f"{rng.choice(_DIRS)}/{rng.choice(_NAMES)}{rng.randint(0, 99)}{rng.choice(_EXTS)}"


def _hex(rng: random.Random, n: int) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


def _code(rng: random.Random, size: int) -> str:
    lines: list[str] = []
    length = 0
    while length < size:
        name = rng.choice(_NAMES)
        form = rng.randrange(6)
        if form == 0:
            line = f"def {name}_{rng.randint(1, 9)}(self, value: int = {rng.randint(0, 500)}) -> dict:"
        elif form == 1:
            line = f"    return {{'{name}': value * {rng.random():.3f}, 'ok': True}}"
        elif form == 2:
            line = f"import {name}  # {rng.choice(_WORDS)} {rng.choice(_WORDS)}"
        elif form == 3:
            line = f"const {name} = await fetch(`https://{rng.choice(_HOSTS)}/v2/{name}`);"
        elif form == 4:
            line = f"    # {_prose(rng, 40)[:60]}"
        else:
            line = f"    if retries > {rng.randint(1, 5)}: raise TimeoutError('{name} timed out')"
        lines.append(line)
        length += len(line) + 1
    return "\n".join(lines)


def _log(rng: random.Random, size: int, minute: int = 0) -> str:
    lines: list[str] = []
    length = 0
    second = 0
    while length < size:
        second += rng.randint(0, 3)
        line = (
            f"2025-06-14T09:{(minute + second // 60) % 60:02d}:{second % 60:02d}.{rng.randint(0, 999):03d}Z "
            f"{rng.choice(_LEVELS)} {rng.choice(_NAMES)}[{rng.randint(1, 8)}]: {_prose(rng, 30)[:70]}"
        )
        lines.append(line)
        length += len(line) + 1
    return "\n".join(lines)


def _text(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


# ---------------------------------------------------------------- tool calls
# Each maker returns (tool, args, result, error); result/error None when absent.

Call = tuple[str, dict[str, Any], Any, Any]


def _read(rng: random.Random, path: str | None = None) -> Call:
    path = path or _path(rng)
    body = _code(rng, rng.randint(250, 900))
    args = {"path": path, "offset": rng.choice((1, 1, 1, 120, 400)), "limit": rng.choice((200, 400, 2000))}
    result = {
        "content": _text(body),
        "details": {"path": path, "totalLines": rng.randint(40, 2400), "truncated": False},
    }
    return "read", args, result, None


def _write(rng: random.Random) -> Call:
    path = _path(rng)
    body = _code(rng, rng.randint(200, 800))
    args = {"path": path, "content": body}
    result = {"content": _text(f"Successfully wrote {len(body.encode())} bytes to {path}"), "details": {}}
    return "write", args, result, None


def _edit(rng: random.Random) -> Call:
    path = _path(rng)
    old, new = _code(rng, rng.randint(60, 250)), _code(rng, rng.randint(60, 300))
    args = {"path": path, "oldText": old, "newText": new}
    line = rng.randint(1, 900)
    result = {
        "content": _text(f"Successfully replaced text in {path}."),
        "details": {"diff": f"@@ -{line},3 +{line},4 @@\n-{old[:80]}\n+{new[:80]}", "firstChangedLine": line},
    }
    return "edit", args, result, None


def _exec_args(rng: random.Random, command: str | None = None) -> dict[str, Any]:
    if command is None:
        command = rng.choice(_COMMANDS)
        if rng.random() < 0.35:  # a small script rather than one command
            steps = [rng.choice(_COMMANDS) + f" | tee /tmp/{rng.choice(_NAMES)}.log" for _ in range(rng.randint(3, 9))]
            command = "set -euo pipefail\n" + "\n".join(steps)
    args: dict[str, Any] = {"command": command, "workdir": f"/home/agent/{rng.choice(_NAMES)}"}
    if rng.random() < 0.5:
        args["timeout"] = rng.choice((30.0, 120.0, 600.0, 12.5))
    if rng.random() < 0.4:
        args["env"] = {"CI": "1", "NODE_OPTIONS": "--max-old-space-size=4096", "LANG": "en_US.UTF-8"}
    return args


def _exec_result(rng: random.Random, output: str, exit_code: int = 0) -> dict[str, Any]:
    """A finished exec; duration, pid, session id vary per call and never count."""
    return {
        "content": _text(output),
        "details": {
            "status": "completed" if exit_code == 0 else "failed",
            "exitCode": exit_code,
            "durationMs": round(rng.uniform(15, 9000), 1),
            "timedOut": False,
            "aggregated": output,
            "cwd": "/home/agent/work",
            "pid": rng.randint(1000, 60000),
            "sessionId": f"exec-{_hex(rng, 8)}",
        },
    }


def _exec(rng: random.Random) -> Call:
    output = _log(rng, rng.randint(120, 450)) if rng.random() < 0.6 else _code(rng, rng.randint(100, 400))
    return (
        "exec",
        _exec_args(rng),
        _exec_result(rng, output, 0 if rng.random() < 0.85 else rng.choice((1, 2, 127))),
        None,
    )


def _exec_running(rng: random.Random, session: str) -> Call:
    args = _exec_args(rng)
    args["background"] = True
    tail = _log(rng, rng.randint(80, 300))
    result = {
        "content": _text(f"Command still running (session {session}).\n{tail}"),
        "details": {
            "status": "running",
            "sessionId": session,
            "pid": rng.randint(1000, 60000),
            "tail": tail,
            "startedAt": round(_BASE_TS + rng.uniform(0, 86400), 3),
        },
    }
    return "exec", args, result, None


def _poll_args(action: str, session: str) -> dict[str, Any]:
    return {"action": action, "sessionId": session, "timeout": 5000}


def _poll_result(rng: random.Random, action: str, session: str, output: str, status: str = "running") -> dict[str, Any]:
    details: dict[str, Any] = {
        "status": status,
        "sessionId": session,
        "exitCode": 0 if status == "completed" else None,
        "exitSignal": None,
        "durationMs": round(rng.uniform(100, 600000), 1),
    }
    if action == "poll":
        details["aggregated"] = output
        text = output[-400:] if output else "(no new output)"
    else:
        details.update(totalLines=output.count("\n") + 1, totalChars=len(output), truncated=len(output) > 600)
        text = output[-600:]
    return {"content": _text(text), "details": details}


def _command_status_args(command_id: str) -> dict[str, Any]:
    return {"CommandId": command_id, "WaitDurationSeconds": 10.0, "OutputCharacterCount": 800}


def _command_status_result(rng: random.Random, output: str, status: str = "RUNNING") -> dict[str, Any]:
    return {"content": _text(f"Status: {status}\nOutput:\n{output}"), "details": {"status": status, "output": output}}


def _web_search(rng: random.Random) -> Call:
    query = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 7)))
    hits = [
        {
            "title": _prose(rng, 30)[:60],
            "url": f"https://{rng.choice(_HOSTS)}/{rng.choice(_NAMES)}/{_hex(rng, 6)}",
            "description": _prose(rng, 70)[:120],
            "score": round(rng.random(), 4),
            "age": f"{rng.randint(1, 30)} days ago",
        }
        for _ in range(rng.randint(2, 4))
    ]
    args = {"query": query, "count": 5, "country": rng.choice(("US", "DE", "JP", "ALL"))}
    result = {
        "content": _text("\n".join(f"{h['title']} — {h['url']}" for h in hits)),
        "details": {"query": query, "provider": "search", "tookMs": round(rng.uniform(80, 900), 2), "results": hits},
    }
    return "web_search", args, result, None


def _web_fetch(rng: random.Random, url: str | None = None) -> Call:
    url = url or f"https://{rng.choice(_HOSTS)}/{rng.choice(_NAMES)}/{_hex(rng, 6)}"
    body = _prose(rng, rng.randint(250, 900))
    args = {"url": url, "extractMode": "markdown", "maxChars": 20000}
    result = {
        "content": _text(body),
        "details": {"url": url, "status": 200, "contentType": "text/html", "length": len(body)},
    }
    return "web_fetch", args, result, None


def _browser(rng: random.Random, url: str | None = None, action: str | None = None) -> Call:
    url = url or f"https://{rng.choice(_HOSTS)}/app/{rng.choice(_NAMES)}"
    action = action or rng.choice(("snapshot", "snapshot", "navigate", "act"))
    args: dict[str, Any] = {"action": action, "profile": "agent", "targetUrl": url}
    if action == "act":
        args["request"] = {
            "kind": rng.choice(("click", "type")),
            "ref": f"e{rng.randint(1, 80)}",
            "text": _prose(rng, 20)[:30],
        }
    snapshot = "\n".join(
        f'- {rng.choice(("button", "link", "textbox", "heading"))} "{_prose(rng, 12)[:24]}" [ref=e{i}]'
        for i in range(rng.randint(6, 20))
    )
    result = {
        "content": _text(snapshot),
        "details": {"ok": True, "url": url, "title": _prose(rng, 20)[:40], "targetId": _hex(rng, 16)},
    }
    return "browser", args, result, None


def _message(rng: random.Random) -> Call:
    action = rng.choice(("send", "send", "send", "reply", "read"))
    channel = rng.choice(_CHANNELS)
    text = _prose(rng, rng.randint(60, 400))
    args: dict[str, Any] = {"action": action, "channel": channel, "target": f"#{rng.choice(_NAMES)}"}
    if action == "read":
        args["limit"] = 20
        messages = [
            {
                "id": _hex(rng, 12),
                "text": _prose(rng, 50)[:90],
                "senderId": f"U{_hex(rng, 8)}",
                "direction": "inbound",
                "createdAt": round(_BASE_TS + rng.uniform(0, 86400), 3),
            }
            for _ in range(rng.randint(2, 5))
        ]
        return "message", args, {"content": _text(f"{len(messages)} messages"), "details": {"messages": messages}}, None
    args["message"] = text
    msg_id = _hex(rng, 16)
    details = {
        "ok": True,
        "channel": channel,
        "messageId": msg_id,
        "ts": f"{_BASE_TS + rng.uniform(0, 86400):.6f}",
        "result": {"message": {"id": msg_id, "text": text, "senderId": "B0AGENT", "direction": "outbound"}},
    }
    return "message", args, {"content": _text(f"Sent to {channel}."), "details": details}, None


def _sessions_send(rng: random.Random) -> Call:
    key = f"agent:{rng.choice(_AGENTS)}:main"
    args = {"sessionKey": key, "message": _prose(rng, rng.randint(80, 300)), "timeoutSeconds": 30}
    details = {
        "status": "ok",
        "runId": f"run-{_hex(rng, 12)}",
        "sessionKey": key,
        "reply": _prose(rng, rng.randint(60, 300)),
    }
    return "sessions_send", args, {"content": _text(details["reply"]), "details": details}, None


def _update_plan(rng: random.Random) -> Call:
    steps = rng.randint(2, 6)
    done = rng.randint(0, steps - 1)
    plan = [
        {"step": _prose(rng, 30)[:70], "status": "completed" if i < done else "in_progress" if i == done else "pending"}
        for i in range(steps)
    ]
    args = {"explanation": _prose(rng, 60)[:120], "plan": plan}
    return "update_plan", args, {"content": _text("Plan updated"), "details": {"updated": True, "steps": steps}}, None


def _memory_search(rng: random.Random) -> Call:
    query = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5)))
    hits = [
        {
            "path": f"memory/2025-06-{rng.randint(1, 28):02d}.md",
            "startLine": (s := rng.randint(1, 200)),
            "endLine": s + 8,
            "score": round(rng.uniform(0.3, 0.95), 3),
            "snippet": _prose(rng, 80)[:140],
        }
        for _ in range(rng.randint(1, 4))
    ]
    args = {"query": query, "maxResults": 5, "minScore": 0.35}
    return "memory_search", args, {"content": _text(f"{len(hits)} results"), "details": {"results": hits}}, None


def _progress_poll(rng: random.Random) -> Call:
    session = f"proc-{_hex(rng, 8)}"
    if rng.random() < 0.3:
        output = _log(rng, rng.randint(200, 700))
        return "command_status", _command_status_args(session), _command_status_result(rng, output), None
    action = rng.choice(("poll", "poll", "log"))
    output = _log(rng, rng.randint(150, 700))
    status = rng.choice(("running", "completed"))
    return "process", _poll_args(action, session), _poll_result(rng, action, session, output, status), None


_HEALTHY: tuple[tuple[Any, float], ...] = (
    (_read, 0.22),
    (_exec, 0.18),
    (_write, 0.05),
    (_edit, 0.08),
    (_web_search, 0.07),
    (_web_fetch, 0.04),
    (_browser, 0.07),
    (_message, 0.06),
    (_sessions_send, 0.02),
    (_update_plan, 0.05),
    (_memory_search, 0.04),
    (_progress_poll, 0.12),
)
_HEALTHY_MAKERS = tuple(m for m, _ in _HEALTHY)
_HEALTHY_WEIGHTS = tuple(w for _, w in _HEALTHY)
_ERRORS = (
    "ENOENT: no such file or directory, open '{path}'",
    "Command timed out after 120000 ms",
    "HTTP 429: rate limited, retry after 2.5s",
    "permission denied: {path}",
)


def _healthy_call(rng: random.Random) -> Call:
    tool, args, result, error = rng.choices(_HEALTHY_MAKERS, _HEALTHY_WEIGHTS)[0](rng)
    if rng.random() < 0.04:
        message = rng.choice(_ERRORS).format(path=args.get("path", "/tmp/x"))
        error = (
            message
            if rng.random() < 0.8
            else {"message": message, "code": "E" + _hex(rng, 3).upper(), "retryable": True}
        )
        result = None
    return tool, args, result, error


def _veto(tool: str, detector: str) -> dict[str, Any]:
    """What a gateway answers for a call the loop guard blocked: no result hash, resets nothing."""
    return {
        "content": _text(f"Blocked by the tool-loop guard ({detector}); {tool} was not run."),
        "details": {"status": "blocked", "deniedReason": "tool-loop", "detector": detector},
    }


# ---------------------------------------------------------------- section 7 loops
# Failures whose every retry differs only in what spec section 7 tells apart from the outcome.

_FLAG_COMMANDS = ("npm test --", "pytest", "cargo test", "go test ./...", "make check")
_FLAGS = ("--runInBand", "--verbose", "-x", "--ci", "--maxWorkers=2", "--no-cache", "-q", "--color=never")
_FAILURES = (
    "Error: Cannot find module '@acme/{name}' from '{path}'",
    'FAIL {path}\n  ● {name} › rejects an expired lease\n    expect(received).toBe(expected) // "ok" != "expired"',
    "error[E0425]: cannot find value `{name}` in this scope\n --> {path}:12:5",
    "ModuleNotFoundError: No module named '{name}'",
)
_WRAP = '<<<EXTERNAL_UNTRUSTED_CONTENT id="{id}">>>\n{body}\n<<<END_EXTERNAL_UNTRUSTED_CONTENT id="{id}">>>'


def _failure(rng: random.Random) -> str:
    return rng.choice(_FAILURES).format(name=rng.choice(_NAMES), path=_path(rng))


def _noisy_failure(rng: random.Random, cause: str) -> str:
    """One failure with what a retry changes: time stamps, clock times, attempts, durations, pids."""
    stamp = f"2026-09-{rng.randint(1, 28):02d}{rng.choice('Tt ')}{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
    if rng.random() < 0.5:
        stamp += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 6)))
    stamp += rng.choice(("Z", "+02:00", "-05:30", ""))
    attempt = rng.choice(("attempt", "Attempt", "retry", "RETRY"))
    pid = rng.choice(("pid", "PID", "ppid"))
    return "\n".join(
        (
            f"[{stamp}] {attempt}{rng.choice((' ', ' #', ': ', '='))}{rng.randint(1, 12)} starting",
            f"worker {pid}{rng.choice((' ', '=', ': ', ' #'))}{rng.randint(100, 99999)} up at {rng.randint(0, 23)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
            cause,
            f"Time: {rng.uniform(0.2, 90):.{rng.randint(0, 3)}f}{rng.choice(('s', ' s', 'ms', ' seconds', ' minutes'))}",
        )
    )


def _exec_failure(rng: random.Random, command: str, output: str, exit_code: int, timed_out: bool = False) -> Call:
    result = _exec_result(rng, output, exit_code)
    result["details"]["timedOut"] = timed_out
    return "exec", {"command": command, "workdir": "/home/agent/app"}, result, None


def _exec_flags(run: _Run, calls: int) -> None:
    """A failing command retried with other flags, failing alike each time, now and then otherwise."""
    rng = run.rng
    base, cause, code = rng.choice(_FLAG_COMMANDS), _failure(rng), rng.choice((1, 1, 2, 127))
    command = base
    for _ in range(calls):
        if rng.random() < 0.6:
            command = " ".join((base, *rng.sample(_FLAGS, rng.randint(0, 3))))
        roll = rng.random()
        if roll < 0.06:  # a new cause: the streak ends
            run.step(_exec_failure(rng, command, _noisy_failure(rng, _failure(rng)), code))
        elif roll < 0.1:  # nothing but the exit code: not a terminal failure
            run.step(_exec_failure(rng, command, f"(Command exited with code {code})", code))
        elif roll < 0.13:
            run.step(_exec_failure(rng, command, _noisy_failure(rng, cause), code, timed_out=True))
        elif roll < 0.16:
            run.step(_exec_failure(rng, command, _noisy_failure(rng, cause), code + 1))
        else:
            run.step(_exec_failure(rng, command, _noisy_failure(rng, cause), code))


def _argument_churn(run: _Run, calls: int) -> None:
    """One tool, a few argument variants, one failure for all (an error, or a write that changed nothing)."""
    rng = run.rng
    tool = rng.choice(("web_fetch", "read", "exec", "write"))
    variants: list[dict[str, Any]] = []
    for _ in range(rng.randint(2, 4)):
        if tool == "web_fetch":
            variants.append(
                {"url": f"https://{rng.choice(_HOSTS)}/{rng.choice(_NAMES)}/{_hex(rng, 4)}", "maxChars": 20000}
            )
        elif tool == "exec":
            variants.append({"command": " ".join((rng.choice(_FLAG_COMMANDS), *rng.sample(_FLAGS, 2)))})
        else:
            variants.append({"path": _path(rng), **({"content": _code(rng, 120)} if tool == "write" else {})})
    message = rng.choice(
        ("HTTP 429: rate limited", "permission denied", "spawn ENOMEM", "EACCES: operation not permitted")
    )
    cycle = rng.random() < 0.5
    for i in range(calls):
        args = variants[i % len(variants)] if cycle else rng.choice(variants)
        if rng.random() < 0.05:  # a different failure
            run.step((tool, args, None, f"{message} ({_hex(rng, 4)})"))
        elif tool == "write":
            text = f"No changes: {args['path']} is already up to date."
            run.step((tool, args, {"content": _text(text), "details": {"changed": False, "path": args["path"]}}, None))
        else:
            run.step((tool, args, None, message))


def _unchanged_write(run: _Run, calls: int) -> None:
    """The identical write, answered `changed: false` with a new message each time."""
    rng = run.rng
    path = _path(rng)
    args = {"path": path, "content": _code(rng, rng.randint(120, 400))}
    for _ in range(calls):
        if rng.random() < 0.05:  # it did change after all: progress
            result = {"content": _text(f"Successfully wrote to {path}"), "details": {"changed": True}}
        else:
            checked = f"2026-09-02T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
            result = {
                "content": _text(f"{path} unchanged (checked {checked})"),
                "details": {"changed": False, "checkedAt": checked},
            }
        run.step(("write", args, result, None))


def _untrusted_fetch(run: _Run, calls: int) -> None:
    """The same page each time, wrapped with a fresh marker id: plain, inside serialised JSON
    (consistently escaped once or twice), inconsistently escaped, or as an error."""
    rng = run.rng
    url = f"https://{rng.choice(_HOSTS)}/{rng.choice(_NAMES)}/{_hex(rng, 6)}"
    body = _prose(rng, rng.randint(120, 400)) + ' She said "retry later" and left.'
    form = rng.randrange(5)
    args = {"url": url, "extractMode": "markdown", "maxChars": 20000}
    for _ in range(calls):
        wrapped = _WRAP.format(id=_hex(rng, 16), body=body)
        if form == 0:
            run.step(("web_fetch", args, {"content": _text(wrapped), "details": {"url": url, "status": 200}}, None))
        elif form in (1, 2):
            raw = _encode({"page": wrapped}).decode()
            if form == 2:
                raw = _encode({"raw": raw}).decode()
            run.step(("web_fetch", args, {"content": _text("fetched"), "details": {"url": url, "json": raw}}, None))
        elif form == 3:
            raw = _encode({"page": wrapped}).decode().replace('\\"retry later\\"', '"retry later"', 1)
            run.step(("web_fetch", args, {"content": _text("fetched"), "details": {"url": url, "json": raw}}, None))
        else:
            run.step(("web_fetch", args, None, f"fetch failed: upstream said {wrapped}"))


def _stuck_retry(run: _Run, kind: str, calls: int) -> None:
    """A loop the model keeps up after it is first blocked; each call is written with the result
    it would have had, and a gateway that blocks it answers with its veto instead."""
    rng = run.rng
    if kind == "repeat":
        made = rng.choice((_read, _exec, _web_fetch))(rng)
        run.repeat(made, calls, "generic_repeat", 0)
    elif kind == "unknown_tool":
        missing = rng.choice(_UNKNOWN_TOOLS[1:])
        for _ in range(calls):
            run.step((missing, {"command": rng.choice(_COMMANDS)}, None, f"Unknown tool: {missing}"))
    else:
        path = _path(rng)
        pair = (_read(rng, path), _exec_failure(rng, "npm test -- --runInBand", _log(rng, 200), 1))
        for i in range(calls):
            tool, args, result, error = pair[i % 2]
            if tool == "exec":
                result = _exec_result(rng, result["details"]["aggregated"], 1)
            run.step((tool, args, result, error))


# ---------------------------------------------------------------- one run


class _Run:
    """Builds one run's events in order (its own rng, its own seq)."""

    def __init__(self, index: int, seed: int, hashes: str, plan: dict[str, Any]) -> None:
        self.rng = random.Random(f"{seed}/body/{index}")
        rng = self.rng
        self.run_id = f"run-{_hex(rng, 8)}-{index:05d}"
        self.agent_id = plan["agent_id"]
        self.session_key = f"agent:{self.agent_id or 'main'}:{rng.choice(_CHANNELS)}:{_hex(rng, 6)}"
        self.seq = rng.randint(0, 3)
        self.precomputed = hashes == "precomputed"
        self.events: list[dict[str, Any]] = []
        self.open: dict[str, tuple[str, Any]] = {}
        self.calls = 0

    def _next_seq(self) -> int:
        self.seq += 1 if self.rng.random() < 0.8 else self.rng.randint(2, 4)
        return self.seq

    def call(self, tool: str, args: dict[str, Any]) -> str:
        self.calls += 1
        call_id = f"call_{_hex(self.rng, 20)}"
        event: dict[str, Any] = {
            "type": "tool_call",
            "run_id": self.run_id,
            "seq": self._next_seq(),
            "tool_call_id": call_id,
            "tool_name": tool,
        }
        if self.precomputed:
            fields, payload = precompute_call(tool, args)
            event.update(fields)
            self.open[call_id] = (tool, payload)
        else:
            event["args"] = args
        if self.agent_id:
            event["agent_id"] = self.agent_id
        event["session_key"] = self.session_key
        self.events.append(event)
        return call_id

    def result(self, call_id: str, tool: str, result: Any, error: Any) -> None:
        event: dict[str, Any] = {
            "type": "tool_result",
            "run_id": self.run_id,
            "seq": self._next_seq(),
            "tool_call_id": call_id,
            "tool_name": tool,
        }
        if self.precomputed:
            _, args = self.open.pop(call_id)
            event.update(precompute_result(tool, args, result, error))
        elif error is not None:
            event["error"] = error
        else:
            event["result"] = result
        self.events.append(event)

    def step(self, made: Call) -> None:
        tool, args, result, error = made
        self.result(self.call(tool, args), tool, result, error)

    def dangling(self) -> None:
        """A call still in flight when the trace ends (no result)."""
        tool, args, _, _ = _healthy_call(self.rng)
        self.call(tool, args)
        self.open.clear()

    def compaction(self) -> None:
        event: dict[str, Any] = {"type": "compaction", "run_id": self.run_id, "seq": self._next_seq()}
        if self.agent_id:
            event["agent_id"] = self.agent_id
        self.events.append(event)

    def end(self) -> None:
        self.events.append({"type": "run_end", "run_id": self.run_id, "seq": self._next_seq()})

    def healthy(self, calls: int) -> None:
        """`calls` healthy calls; sometimes two or three are made in parallel."""
        rng = self.rng
        while calls > 0:
            if calls >= 2 and rng.random() < 0.12:
                batch = [_healthy_call(rng) for _ in range(min(calls, rng.randint(2, 3)))]
                ids = [self.call(tool, args) for tool, args, _, _ in batch]
                order = list(range(len(batch)))
                rng.shuffle(order)
                for i in order:
                    self.result(ids[i], batch[i][0], batch[i][2], batch[i][3])
                calls -= len(batch)
            else:
                self.step(_healthy_call(rng))
                calls -= 1

    def repeat(self, made: Call, times: int, detector: str, vetoes: int) -> None:
        """The identical call `times` times with the identical outcome, then `vetoes` blocked attempts.
        exec results keep their outcome but get fresh durations and pids each time."""
        tool, args, result, error = made
        for _ in range(times):
            if tool == "exec" and result is not None:
                result = _exec_result(self.rng, result["details"]["aggregated"], result["details"]["exitCode"])
            self.step((tool, args, result, error))
        for _ in range(vetoes):
            self.step((tool, args, _veto(tool, detector), None))


def _normalize(value: Any) -> Any:
    return _stablejson.normalize_payload(value)


def precompute_call(tool: str, args: Any) -> tuple[dict[str, Any], Any]:
    """What a gateway that hashes locally sends for a call (`args_hash`, and the `action` that
    `process` and `message` calls are classified by), and the normalised args to hash its result with."""
    _load_engine()
    payload = _normalize(args)
    fields: dict[str, Any] = {"args_hash": _hashing.args_hash(tool, payload)}
    if tool in ("process", "message") and isinstance(args, dict) and "action" in args:
        fields["args"] = {"action": args["action"]}
    return fields, payload


def precompute_result(tool: str, args: Any, result: Any, error: Any) -> dict[str, Any]:
    """The hashed fields of a result (spec 7.5), from its call's normalised args and its payload."""
    _load_engine()
    hashes = _hashing.hash_result(
        tool,
        args,
        _normalize(result) if result is not None else msgspec.UNSET,
        _normalize(error) if error is not None else msgspec.UNSET,
    )
    return _hashing.wire_fields(hashes)


_hashing: Any = None
_stablejson: Any = None


def _load_engine() -> None:
    global _hashing, _stablejson
    if _hashing is None:
        from streams.engine import hashing, stablejson

        _hashing, _stablejson = hashing, stablejson


# ---------------------------------------------------------------- scenarios
# _plan_* draw a run's shape (how many events it has besides its flexible
# healthy calls); _build_* write its events. Both use their own seeded rng.


def _plan(scenario: str, rng: random.Random) -> dict[str, Any]:
    p: dict[str, Any] = {"scenario": scenario, "run_end": rng.random() < 0.92, "min_flex": 0, "weight": 0.3}
    p["agent_id"] = rng.choice(_AGENTS) if rng.random() < 0.35 else None
    fixed = 1 if p["run_end"] else 0
    if scenario == "healthy":
        p["min_flex"] = 1
        p["weight"] = rng.lognormvariate(0, 0.8)
        p["compaction"] = rng.random() < 0.06
        if p["compaction"]:
            p["min_flex"] = 6
            fixed += 1
    elif scenario == "poll":
        p["variant"] = rng.choice(("poll", "poll", "log", "command_status"))
        p["progress"] = rng.randint(0, 4)
        p["block"] = rng.random() < 0.7
        p["times"] = 20 if p["block"] else rng.randint(10, 16)
        p["vetoes"] = rng.randint(1, 2) if p["block"] else 0
        fixed += 2 * (1 + p["progress"] + p["times"] + p["vetoes"]) + (0 if p["block"] else 2)
    elif scenario == "ping_pong":
        p["block"] = rng.random() < 0.7
        p["times"] = 19 if p["block"] else rng.randint(10, 14)
        p["vetoes"] = rng.randint(1, 2) if p["block"] else 0
        fixed += 2 * (p["times"] + p["vetoes"])
    elif scenario == "unknown_tool":
        p["block"] = rng.random() < 0.6
        p["times"] = 10 if p["block"] else rng.randint(2, 7)
        p["vetoes"] = rng.randint(1, 2) if p["block"] else 0
        fixed += 2 * (p["times"] + p["vetoes"])
    elif scenario == "generic_repeat":
        p["block"] = rng.random() < 0.7
        p["times"] = 20 if p["block"] else rng.randint(10, 16)
        p["vetoes"] = rng.randint(1, 3) if p["block"] else 0
        fixed += 2 * (p["times"] + p["vetoes"])
    elif scenario == "retry_progress":
        p["times"] = rng.randint(10, 15)
        fixed += 2 * p["times"]
    elif scenario == "compaction_loop":
        p["before"] = rng.randint(4, 12)
        p["abort"] = rng.random() < 0.75
        p["after"] = 3 if p["abort"] else rng.randint(3, 5)
        p["asked_after_abort"] = rng.randint(0, 1) if p["abort"] else 0
        fixed += 2 * p["before"] + 1 + 2 * p["after"] + p["asked_after_abort"]
    elif scenario in ("exec_flags", "argument_churn", "unchanged_write", "untrusted_fetch"):
        p["calls"] = rng.randint(8, 40)
        fixed += 2 * p["calls"]
    elif scenario == "stuck_retry":
        p["kind"] = rng.choice(("repeat", "unknown_tool", "ping_pong"))
        p["calls"] = {"repeat": 20, "unknown_tool": 10, "ping_pong": 19}[p["kind"]] + rng.randint(3, 26)
        fixed += 2 * p["calls"]
    else:
        raise ValueError(f"unknown scenario {scenario!r} (expected one of {', '.join(SCENARIOS)})")
    p["fixed"] = fixed
    return p


def _split(rng: random.Random, flex: int) -> tuple[int, int]:
    before = rng.randint(0, flex)
    return before, flex - before


def _build(run: _Run, p: dict[str, Any], flex: int, dangling: bool) -> None:
    rng = run.rng
    scenario = p["scenario"]
    if scenario == "healthy":
        if p["compaction"]:
            first = flex // 2
            run.healthy(first)
            run.compaction()
            run.healthy(flex - first)
        else:
            run.healthy(flex)
    elif scenario == "poll":
        before, after = _split(rng, flex)
        run.healthy(before)
        session = f"proc-{_hex(rng, 8)}"
        output = _log(rng, rng.randint(100, 300))
        run.step(_exec_running(rng, session))
        variant = p["variant"]
        if variant == "command_status":
            tool, args = "command_status", _command_status_args(session)
            for _ in range(p["progress"]):
                output += "\n" + _log(rng, 60)
                run.step((tool, args, _command_status_result(rng, output), None))
            output += "\n" + _log(rng, 60)  # the last line before it hangs
            run.repeat(
                (tool, args, _command_status_result(rng, output), None),
                p["times"],
                "known_poll_no_progress",
                p["vetoes"],
            )
            done = _command_status_result(rng, output + "\nexit 0", "DONE")
        else:
            tool, args = "process", _poll_args(variant, session)
            for _ in range(p["progress"]):
                output += "\n" + _log(rng, 60)
                run.step((tool, args, _poll_result(rng, variant, session, output), None))
            output += "\n" + _log(rng, 60)  # the last line before it hangs
            # unchanged output each time; only the duration differs, which never counts
            for _ in range(p["times"]):
                run.step((tool, args, _poll_result(rng, variant, session, output), None))
            for _ in range(p["vetoes"]):
                run.step((tool, args, _veto(tool, "known_poll_no_progress"), None))
            done = _poll_result(rng, variant, session, output + "\ndone.", "completed")
        if not p["block"]:
            run.step((tool, args, done, None))
        run.healthy(after)
    elif scenario == "ping_pong":
        before, after = _split(rng, flex)
        run.healthy(before)
        if rng.random() < 0.5:
            path = _path(rng)
            a = _read(rng, path)
            b = ("exec", _exec_args(rng, "npm test -- --runInBand"), _exec_result(rng, _log(rng, 300), 1), None)
        else:
            url = f"https://{rng.choice(_HOSTS)}/app/{rng.choice(_NAMES)}"
            a = _browser(rng, url, "snapshot")
            b = _browser(rng, url, "act")
        pair = (a, b)
        for i in range(p["times"]):
            tool, args, result, error = pair[i % 2]
            if tool == "exec":
                result = _exec_result(rng, result["details"]["aggregated"], 1)
            run.step((tool, args, result, error))
        nxt = pair[p["times"] % 2]
        for _ in range(p["vetoes"]):
            run.step((nxt[0], nxt[1], _veto(nxt[0], "ping_pong"), None))
        run.healthy(after)
    elif scenario == "unknown_tool":
        before, after = _split(rng, flex)
        run.healthy(before)
        missing = rng.choice(_UNKNOWN_TOOLS)
        form = rng.randrange(3)
        message = (
            f"Unknown tool: {missing}",
            f'Tool "{missing}" not found. Available tools: read, write, edit, exec, process, web_search',
            f"unknown tool '{missing}'",
        )[form]
        for _ in range(p["times"]):
            run.step((missing, {"command": rng.choice(_COMMANDS), "description": _prose(rng, 40)[:80]}, None, message))
        for _ in range(p["vetoes"]):
            run.step((missing, {"command": rng.choice(_COMMANDS)}, _veto(missing, "unknown_tool_repeat"), None))
        run.healthy(after)
    elif scenario == "generic_repeat":
        before, after = _split(rng, flex)
        run.healthy(before)
        made = rng.choice((_read, _exec, _browser, _web_fetch))(rng)
        if made[0] == "browser":
            made = _browser(rng, made[1]["targetUrl"], "snapshot")
        run.repeat(made, p["times"], "generic_repeat", p["vetoes"])
        run.healthy(after)
    elif scenario == "retry_progress":
        before, after = _split(rng, flex)
        run.healthy(before)
        command = rng.choice(("kubectl get pods -n staging", "docker compose ps", "git status --short"))
        args = _exec_args(rng, command)
        for i in range(p["times"]):
            run.step(("exec", args, _exec_result(rng, f"attempt {i}\n" + _log(rng, rng.randint(120, 400))), None))
        run.healthy(after)
    elif scenario == "compaction_loop":
        if p["abort"]:
            run.healthy(flex)
        else:
            before, after = _split(rng, flex)
            run.healthy(before)
        made = rng.choice((_read, _exec, _web_fetch))(rng)
        run.repeat(made, p["before"], "generic_repeat", 0)
        run.compaction()
        if p["abort"]:
            run.repeat(made, p["after"], "generic_repeat", 0)
            for _ in range(p["asked_after_abort"]):  # answered "abort"; the gateway runs nothing
                run.call(made[0], made[1])
            run.open.clear()
        else:
            for _ in range(p["after"]):
                run.step(_progress(rng, made))
            run.healthy(after)
    elif scenario in _SECTION7:
        before, after = _split(rng, flex)
        run.healthy(before)
        if scenario == "stuck_retry":
            _stuck_retry(run, p["kind"], p["calls"])
        else:
            _SECTION7[scenario](run, p["calls"])
        run.healthy(after)
    if dangling:
        run.dangling()
    if p["run_end"]:
        run.end()


_SECTION7: dict[str, Any] = {
    "exec_flags": _exec_flags,
    "argument_churn": _argument_churn,
    "unchanged_write": _unchanged_write,
    "untrusted_fetch": _untrusted_fetch,
    "stuck_retry": _stuck_retry,
}


def _progress(rng: random.Random, made: Call) -> Call:
    """The same call, a new result each time: compaction broke the loop."""
    tool, args, _, _ = made
    if tool == "read":
        return _read(rng, args["path"])
    if tool == "web_fetch":
        return _web_fetch(rng, args["url"])
    return tool, args, _exec_result(rng, _log(rng, rng.randint(120, 500))), None


# ---------------------------------------------------------------- the trace


def _allocate(total: int, weights: list[float]) -> list[int]:
    """Split `total` by weight, largest remainder first; deterministic."""
    whole = sum(weights)
    if total <= 0 or whole <= 0:
        return [0] * len(weights)
    shares = [total * w / whole for w in weights]
    counts = [int(s) for s in shares]
    left = total - sum(counts)
    for i in sorted(range(len(weights)), key=lambda i: (counts[i] - shares[i], i))[:left]:
        counts[i] += 1
    return counts


def _plans(runs: int, events: int, seed: int, mix: Mapping[str, float]) -> tuple[list[dict[str, Any]], list[int], int]:
    for name, weight in mix.items():
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r} in mix (expected one of {', '.join(SCENARIOS)})")
        if weight < 0:
            raise ValueError(f"mix weight of {name!r} is negative")
    scenarios = run_scenarios(runs, seed, mix)
    if len(scenarios) != runs:
        raise ValueError("mix has no positive weight")
    plans = [_plan(s, random.Random(f"{seed}/plan/{i}")) for i, s in enumerate(scenarios)]
    fixed = sum(p["fixed"] for p in plans)
    minimum = fixed + 2 * sum(p["min_flex"] for p in plans)
    if events < minimum:
        raise ValueError(f"{events} events are too few for {runs} runs of this mix: need at least {minimum}")
    extra, odd = divmod(events - minimum, 2)
    flex = [p["min_flex"] + n for p, n in zip(plans, _allocate(extra, [p["weight"] for p in plans]), strict=True)]
    dangling_run = max(range(runs), key=lambda i: (flex[i], -i)) if odd else -1
    return plans, flex, dangling_run


def run_scenarios(runs: int, seed: int = 1, mix: Mapping[str, float] | None = None) -> list[str]:
    """The scenario of each run, by index (the five-digit tail of its run id)."""
    counts = _allocate(runs, [(DEFAULT_MIX if mix is None else mix).get(name, 0.0) for name in SCENARIOS])
    scenarios = [name for name, n in zip(SCENARIOS, counts, strict=True) for _ in range(n)]
    random.Random(f"{seed}/mix").shuffle(scenarios)
    return scenarios


def generate(
    runs: int,
    events: int,
    seed: int = 1,
    hashes: str = "raw",
    mix: Mapping[str, float] | None = None,
    concurrency: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Exactly `events` wire events of `runs` interleaved runs (see the module doc)."""
    if hashes not in ("raw", "precomputed"):
        raise ValueError(f"hashes must be 'raw' or 'precomputed', not {hashes!r}")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    if hashes == "precomputed":
        _load_engine()
    plans, flex, dangling_run = _plans(runs, events, seed, DEFAULT_MIX if mix is None else mix)
    width = max(1, min(runs, concurrency if concurrency else max(1, runs // 4)))
    sched = random.Random(f"{seed}/schedule")
    active: list[deque[dict[str, Any]]] = []
    started = 0
    emitted = 0

    def start(i: int) -> deque[dict[str, Any]]:
        run = _Run(i, seed, hashes, plans[i])
        _build(run, plans[i], flex[i], i == dangling_run)
        expected = plans[i]["fixed"] + 2 * flex[i] + (i == dangling_run)
        assert len(run.events) == expected, (plans[i], len(run.events), expected)
        return deque(run.events)

    while started < runs and len(active) < width:
        active.append(start(started))
        started += 1
    while active:
        k = sched.randrange(len(active))
        queue = active[k]
        event = queue.popleft()
        event["ts"] = round(_BASE_TS + emitted * 0.004 + sched.random() * 0.003, 3)
        emitted += 1
        yield event
        if not queue:
            if started < runs:
                active[k] = start(started)
                started += 1
            else:
                active[k] = active[-1]
                active.pop()
    assert emitted == events, (emitted, events)


def generate_lines(
    runs: int,
    events: int,
    seed: int = 1,
    hashes: str = "raw",
    mix: Mapping[str, float] | None = None,
    concurrency: int | None = None,
) -> Iterator[bytes]:
    """The same events as compact JSON lines, each ending with a newline."""
    for event in generate(runs, events, seed, hashes, mix, concurrency):
        yield _encode(event) + b"\n"


def _parse_mix(text: str) -> dict[str, float]:
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        mix[name.strip()] = float(weight)
    return mix


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_trace", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hashes", choices=("raw", "precomputed"), default="raw")
    parser.add_argument("--concurrency", type=int, default=None, help="runs in flight at once (default runs // 4)")
    parser.add_argument("--mix", type=_parse_mix, default=None, help="e.g. healthy=0.7,poll=0.1,generic_repeat=0.2")
    parser.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    args = parser.parse_args(argv)
    lines = generate_lines(args.runs, args.events, args.seed, args.hashes, args.mix, args.concurrency)
    if args.output == "-":
        out = sys.stdout.buffer
        for line in lines:
            out.write(line)
        out.flush()
        return 0
    from pathlib import Path

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "wb") as out:
        buffer: list[bytes] = []
        for line in lines:
            buffer.append(line)
            if len(buffer) >= 4096:
                out.write(b"".join(buffer))
                buffer.clear()
        out.write(b"".join(buffer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
