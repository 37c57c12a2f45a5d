/**
 * Local hashing against the golden vectors the Python engine writes
 * (tests/vectors/hashing.json), and, where loopwarden's rules are the
 * reference gateway's, against the reference's own module.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

import { argsHash, classify, minimalArgs, resultOutcome, toWire, type Json } from "../src/hashing.js";

interface Case {
  name: string;
  spec: string;
  tool: string;
  args?: string;
  result?: string;
  error?: string;
  expected: Record<string, Json>;
}

const VECTORS = new URL("../../../../tests/vectors/hashing.json", import.meta.url);
const cases = (JSON.parse(readFileSync(VECTORS, "utf8")) as { cases: Case[] }).cases;

function payload(text: string | undefined): Json | undefined {
  return text === undefined ? undefined : toWire(JSON.parse(text));
}

/** Every field the plugin publishes for the case, as the wire names them. */
function published(c: Case): Record<string, unknown> {
  const args = payload(c.args);
  const fields: Record<string, unknown> = { args_hash: argsHash(c.tool, args), args: minimalArgs(c.tool, args) };
  if (c.result !== undefined || c.error !== undefined) {
    Object.assign(fields, resultOutcome(c.tool, classify(c.tool, args), payload(c.result), payload(c.error)));
  }
  return fields;
}

test("the vectors cover every rule", () => {
  assert.ok(cases.length >= 50, `only ${cases.length} cases`);
  for (const spec of ["3", "7.1-markers", "7.1-write", "7.1-exec"]) {
    assert.ok(cases.some((c) => c.spec === spec), `no case for ${spec}`);
  }
});

for (const c of cases) {
  test(`vector: ${c.name}`, () => {
    const got = published(c);
    for (const [field, want] of Object.entries(c.expected)) {
      assert.deepEqual(got[field] ?? null, want, `${c.name}: ${field}`);
    }
  });
}

// -- the reference gateway's own hashing -------------------------------------------------

interface ReferenceRecord {
  resultHash?: string;
  outcomeKind?: string;
  failureIdentityHash?: string;
  noProgress?: boolean;
  unknownToolName?: string;
}
interface ReferenceModule {
  n: (tool: string, params: unknown) => string;
  i: (state: object, params: object) => ReferenceRecord | undefined;
}

const referenceDir = process.env.LOOPWARDEN_OPENCLAW_DIR;
const KINDS: Record<string, string> = { "tool-loop-veto": "veto", "terminal-exec-failure": "terminal_failure" };

async function reference(): Promise<ReferenceModule> {
  const dist = join(referenceDir as string, "dist");
  const file = readdirSync(dist).find((name) => /^tool-loop-detection-[\w-]+\.mjs$/.test(name));
  assert.ok(file, `no tool-loop-detection module in ${dist}`);
  return (await import(pathToFileURL(join(dist, file)).href)) as ReferenceModule;
}

// update_plan keeps the shape rule of spec §3; a payload with lone surrogates is hashed by the
// reference before the drop that the engine applies on decoding.
const SAME_AS_REFERENCE = cases.filter((c) => c.tool !== "update_plan" && !/\\ud[89a-f]/i.test(`${c.args}${c.result}`));

test("the reference gateway hashes like the plugin", { skip: !referenceDir && "LOOPWARDEN_OPENCLAW_DIR is not set" }, async () => {
  const ref = await reference();
  for (const c of SAME_AS_REFERENCE) {
    const args = payload(c.args);
    assert.equal(ref.n(c.tool, args), argsHash(c.tool, args), `${c.name}: args_hash`);
    if (c.result === undefined && c.error === undefined) continue;
    const record = ref.i({}, { toolName: c.tool, toolParams: args, toolCallId: "c1", result: payload(c.result), error: payload(c.error) });
    const ours = resultOutcome(c.tool, classify(c.tool, args), payload(c.result), payload(c.error));
    assert.deepEqual(
      {
        result_hash: ours.result_hash,
        unknown_tool_name: ours.unknown_tool_name,
        outcome_kind: ours.outcome_kind,
        failure_identity: ours.failure_identity,
        no_progress: ours.no_progress,
      },
      {
        result_hash: record?.resultHash,
        unknown_tool_name: record?.unknownToolName,
        outcome_kind: record?.outcomeKind && KINDS[record.outcomeKind],
        failure_identity: record?.failureIdentityHash,
        no_progress: record?.noProgress,
      },
      c.name,
    );
  }
});

test("fresh untrusted-content ids, times, pids and durations leave the identity alone", () => {
  const byName = (name: string) => published(cases.find((c) => c.name === name) as Case).result_hash;
  assert.equal(byName("untrusted content markers"), byName("untrusted content markers, fresh ids"));
  const failures = ["terminal exec failure", "terminal exec failure, other times/pids/durations"].map((name) =>
    published(cases.find((c) => c.name === name) as Case),
  );
  assert.notEqual(failures[0].result_hash, failures[1].result_hash);
  assert.equal(failures[0].failure_identity, failures[1].failure_identity);
});
