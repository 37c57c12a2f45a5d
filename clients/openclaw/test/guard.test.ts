/**
 * The Guard's bookkeeping, with the broker replaced by a recorder that answers
 * from a script: what is published, once, in order, and what the gateway is told.
 * The real gateway and broker are in tests/openclaw/test_openclaw.py.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import type { Settings } from "../src/config.js";
import { Guard, turnName, vetoResult, type Decision, type Publisher } from "../src/guard.js";

type Event = Record<string, unknown> & { type: string; run_id: string; seq: number };

class Recorder implements Publisher {
  readonly events: Event[] = [];
  guard!: Guard;
  constructor(private readonly answer: (event: Event) => Decision | undefined) {}
  ready(): Promise<void> {
    return Promise.resolve();
  }
  async publish(_runId: string, event: object): Promise<void> {
    const sent = event as Event;
    this.events.push(sent);
    const decision = this.answer(sent);
    if (decision) {
      const verdict = { run_id: sent.run_id, seq: sent.seq, tool_call_id: sent.tool_call_id, tool_name: sent.tool_name,
        decision, level: "none", detector: null, count: 0, message: `${decision} says loopwarden`, warning_key: null, error: null,
        shadow_decision: null, agent_id: "main", ts: 1796187600 };
      setImmediate(() => this.guard.verdict(JSON.stringify(verdict)));
    }
  }
  types(): string[] {
    return this.events.map((event) => event.type);
  }
}

const SETTINGS: Settings = {
  bootstrap: ["127.0.0.1:9"], eventsTopic: "e", decisionsTopic: "d", timeoutMs: 200, failurePolicy: "fail_open", localHashing: false,
  security: { protocol: "PLAINTEXT" },
};
const quiet = { debug() {}, info() {}, warn() {} };

function setUp(answer: (event: Event) => Decision | undefined, settings: Partial<Settings> = {}) {
  const recorder = new Recorder(answer);
  const aborted: string[] = [];
  const guard = new Guard({ ...SETTINGS, ...settings }, recorder, quiet, async (session) => {
    aborted.push(session);
    return true;
  });
  recorder.guard = guard;
  return { recorder, guard, aborted };
}

const ctx = (toolCallId: string, runId = "r1") => ({ runId, toolCallId, agentId: "main", sessionKey: "agent:main:main", sessionId: "s1" });

test("a call asked twice (a second registration's hook) is published once; seq grows", async () => {
  const { recorder, guard } = setUp(() => "allow");
  const [a, b] = await Promise.all([guard.beforeToolCall("read", { p: 1 }, ctx("c1")), guard.beforeToolCall("read", { p: 1 }, ctx("c1"))]);
  assert.equal(a, undefined);
  assert.equal(b, undefined);
  guard.afterToolCall({ content: [] }, undefined, ctx("c1"));
  guard.afterToolCall({ content: [] }, undefined, ctx("c1"));
  await guard.beforeToolCall("read", { p: 2 }, ctx("c2"));
  await new Promise(setImmediate);
  assert.deepEqual(recorder.types(), ["tool_call", "tool_result", "tool_call"]);
  const seqs = recorder.events.map((event) => event.seq);
  assert.deepEqual(seqs, [seqs[0], seqs[0] + 1, seqs[0] + 2]);
  assert.deepEqual(recorder.events[0].args, { p: 1 });
  assert.equal(recorder.events[0].agent_id, "main");
});

test("warn: the warning is handed to the result middleware once", async () => {
  const { guard } = setUp(() => "warn");
  assert.equal(await guard.beforeToolCall("read", {}, ctx("c1")), undefined);
  assert.equal(guard.takeWarning("r1", "c1"), "warn says loopwarden");
  assert.equal(guard.takeWarning("r1", "c1"), undefined);
});

test("block: vetoed with the message; the gateway's error report becomes the loop guard's veto", async () => {
  const { recorder, guard } = setUp(() => "block");
  assert.deepEqual(await guard.beforeToolCall("exec", { command: "x" }, ctx("c1")), { block: true, blockReason: "block says loopwarden" });
  guard.afterToolCall(undefined, "block says loopwarden", ctx("c1"));
  await new Promise(setImmediate);
  const result = recorder.events[1];
  assert.equal(result.error, undefined);
  assert.deepEqual(result.result, {
    content: [{ type: "text", text: "block says loopwarden" }],
    details: { status: "blocked", deniedReason: "tool-loop", reason: "block says loopwarden" },
  });
});

test("block with local hashing: an args hash and the veto kind, no payload", async () => {
  const { recorder, guard } = setUp(() => "block", { localHashing: true });
  await guard.beforeToolCall("process", { action: "poll", sessionId: "secret" }, ctx("c1"));
  guard.afterToolCall(undefined, "blocked", ctx("c1"));
  await new Promise(setImmediate);
  const [call, result] = recorder.events;
  assert.deepEqual(call.args, { action: "poll" });
  assert.match(String(call.args_hash), /^process:[0-9a-f]{64}$/);
  assert.equal(result.args_hash, call.args_hash);
  assert.equal(result.outcome_kind, "veto");
  assert.ok(!("result" in result) && !("result_hash" in result));
});

test("abort: the run is ended once, and later calls are vetoed without being published", async () => {
  const { recorder, guard, aborted } = setUp(() => "abort");
  assert.deepEqual(await guard.beforeToolCall("exec", {}, ctx("c1")), { block: true, blockReason: "abort says loopwarden" });
  assert.deepEqual(await guard.beforeToolCall("exec", {}, ctx("c2")), { block: true, blockReason: "abort says loopwarden" });
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.deepEqual(aborted, ["s1"]);
  assert.deepEqual(recorder.types(), ["tool_call"]);
});

test("an abort on a result (the post-compaction guard) vetoes the run's next call", async () => {
  const { guard, aborted } = setUp((event) => (event.type === "tool_result" ? "abort" : event.type === "tool_call" ? "allow" : undefined));
  await guard.beforeToolCall("exec", {}, ctx("c1"));
  guard.afterToolCall({ content: [] }, undefined, ctx("c1"));
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.deepEqual(await guard.beforeToolCall("exec", {}, ctx("c2")), { block: true, blockReason: "abort says loopwarden" });
  assert.deepEqual(aborted, ["s1"]);
});

test("verdicts of runs this process does not own are ignored", async () => {
  const { guard } = setUp(() => undefined, { timeoutMs: 50, failurePolicy: "fail_closed" });
  const answer = guard.beforeToolCall("exec", {}, ctx("c1"));
  guard.verdict(JSON.stringify({ run_id: "someone-else", seq: 0, decision: "allow" }));
  guard.verdict("not json");
  assert.deepEqual(await answer, {
    block: true,
    blockReason: "loopwarden is unavailable (no verdict within 50 ms); failurePolicy fail_closed blocks this exec call.",
  });
});

test("agent events: duplicates are dropped, a compaction reported twice is published once, the end frees the run", async () => {
  const { recorder, guard } = setUp(() => "allow");
  guard.agentEvent("r1", "lifecycle", 1, { phase: "start" }, "agent:main:main");
  await guard.beforeToolCall("exec", {}, ctx("c1"));
  guard.agentEvent("r1", "compaction", 7, { phase: "end", completed: true, willRetry: true });
  guard.agentEvent("r1", "compaction", 7, { phase: "end", completed: true, willRetry: true });
  guard.afterCompaction(4, "agent:main:main");
  await guard.beforeToolCall("exec", {}, ctx("c2"));
  guard.afterCompaction(4, "agent:main:main"); // the recovery's compaction, named by session only
  guard.agentEvent("r1", "compaction", 9, { phase: "end", completed: true, willRetry: false }); // no retry: its hook follows
  guard.afterCompaction(4, "agent:main:main");
  guard.agentEvent("r1", "lifecycle", 12, { phase: "end" });
  guard.agentEvent("r1", "lifecycle", 12, { phase: "end" });
  guard.agentEvent("r1", "lifecycle", 13, { phase: "error" });
  await new Promise(setImmediate);
  assert.deepEqual(recorder.types(), ["tool_call", "compaction", "tool_call", "compaction", "run_end"]);
});

test("a run that published nothing ends without a run_end", async () => {
  const { recorder, guard } = setUp(() => "allow");
  guard.agentEvent("r9", "lifecycle", 1, { phase: "start" }, "agent:main:x");
  guard.agentEvent("r9", "lifecycle", 2, { phase: "end" });
  await new Promise(setImmediate);
  assert.deepEqual(recorder.events, []);
});

// -- turns (spec loop-detection.md §8.1) ---------------------------------------------------

/** An assistant message as the gateway writes it to the transcript, with its tool calls. */
const response = (responseId: string | undefined, ...calls: [string, string, unknown][]) => ({
  role: "assistant",
  content: [{ type: "text", text: "let me look" }, ...calls.map(([id, name, args]) => ({ type: "toolCall", id, name, arguments: args }))],
  stopReason: "toolUse",
  timestamp: 1796187600000,
  ...(responseId ? { responseId } : {}),
});
const SESSION = "agent:main:main";

test("a turn's calls are all published, in the model's order, before its first call is answered", async () => {
  const { recorder, guard } = setUp(() => "allow");
  guard.noteMessage(response("chatcmpl-1", ["c1", "read", { path: "a" }], ["c2", "exec", { command: "ls" }], ["c3", "read", { path: "b" }]), SESSION);
  assert.equal(await guard.beforeToolCall("read", { path: "a" }, ctx("c1")), undefined);
  // All three went out before the first answer, with the turn's name and each call's own args.
  assert.deepEqual(recorder.events.map((event) => [event.tool_call_id, event.tool_name, event.turn, event.args]), [
    ["c1", "read", "chatcmpl-1", { path: "a" }],
    ["c2", "exec", "chatcmpl-1", { command: "ls" }],
    ["c3", "read", "chatcmpl-1", { path: "b" }],
  ]);
  // The gateway asks about the others afterwards: answered from their verdicts, nothing published again.
  assert.equal(await guard.beforeToolCall("exec", { command: "ls" }, ctx("c2")), undefined);
  assert.equal(await guard.beforeToolCall("read", { path: "b" }, ctx("c3")), undefined);
  assert.equal(recorder.events.length, 3);
  const seqs = recorder.events.map((event) => event.seq);
  assert.deepEqual(seqs, [seqs[0], seqs[0] + 1, seqs[0] + 2]);
});

test("one block in a turn vetoes every call of it; each result is reported as the loop guard's veto", async () => {
  const { recorder, guard } = setUp((event) => (event.type !== "tool_call" ? undefined : event.tool_call_id === "c2" ? "block" : "allow"));
  guard.noteMessage(response("chatcmpl-2", ["c1", "read", { path: "a" }], ["c2", "read", { path: "a" }], ["c3", "read", { path: "a" }]), SESSION);
  const veto = { block: true, blockReason: "block says loopwarden" };
  assert.deepEqual(await guard.beforeToolCall("read", { path: "a" }, ctx("c1")), veto); // allowed alone, vetoed with its turn
  assert.deepEqual(await guard.beforeToolCall("read", { path: "a" }, ctx("c2")), veto);
  assert.deepEqual(await guard.beforeToolCall("read", { path: "a" }, ctx("c3")), veto);
  for (const id of ["c3", "c1", "c2"]) guard.afterToolCall(undefined, "block says loopwarden", ctx(id));
  await new Promise(setImmediate);
  const results = recorder.events.filter((event) => event.type === "tool_result");
  assert.deepEqual(results.map((event) => event.tool_call_id), ["c3", "c1", "c2"]);
  for (const result of results) assert.deepEqual(result.result, vetoResult("block says loopwarden"));
});

test("an abort in a turn vetoes the whole turn and ends the run once", async () => {
  const { recorder, guard, aborted } = setUp((event) => (event.type === "tool_call" ? (event.tool_call_id === "c1" ? "allow" : "abort") : undefined));
  guard.noteMessage(response("chatcmpl-3", ["c1", "read", {}], ["c2", "read", {}]), SESSION);
  const veto = { block: true, blockReason: "abort says loopwarden" };
  assert.deepEqual(await guard.beforeToolCall("read", {}, ctx("c1")), veto);
  assert.deepEqual(await guard.beforeToolCall("read", {}, ctx("c2")), veto);
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.deepEqual(aborted, ["s1"]);
  // A later turn is not published: the run is over.
  guard.noteMessage(response("chatcmpl-4", ["c3", "read", {}]), SESSION);
  assert.deepEqual(await guard.beforeToolCall("read", {}, ctx("c3")), veto);
  assert.deepEqual(recorder.types(), ["tool_call", "tool_call"]);
});

test("a warning in a turn that runs is shown with that call only", async () => {
  const { guard } = setUp((event) => (event.type !== "tool_call" ? undefined : event.tool_call_id === "c2" ? "warn" : "allow"));
  guard.noteMessage(response("chatcmpl-5", ["c1", "read", {}], ["c2", "read", {}]), SESSION);
  assert.equal(await guard.beforeToolCall("read", {}, ctx("c1")), undefined);
  assert.equal(await guard.beforeToolCall("read", {}, ctx("c2")), undefined);
  assert.equal(guard.takeWarning("r1", "c1"), undefined);
  assert.equal(guard.takeWarning("r1", "c2"), "warn says loopwarden");
});

test("a call whose response was not seen is a turn of its own", async () => {
  const { recorder, guard } = setUp(() => "allow");
  await guard.beforeToolCall("read", { path: "a" }, ctx("c9"));
  assert.equal(recorder.events[0].turn, "call:c9");
});

test("a call the gateway refused before asking (a missing tool) is reported from the transcript, once", async () => {
  const { recorder, guard } = setUp((event) => (event.type === "tool_call" ? "allow" : undefined));
  guard.noteMessage(response("chatcmpl-6", ["c1", "run_tests", {}], ["c2", "read", { path: "a" }]), SESSION);
  // The gateway answers c1 itself ("Tool run_tests not found") and asks only about c2.
  assert.equal(await guard.beforeToolCall("read", { path: "a" }, ctx("c2")), undefined);
  guard.afterToolCall({ content: [{ type: "text", text: "A" }] }, undefined, ctx("c2"));
  const missing = { role: "toolResult", toolCallId: "c1", toolName: "run_tests", content: [{ type: "text", text: "Tool run_tests not found" }], isError: true };
  guard.noteMessage(missing, SESSION);
  guard.noteMessage(missing, SESSION);
  guard.noteMessage({ role: "toolResult", toolCallId: "c2", toolName: "read", content: [{ type: "text", text: "A" }], isError: false }, SESSION);
  await new Promise(setImmediate);
  assert.deepEqual(recorder.events.map((event) => [event.type, event.tool_call_id]), [
    ["tool_call", "c1"],
    ["tool_call", "c2"],
    ["tool_result", "c2"],
    ["tool_result", "c1"],
  ]);
  assert.equal(recorder.events[3].error, "Tool run_tests not found");
});

test("a response written twice is one turn; two responses under one id are two turns", async () => {
  const { recorder, guard } = setUp(() => "allow");
  const first = response("same-id", ["c1", "read", {}]);
  guard.noteMessage(first, SESSION);
  guard.noteMessage(first, SESSION);
  await guard.beforeToolCall("read", {}, ctx("c1"));
  guard.noteMessage(response("same-id", ["c2", "read", {}]), SESSION);
  await guard.beforeToolCall("read", {}, ctx("c2"));
  guard.noteMessage(response(undefined, ["c3", "read", {}]), SESSION);
  await guard.beforeToolCall("read", {}, ctx("c3"));
  assert.deepEqual(recorder.events.map((event) => event.turn), ["same-id", "same-id#2", "1796187600000:c3"]);
});

test("a turn's name fits the wire: a long response id is hashed", () => {
  const calls = [{ id: "c1", name: "read", args: {} }];
  assert.equal(turnName({ responseId: "resp_1" }, calls), "resp_1");
  assert.equal(turnName({ turnId: "0199-turn" }, calls), "0199-turn");
  assert.match(turnName({ responseId: "x".repeat(300) }, calls), /^sha256:[0-9a-f]{64}$/);
});

test("without a verdict for one call of a turn, the failure policy decides that call; a block still vetoes the turn", async () => {
  const { guard } = setUp((event) => (event.type !== "tool_call" ? undefined : event.tool_call_id === "c1" ? undefined : "block"), {
    timeoutMs: 50,
  });
  guard.noteMessage(response("chatcmpl-7", ["c1", "read", {}], ["c2", "read", {}]), SESSION);
  assert.deepEqual(await guard.beforeToolCall("read", {}, ctx("c1")), { block: true, blockReason: "block says loopwarden" });
  const open = setUp((event) => (event.type !== "tool_call" ? undefined : event.tool_call_id === "c1" ? undefined : "allow"), { timeoutMs: 50 });
  open.guard.noteMessage(response("chatcmpl-8", ["c1", "read", {}], ["c2", "read", {}]), SESSION);
  assert.equal(await open.guard.beforeToolCall("read", {}, ctx("c1")), undefined); // fail_open: it runs
  assert.equal(await open.guard.beforeToolCall("read", {}, ctx("c2")), undefined);
});
