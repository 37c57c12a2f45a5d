// Drives the loop detector of the published `openclaw` package the way its gateway does, over
// loopwarden's wire events (spec section 6), and prints one verdict per tool call.
//
//   node openclaw_harness.mjs --openclaw DIR [--realised FILE] [EVENTS.jsonl | -]
//
// DIR is the installed package (node_modules/openclaw). Per tool call, as the gateway's single-call
// admission (src/agents/tool-loop-admission.ts) does: detect against the run's history; a critical
// result blocks, and the blocked call is recorded as the gateway records its own veto result
// (recordToolCallOutcome with details {status: "blocked", deniedReason: "tool-loop"}); otherwise the
// warning is delivered only when its bucket (count // 10 per warning key) rises, and the call is
// recorded. A tool result is recorded with the arguments of its call. History and buckets are kept
// per run, and run_end frees them.
//
// Each call is judged five times, on five copies of the run's state: by the package as published
// ("reference"), and by the package with spec section 7.4's rules applied to its own source: veto
// records skipped in the unknown-tool streak ("unknownSkip"), in the ping-pong evidence
// ("pingPongSkip"); by the package as published with spec section 8.2's latches kept around it
// ("latch": a loop the module blocked stays blocked until a call it allowed runs to a real
// outcome); and with all three ("spec"). The published module's source is patched at load time,
// and the latches are kept here, beside the module, so a verdict that differs between "reference"
// and "spec" is caused by exactly those lines.
//
// Trace events are what happened at the gateway. When "spec" blocks a call that the trace answers
// with a real result, the harness answers it with the gateway's veto result instead (the tool never
// ran), and --realised writes the events as they then are, for loopwarden to read the same run.
import { createReadStream, createWriteStream, readFileSync, readdirSync, mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { createInterface } from "node:readline";

const HARNESS = "openclaw-harness";

function fail(message) {
  process.stderr.write(`${HARNESS}: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { openclaw: null, realised: null, input: "-" };
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg === "--openclaw") opts.openclaw = argv[++i];
    else if (arg === "--realised") opts.realised = argv[++i];
    else if (arg.startsWith("--")) fail(`unknown option ${arg}`);
    else opts.input = arg;
  }
  if (!opts.openclaw) fail("--openclaw DIR (the installed openclaw package) is required");
  return opts;
}

/** The dist file whose `//#region src/...` marker names this source, and its text. */
function distModule(dist, prefix, region) {
  const matches = readdirSync(dist)
    .filter((name) => name.startsWith(prefix) && name.endsWith(".mjs"))
    .map((name) => ({ path: join(dist, name), text: readFileSync(join(dist, name), "utf8") }))
    .filter((file) => file.text.includes(`//#region ${region}\n`));
  if (matches.length !== 1) fail(`expected one ${prefix}*.mjs with region ${region} in ${dist}, found ${matches.length}`);
  return matches[0];
}

/** Original export name -> minified alias, from the module's `export { name as alias, ... }`. */
function exportAliases(text, file) {
  const line = text.match(/^export \{([^}]*)\};?\s*$/m);
  if (!line) fail(`no export list in ${file}`);
  const aliases = new Map();
  for (const part of line[1].split(",")) {
    const [name, alias] = part.trim().split(/\s+as\s+/);
    aliases.set(name, alias ?? name);
  }
  return aliases;
}

function bound(module, aliases, name, file) {
  const fn = module[aliases.get(name)];
  if (typeof fn !== "function") fail(`${file} does not export ${name}`);
  return fn;
}

// Section 7.4, written against the published source. Each edit must apply exactly once, so a
// package whose source moved fails loudly instead of silently testing the unpatched code.
const UNKNOWN_STREAK_LOOP = "\t\tif (!record || record.toolName !== toolName || !record.unknownToolName) break;\n";
const PING_PONG_EVIDENCE = "\t\tif (!call) continue;\n\t\tif (!call.resultHash) {\n\t\t\tnoProgressEvidence = false;";
const RULES = {
  unknownSkip: [
    UNKNOWN_STREAK_LOOP,
    `\t\tif (record && record.toolName === toolName && record.outcomeKind === "tool-loop-veto") continue;\n${UNKNOWN_STREAK_LOOP}`,
  ],
  pingPongSkip: [
    PING_PONG_EVIDENCE,
    PING_PONG_EVIDENCE.replace("if (!call) continue;", 'if (!call || call.outcomeKind === "tool-loop-veto") continue;'),
  ],
};

function patched(source, rules, dist) {
  let text = source.text.replace(/from "\.\/([^"]+)"/g, (_, name) => `from ${JSON.stringify(pathToFileURL(join(dist, name)).href)}`);
  text = text.replace(/import "\.\/([^"]+)"/g, (_, name) => `import ${JSON.stringify(pathToFileURL(join(dist, name)).href)}`);
  for (const rule of rules) {
    const [from, to] = RULES[rule];
    const count = text.split(from).length - 1;
    if (count !== 1) fail(`rule ${rule}: the text it edits occurs ${count} times in ${source.path}, not once`);
    text = text.replace(from, to);
  }
  return text;
}

async function loadDetectors(openclaw) {
  const dist = join(openclaw, "dist");
  const source = distModule(dist, "tool-loop-detection-", "src/agents/tool-loop-detection.ts");
  const aliases = exportAliases(source.text, source.path);
  const scratch = mkdtempSync(join(tmpdir(), `${HARNESS}-`));
  const modes = {};
  try {
    const variants = {
      reference: [],
      unknownSkip: ["unknownSkip"],
      pingPongSkip: ["pingPongSkip"],
      latch: [],
      spec: ["unknownSkip", "pingPongSkip"],
    };
    for (const [mode, rules] of Object.entries(variants)) {
      let url = pathToFileURL(source.path).href;
      if (rules.length) {
        const file = join(scratch, `${mode}.mjs`);
        writeFileSync(file, patched(source, rules, dist));
        url = pathToFileURL(file).href;
      }
      const module = await import(url);
      modes[mode] = {
        detect: bound(module, aliases, "detectToolCallLoop", source.path),
        recordCall: bound(module, aliases, "recordToolCall", source.path),
        recordOutcome: bound(module, aliases, "recordToolCallOutcome", source.path),
        hashCall: bound(module, aliases, "hashToolCall", source.path),
        latches: mode === "latch" || mode === "spec",
      };
    }
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
  const policy = distModule(dist, "agent-tools.before-tool-call-", "src/agents/tool-loop-admission.ts");
  const constant = (name) => {
    const found = policy.text.match(new RegExp(`const ${name} = (\\d+);`));
    if (!found) fail(`${name} not found in ${policy.path}`);
    return Number(found[1]);
  };
  const buckets = { size: constant("LOOP_WARNING_BUCKET_SIZE"), maxKeys: constant("MAX_LOOP_WARNING_KEYS") };
  const names = distModule(dist, "tool-policy-shared-", "src/agents/tool-policy-shared.ts");
  const normalizeToolName = bound(await import(pathToFileURL(names.path).href), exportAliases(names.text, names.path), "normalizeToolPolicyName", names.path);
  return { modes, buckets, normalizeToolName };
}

/** The gateway's shouldEmitLoopWarning: deliver when count // size rises above the key's bucket. */
function shouldEmit(state, key, count, buckets) {
  const bucket = Math.floor(count / buckets.size);
  if (bucket <= (state.buckets.get(key) ?? 0)) return false;
  state.buckets.set(key, bucket);
  for (const oldest of state.buckets.keys()) {
    if (state.buckets.size <= buckets.maxKeys) break;
    state.buckets.delete(oldest);
  }
  return true;
}

const CONFIG = { enabled: true };

function isLoopVeto(result) {
  const details = result && typeof result === "object" ? result.details : undefined;
  return !!details && details.status === "blocked" && details.deniedReason === "tool-loop";
}

/** What the gateway's buildBlockedToolResult hands the model for a vetoed call. */
function vetoResult(reason) {
  return { content: [{ type: "text", text: reason }], details: { status: "blocked", deniedReason: "tool-loop", reason } };
}

function verdictOf(found, delivered) {
  if (!found.stuck) return { decision: "allow", level: "none", detector: null, count: 0, warning_key: null, paired_tool_name: null };
  return {
    decision: found.level === "critical" ? "block" : delivered ? "warn" : "allow",
    level: found.level,
    detector: found.detector,
    count: found.count,
    warning_key: found.warningKey ?? null,
    paired_tool_name: found.pairedToolName ?? null,
    message: found.message,
  };
}

/**
 * Section 8.2: the latch a block by the module sets. It covers calls of the blocked tool with its
 * args hash (any args of a missing tool) and, for a ping-pong, the run's newest record's side.
 */
function latchFor(found, tool, argsHash, history) {
  const newest = history.at(-1);
  const paired = found.detector === "ping_pong" && newest ? { tool: newest.toolName, argsHash: newest.argsHash } : null;
  return {
    verdict: { detector: found.detector, count: found.count, warningKey: found.warningKey ?? null, pairedToolName: found.pairedToolName ?? null },
    tool,
    argsHash: found.detector === "unknown_tool_repeat" ? null : argsHash,
    paired,
  };
}

function covers(latch, tool, argsHash) {
  if (tool === latch.tool && (latch.argsHash === null || argsHash === latch.argsHash)) return true;
  return latch.paired !== null && tool === latch.paired.tool && argsHash === latch.paired.argsHash;
}

class Run {
  constructor(modeNames) {
    this.states = Object.fromEntries(
      modeNames.map((m) => [m, { toolCallHistory: [], buckets: new Map(), blocked: new Set(), latches: [], finished: new Set() }]),
    );
    this.calls = new Map(); // tool_call_id -> {tool, args}, the arguments a result is recorded with
    this.specBlocked = new Map(); // tool_call_id -> reason, for calls the "spec" mode vetoed
  }
}

function main(opts, detectors) {
  const modeNames = Object.keys(detectors.modes);
  const runs = new Map();
  const lastSeq = new Map();
  const out = process.stdout;
  const realised = opts.realised ? createWriteStream(opts.realised) : null;
  let lineNo = 0;
  let errors = 0;
  const unnormalisedNames = new Map();

  const refuse = (message) => {
    errors += 1;
    process.stderr.write(`${HARNESS}: line ${lineNo}: ${message}\n`);
  };

  const onCall = (run, event) => {
    const tool = event.tool_name;
    const gatewayName = detectors.normalizeToolName(tool);
    if (gatewayName !== tool) unnormalisedNames.set(tool, gatewayName);
    const args = event.args;
    run.calls.set(event.tool_call_id, { tool, args });
    const verdicts = {};
    for (const mode of modeNames) {
      const d = detectors.modes[mode];
      const state = run.states[mode];
      let found = d.detect(state, tool, args, CONFIG, { runId: event.run_id });
      let delivered = false;
      const argsHash = d.latches ? d.hashCall(tool, args) : null;
      if (found.stuck && found.level === "critical") {
        if (d.latches) {
          const latch = latchFor(found, tool, argsHash, state.toolCallHistory);
          state.latches = state.latches.filter((kept) => kept.verdict.warningKey !== latch.verdict.warningKey).concat([latch]);
        }
      } else if (d.latches) {
        const latch = state.latches.findLast((kept) => covers(kept, tool, argsHash));
        if (latch) found = { stuck: true, level: "critical", ...latch.verdict, message: `still blocked (${latch.verdict.detector})` };
      }
      if (found.stuck && found.level === "critical") {
        state.blocked.add(event.tool_call_id);
        d.recordOutcome(state, { toolName: tool, toolParams: args, toolCallId: event.tool_call_id, result: vetoResult(found.message), config: CONFIG, runId: event.run_id });
        if (mode === "spec") run.specBlocked.set(event.tool_call_id, found.message);
      } else {
        if (found.stuck) delivered = shouldEmit(state, found.warningKey ?? `${found.detector}:${tool}`, found.count, detectors.buckets);
        d.recordCall(state, tool, args, event.tool_call_id, CONFIG, { runId: event.run_id });
      }
      verdicts[mode] = verdictOf(found, delivered);
    }
    const reference = verdicts.reference;
    const line = {
      run_id: event.run_id, seq: event.seq, tool_call_id: event.tool_call_id, tool_name: tool,
      ...reference,
      modes: { spec: verdicts.spec, unknownSkip: verdicts.unknownSkip, pingPongSkip: verdicts.pingPongSkip, latch: verdicts.latch },
    };
    out.write(`${JSON.stringify(line)}\n`);
  };

  const onResult = (run, event) => {
    const reason = run.specBlocked.get(event.tool_call_id);
    if (reason !== undefined && (event.error !== undefined || !isLoopVeto(event.result))) {
      // the gateway never ran the call it vetoed; its answer is the veto result
      delete event.error;
      event.result = vetoResult(reason);
    }
    const call = run.calls.get(event.tool_call_id);
    const tool = event.tool_name;
    const args = "args" in event ? event.args : call && call.tool === tool ? call.args : undefined;
    const veto = event.error === undefined && isLoopVeto(event.result);
    for (const mode of modeNames) {
      const state = run.states[mode];
      const allowedCall = call !== undefined && !state.blocked.has(event.tool_call_id) && !state.finished.has(event.tool_call_id);
      if (allowedCall && !veto) state.latches = []; // a call this mode let run reached a real outcome
      if (call !== undefined) state.finished.add(event.tool_call_id);
      if (state.blocked.has(event.tool_call_id) && veto) continue; // recorded when blocked
      detectors.modes[mode].recordOutcome(state, {
        toolName: tool, toolParams: args, toolCallId: event.tool_call_id,
        result: event.result, error: event.error, config: CONFIG, runId: event.run_id,
      });
    }
  };

  const input = opts.input === "-" ? process.stdin : createReadStream(opts.input);
  const lines = createInterface({ input, crlfDelay: Infinity });
  lines.on("line", (text) => {
    lineNo += 1;
    if (!text.trim()) return;
    let event;
    try {
      event = JSON.parse(text);
    } catch (exc) {
      refuse(`not JSON: ${exc.message}`);
      return;
    }
    if (!event || typeof event !== "object" || typeof event.run_id !== "string" || !Number.isInteger(event.seq)) {
      refuse("an event needs a string run_id and an integer seq");
      return;
    }
    const previous = lastSeq.get(event.run_id);
    const duplicate = previous !== undefined && event.seq <= previous;
    if (!duplicate) {
      lastSeq.set(event.run_id, event.seq);
      let run = runs.get(event.run_id);
      if (!run && event.type !== "run_end") runs.set(event.run_id, (run = new Run(modeNames)));
      if (event.type === "tool_call" || event.type === "tool_result") {
        if (event.args_hash !== undefined || event.result_hash !== undefined) {
          refuse(`${event.type} ${event.tool_call_id} carries a precomputed hash; the reference hashes raw args and results only`);
        } else if (event.type === "tool_call") onCall(run, event);
        else onResult(run, event);
      } else if (event.type === "run_end") {
        runs.delete(event.run_id);
      } else if (event.type !== "compaction") {
        // the post-compaction guard is not part of the detector module; compaction changes no history
        refuse(`unknown event type ${JSON.stringify(event.type)}`);
      }
    }
    if (realised) realised.write(`${JSON.stringify(event)}\n`);
  });
  lines.on("close", () => {
    for (const [name, gateway] of unnormalisedNames) {
      process.stderr.write(`${HARNESS}: note: the gateway would name tool ${JSON.stringify(name)} ${JSON.stringify(gateway)} before detection; it was judged as given\n`);
    }
    const finish = () => process.exit(errors ? 1 : 0);
    if (realised) realised.end(finish);
    else finish();
  });
}

// The detector logs every warning and block to stderr; a verdict stream has no use for them.
const writeErr = process.stderr.write.bind(process.stderr);
process.stderr.write = (chunk, ...rest) =>
  String(chunk).includes("[agents/loop-detection]") ? true : writeErr(chunk, ...rest);

const opts = parseArgs(process.argv.slice(2));
main(opts, await loadDetectors(opts.openclaw));
