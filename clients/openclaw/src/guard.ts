/**
 * What the plugin does with a gateway's runs: numbers their events, publishes
 * them, waits for each call's verdict and turns it into the gateway's answer.
 *
 * One Guard per process (OpenClaw calls register() several times, and agent
 * events can arrive twice): every entry point is idempotent per tool call id
 * and per agent event.
 */

import { randomUUID } from "node:crypto";

import type { Settings } from "./config.js";
import { argsHash, classify, minimalArgs, resultOutcome, toWire, type Json } from "./hashing.js";
import type { Log } from "./bus.js";

export type Decision = "allow" | "warn" | "block" | "abort";

/** A verdict as loopwarden publishes it (spec §6). */
export interface Verdict {
  run_id: string;
  seq: number;
  tool_call_id: string;
  tool_name: string;
  decision: Decision;
  level: string;
  detector: string | null;
  count: number;
  message: string;
  warning_key: string | null;
  error: string | null;
  /** The run's agent and the deciding event's ts: for loopwarden's aggregates across runs, unused here. */
  agent_id?: string | null;
  ts?: number | string | null;
}

export interface Publisher {
  publish(runId: string, event: object): Promise<void>;
  ready(): Promise<void>;
}

/** What the gateway is told to do with a call. */
export type Answer = { block: true; blockReason: string } | undefined;

export interface CallContext {
  runId?: string;
  toolCallId?: string;
  agentId?: string;
  sessionKey?: string;
  sessionId?: string;
}

interface Call {
  seq: number;
  toolName: string;
  args: unknown;
  /** The loop guard's (or the fallback policy's) veto reason, when the call did not run. */
  vetoed?: string;
  /** Shown to the model with the call's result. */
  warning?: string;
  answer?: Promise<Answer>;
  reported?: boolean;
}

interface Run {
  nextSeq: number;
  calls: Map<string, Call>;
  seenAgentEvents: Set<string>;
  /** A compaction was published and no call since: another report of it is the same compaction. */
  compactionArmed: boolean;
  /** The gateway announced a compaction that does not retry; its after_compaction hook follows. */
  skipCompactionHook: boolean;
  sessionKeys: Set<string>;
  aborted?: Verdict;
  sessionId?: string;
  published: boolean;
  /** Publishes in order: a run's events must reach the topic in seq order. */
  tail: Promise<void>;
}

type Waiter = (verdict: Verdict) => void;

/** Ends a run in the gateway; false when the gateway had no such run. */
export type RunAborter = (sessionId: string) => Promise<boolean>;

const nowSeconds = (): number => Date.now() / 1000;

export class Guard {
  private readonly runs = new Map<string, Run>();
  private readonly waiters = new Map<string, Waiter>();
  /** Session key or id -> the run now active in it, for hooks that do not carry a run id. */
  private readonly sessions = new Map<string, string>();
  log: Log;

  constructor(
    readonly settings: Settings,
    private readonly bus: Publisher,
    log: Log,
    private readonly abortRun: RunAborter,
  ) {
    this.log = log;
  }

  private run(runId: string): Run {
    let run = this.runs.get(runId);
    if (!run) {
      // A run id can come back (the CLI reuses the session id): seq starts from
      // the clock so that a new run's events are never taken for old duplicates.
      run = {
        nextSeq: Date.now() * 1000,
        calls: new Map(),
        seenAgentEvents: new Set(),
        compactionArmed: false,
        skipCompactionHook: false,
        sessionKeys: new Set(),
        published: false,
        tail: Promise.resolve(),
      };
      this.runs.set(runId, run);
    }
    return run;
  }

  private send(runId: string, run: Run, body: Record<string, unknown>): { seq: number; sent: Promise<void> } {
    const seq = run.nextSeq++;
    const event = { ...body, run_id: runId, seq, ts: nowSeconds() };
    run.published = true;
    const sent = run.tail.then(() => this.bus.publish(runId, event));
    run.tail = sent.catch(() => undefined);
    return { seq, sent };
  }

  /** Publish an event nobody waits on; a failure is logged, the gateway carries on. */
  private notify(runId: string, run: Run, body: Record<string, unknown>): void {
    this.send(runId, run, body).sent.catch((error: Error) =>
      this.log.warn(`loopwarden: ${body.type} for run=${runId} not published: ${error.message}`),
    );
  }

  // -- tool calls -------------------------------------------------------------

  /** before_tool_call: publish the call and answer with its verdict. */
  beforeToolCall(toolName: string, params: unknown, ctx: CallContext): Promise<Answer> {
    const runId = ctx.runId;
    if (!runId) return Promise.resolve(undefined);
    const run = this.run(runId);
    if (ctx.sessionId) run.sessionId = ctx.sessionId;
    this.bindSession(runId, run, ctx.sessionKey, ctx.sessionId);
    const toolCallId = ctx.toolCallId ?? `lw-${randomUUID()}`;
    const known = run.calls.get(toolCallId);
    if (known?.answer) return known.answer;
    if (run.aborted) {
      // The run was aborted: every later call is vetoed without asking, and not published.
      return Promise.resolve({ block: true, blockReason: run.aborted.message });
    }
    const call: Call = { seq: -1, toolName, args: params };
    run.calls.set(toolCallId, call);
    call.answer = this.ask(runId, run, toolCallId, call, ctx);
    return call.answer;
  }

  private async ask(runId: string, run: Run, toolCallId: string, call: Call, ctx: CallContext): Promise<Answer> {
    const body: Record<string, unknown> = { type: "tool_call", tool_call_id: toolCallId, tool_name: call.toolName };
    Object.assign(body, this.argsFields(call.toolName, call.args));
    if (ctx.agentId) body.agent_id = ctx.agentId;
    if (ctx.sessionKey) body.session_key = ctx.sessionKey;
    const started = Date.now();
    let timer: NodeJS.Timeout | undefined;
    let key = "";
    let late = false;
    const verdict = await new Promise<Verdict | string>((resolve) => {
      timer = setTimeout(() => {
        late = true;
        resolve("timeout");
      }, this.settings.timeoutMs);
      this.bus.ready().then(() => {
        if (late) return; // answered by the policy already: nothing to wait for
        const { seq, sent } = this.send(runId, run, body);
        run.compactionArmed = false;
        call.seq = seq;
        key = waiterKey(runId, seq);
        this.waiters.set(key, resolve);
        sent.catch((error: Error) => resolve(`publish failed: ${error.message}`));
      });
    });
    clearTimeout(timer);
    this.waiters.delete(key);
    const waitedMs = Date.now() - started;
    if (typeof verdict === "string") return this.fallback(runId, call, verdict, waitedMs);
    // Healthy calls stay out of the operator's log; the round trip is there at debug level.
    this.log.debug(`loopwarden: verdict run=${runId} seq=${call.seq} tool=${call.toolName} decision=${verdict.decision} waited_ms=${waitedMs}`);
    return this.obey(runId, run, call, verdict, ctx);
  }

  private fallback(runId: string, call: Call, reason: string, waitedMs: number): Answer {
    const policy = this.settings.failurePolicy;
    const why = reason === "timeout" ? `no verdict within ${this.settings.timeoutMs} ms` : reason;
    const effect = policy === "fail_open" ? "the call runs" : "the call is blocked";
    this.log.warn(
      `loopwarden: ${why} for run=${runId} seq=${call.seq} tool=${call.toolName} after ${waitedMs} ms: ${policy} applied, ${effect}`,
    );
    if (policy === "fail_open") return undefined;
    call.vetoed = `loopwarden is unavailable (${why}); failurePolicy fail_closed blocks this ${call.toolName} call.`;
    return { block: true, blockReason: call.vetoed };
  }

  private obey(runId: string, run: Run, call: Call, verdict: Verdict, ctx: CallContext): Answer {
    switch (verdict.decision) {
      case "allow":
        return undefined;
      case "warn":
        call.warning = verdict.message;
        return undefined;
      case "abort":
        this.markAborted(runId, run, verdict, ctx.sessionId);
        call.vetoed = verdict.message;
        return { block: true, blockReason: verdict.message };
      default:
        call.vetoed = verdict.message;
        return { block: true, blockReason: verdict.message };
    }
  }

  private markAborted(runId: string, run: Run, verdict: Verdict, sessionId: string | undefined): void {
    if (run.aborted) return;
    run.aborted = verdict;
    const session = sessionId ?? run.sessionId;
    this.log.warn(`loopwarden: run=${runId} aborted (${verdict.error ?? verdict.detector}): later calls are vetoed`);
    if (!session) return;
    // Let the vetoed call's result reach the transcript first, then end the run.
    setTimeout(() => {
      this.abortRun(session).then(
        (ended) => this.log.info(`loopwarden: run=${runId} ${ended ? "ended" : "was no longer active"} (session ${session})`),
        (error: Error) => this.log.warn(`loopwarden: could not end run=${runId}: ${error.message}`),
      );
    }, 0).unref();
  }

  /** The warning for this call, once, for the tool-result middleware to show the model. */
  takeWarning(runId: string | undefined, toolCallId: string): string | undefined {
    const call = runId ? this.runs.get(runId)?.calls.get(toolCallId) : undefined;
    const warning = call?.warning;
    if (call) call.warning = undefined;
    return warning;
  }

  // -- results ------------------------------------------------------------------

  /** after_tool_call: publish the outcome of a call this plugin published. */
  afterToolCall(result: unknown, error: string | undefined, ctx: CallContext): void {
    const run = ctx.runId ? this.runs.get(ctx.runId) : undefined;
    const call = ctx.toolCallId ? run?.calls.get(ctx.toolCallId) : undefined;
    if (!run || !call || call.seq < 0 || call.reported) return;
    call.reported = true;
    const body: Record<string, unknown> = { type: "tool_result", tool_call_id: ctx.toolCallId, tool_name: call.toolName };
    Object.assign(body, this.argsFields(call.toolName, call.args));
    const veto = call.vetoed ?? run.aborted?.message;
    if (veto !== undefined) {
      // The gateway reports a veto (or a call cut short by the run's abort) as
      // an error; the engine must see a veto, which is not progress (§3, §7.1).
      Object.assign(body, this.outcomeFields(call, vetoResult(veto), undefined));
    } else {
      Object.assign(body, this.outcomeFields(call, result, error));
    }
    this.notify(ctx.runId as string, run, body);
  }

  private argsFields(toolName: string, args: unknown): Record<string, unknown> {
    if (!this.settings.localHashing) return args === undefined ? {} : { args };
    const wire = toWire(args);
    const small = minimalArgs(toolName, wire);
    return { args_hash: argsHash(toolName, wire), ...(small === undefined ? {} : { args: small }) };
  }

  private outcomeFields(call: Call, result: unknown, error: string | undefined): Record<string, unknown> {
    if (!this.settings.localHashing) return error !== undefined ? { error } : result === undefined ? {} : { result };
    const args = toWire(call.args);
    return { ...resultOutcome(call.toolName, classify(call.toolName, args), toWire(result), toWire(error)) };
  }

  // -- agent events and compaction --------------------------------------------------

  private bindSession(runId: string, run: Run, ...keys: (string | undefined)[]): void {
    for (const key of keys) {
      if (!key) continue;
      this.sessions.set(key, runId);
      run.sessionKeys.add(key);
    }
  }

  /**
   * Agent events: `lifecycle` start binds the session to the run, end or error
   * ends the run; `compaction` end with willRetry is a compaction that retries
   * the turn. Events can arrive twice: each (stream, seq) is handled once.
   */
  agentEvent(runId: string, stream: string, eventSeq: number, data: Record<string, unknown>, sessionKey?: string, agentId?: string): void {
    if (stream !== "lifecycle" && stream !== "compaction") return;
    const run = this.runs.get(runId) ?? (stream === "lifecycle" && data.phase === "start" ? this.run(runId) : undefined);
    if (!run) return;
    const key = `${stream}:${eventSeq}`;
    if (run.seenAgentEvents.has(key)) return;
    run.seenAgentEvents.add(key);
    if (stream === "lifecycle") {
      if (data.phase === "start") this.bindSession(runId, run, sessionKey);
      else if (data.phase === "end" || data.phase === "error") this.endRun(runId, run);
    } else if (data.phase === "end" && data.willRetry === true) {
      this.compaction(runId, run, agentId);
    } else if (data.phase === "end" && data.completed === true) {
      run.skipCompactionHook = true;
    }
  }

  /**
   * after_compaction: the gateway's overflow and timeout recovery compacts and
   * retries the turn without a compaction agent event, and its hook carries
   * no run id: the session names the run.
   */
  afterCompaction(compactedCount: number | undefined, sessionKey?: string, sessionId?: string, agentId?: string): void {
    const runId = (sessionKey && this.sessions.get(sessionKey)) || (sessionId && this.sessions.get(sessionId));
    const run = runId ? this.runs.get(runId) : undefined;
    if (!runId || !run) return;
    if (run.skipCompactionHook) {
      run.skipCompactionHook = false;
      return;
    }
    if (compactedCount !== 0) this.compaction(runId, run, agentId);
  }

  private compaction(runId: string, run: Run, agentId: string | undefined): void {
    if (run.compactionArmed) return;
    run.compactionArmed = true;
    this.notify(runId, run, { type: "compaction", ...(agentId ? { agent_id: agentId } : {}) });
  }

  private endRun(runId: string, run: Run): void {
    if (run.published) {
      this.notify(runId, run, { type: "run_end" });
    }
    for (const key of run.sessionKeys) if (this.sessions.get(key) === runId) this.sessions.delete(key);
    this.runs.delete(runId);
  }

  // -- verdicts -------------------------------------------------------------------

  /** A record from the decisions topic: verdicts of runs this process does not own are ignored. */
  verdict(value: string): void {
    let verdict: Verdict;
    try {
      verdict = JSON.parse(value) as Verdict;
    } catch {
      return;
    }
    const run = this.runs.get(verdict.run_id);
    if (!run) return;
    const waiter = this.waiters.get(waiterKey(verdict.run_id, verdict.seq));
    if (waiter) {
      this.waiters.delete(waiterKey(verdict.run_id, verdict.seq));
      waiter(verdict);
    } else if (verdict.decision === "abort") {
      // The post-compaction guard answers a result, which nobody waits for.
      this.markAborted(verdict.run_id, run, verdict, undefined);
    }
  }
}

function waiterKey(runId: string, seq: number): string {
  return `${runId}\u0000${seq}`;
}

/** What the model is given for a vetoed call, as the gateway itself builds it. */
export function vetoResult(reason: string): Json {
  return { content: [{ type: "text", text: reason }], details: { status: "blocked", deniedReason: "tool-loop", reason } };
}
