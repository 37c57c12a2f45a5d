/**
 * What the plugin does with a gateway's runs: numbers their events, publishes
 * them, waits for each call's verdict and turns it into the gateway's answer.
 *
 * Calls are admitted turn by turn (spec loop-detection.md §8.1): the gateway
 * writes the model's response (one assistant message and all its tool calls)
 * to the transcript before it prepares the first call, so when the first call
 * of a turn is asked about, every call of the turn is published, in the
 * model's order, and none is answered before every verdict of the turn is in.
 * A block or abort for any of them vetoes them all.
 *
 * One Guard per process (OpenClaw calls register() several times, and agent
 * events can arrive twice): every entry point is idempotent per tool call id
 * and per agent event.
 */

import { createHash, randomUUID } from "node:crypto";

import type { Settings } from "./config.js";
import type { Event, EventBody, ToolCallBody, ToolCallEvent, ToolResultBody, ToolResultEvent } from "./events.js";
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
  /** The other side of a ping-pong (§8.2); absent from workers older than §8. */
  paired_tool_name?: string | null;
  /** What enforce mode would have answered, in a run in shadow mode (policy.md §3); null in enforce mode. */
  shadow_decision?: Decision | null;
  error: string | null;
  /** The run's agent and the deciding event's ts: for loopwarden's aggregates across runs, unused here. */
  agent_id?: string | null;
  ts?: number | string | null;
}

export interface Publisher {
  publish(runId: string, event: object): Promise<void>;
  ready(): Promise<void>;
  /** The decisions partition read, once known: calls and results name it, so their verdicts come back there. */
  readonly replyPartition?: number;
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

/** One tool call of a model response, as the model wrote it. */
export interface TurnCall {
  id: string;
  name: string;
  args: unknown;
}

/** A model response with tool calls: the `turn` of its calls (§8.1). */
export interface Turn {
  id: string;
  calls: TurnCall[];
  /** Learned from the transcript; false for a call whose response the plugin never saw (a turn of its own). */
  seen: boolean;
  runId?: string;
  /** Each call's answer, once every verdict of the turn is in. */
  admission?: Promise<Map<string, Answer>>;
}

/** The responses of one session whose calls may still be asked about. */
interface SessionTurns {
  byCall: Map<string, Turn>;
  order: Turn[];
}

/** Responses remembered per session: the gateway asks about a response's calls right after writing it. */
const TURNS_PER_SESSION = 32;
/** The wire's limit on a turn's name (§8.1), in code points. */
const TURN_MAX_CODE_POINTS = 256;

interface Call {
  seq: number;
  toolName: string;
  args: unknown;
  turn?: Turn;
  /** The gateway asked about it (before_tool_call); a call it refused before that (a missing tool) was not. */
  hooked?: boolean;
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
  /** Session key -> the model responses written to its transcript, by tool call id. */
  private readonly turns = new Map<string, SessionTurns>();
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

  private send(runId: string, run: Run, body: EventBody): { seq: number; sent: Promise<void> } {
    const seq = run.nextSeq++;
    const event: Event = { ...body, run_id: runId, seq, ts: nowSeconds() };
    const partition = this.bus.replyPartition;
    if (partition !== undefined && (event.type === "tool_call" || event.type === "tool_result")) event.reply_partition = partition;
    run.published = true;
    const sent = run.tail.then(() => this.bus.publish(runId, event));
    run.tail = sent.catch(() => undefined);
    return { seq, sent };
  }

  /** Publish an event nobody waits on; a failure is logged, the gateway carries on. */
  private notify(runId: string, run: Run, body: EventBody): void {
    this.send(runId, run, body).sent.catch((error: Error) =>
      this.log.warn(`loopwarden: ${body.type} for run=${runId} not published: ${error.message}`),
    );
  }

  // -- tool calls -------------------------------------------------------------

  /**
   * before_tool_call: the first call of a turn publishes every call of the turn and
   * waits for all their verdicts; each call of the turn is answered from them.
   */
  beforeToolCall(toolName: string, params: unknown, ctx: CallContext): Promise<Answer> {
    const runId = ctx.runId;
    if (!runId) return Promise.resolve(undefined);
    const run = this.run(runId);
    if (ctx.sessionId) run.sessionId = ctx.sessionId;
    this.bindSession(runId, run, ctx.sessionKey, ctx.sessionId);
    const toolCallId = ctx.toolCallId ?? `lw-${randomUUID()}`;
    const seen = ctx.toolCallId ? this.turnOf(ctx.sessionKey, ctx.toolCallId) : undefined;
    const turn = seen && (seen.runId ?? runId) === runId ? seen : undefined;
    const known = run.calls.get(toolCallId);
    if (known?.answer && (!turn || known.turn === turn)) return known.answer;
    if (known && turn && known.turn !== turn) run.calls.delete(toolCallId); // an id the provider used again
    if (run.aborted) {
      // The run was aborted: every later call is vetoed without asking, and not published.
      return Promise.resolve({ block: true, blockReason: run.aborted.message });
    }
    const admitted = turn ?? { id: `call:${toolCallId}`, calls: [{ id: toolCallId, name: toolName, args: params }], seen: false };
    admitted.admission ??= this.admit(runId, run, admitted, ctx);
    const call = run.calls.get(toolCallId) as Call;
    call.hooked = true;
    call.answer = admitted.admission.then((answers) => answers.get(toolCallId));
    return call.answer;
  }

  /** Registers the turn's calls at once (so that their results find them), then decides the turn. */
  private admit(runId: string, run: Run, turn: Turn, ctx: CallContext): Promise<Map<string, Answer>> {
    turn.runId = runId;
    const calls: [string, Call][] = turn.calls.map((each) => {
      const call: Call = { seq: -1, toolName: each.name, args: each.args, turn };
      run.calls.set(each.id, call);
      return [each.id, call];
    });
    return this.decideTurn(runId, run, turn, calls, ctx);
  }

  private async decideTurn(runId: string, run: Run, turn: Turn, calls: [string, Call][], ctx: CallContext): Promise<Map<string, Answer>> {
    const started = Date.now();
    const verdicts = await this.askAll(runId, run, turn, calls, ctx);
    const waitedMs = Date.now() - started;
    const answers = new Map<string, Answer>();
    let veto: string | undefined;
    calls.forEach(([id, call], index) => {
      const verdict = verdicts[index];
      let answer: Answer;
      if (typeof verdict === "string") {
        answer = this.fallback(runId, call, verdict, waitedMs);
      } else {
        // Healthy calls stay out of the operator's log; the round trip is there at debug level.
        this.log.debug(
          `loopwarden: verdict run=${runId} seq=${call.seq} tool=${call.toolName} turn=${turn.id} decision=${verdict.decision} waited_ms=${waitedMs}`,
        );
        answer = this.obey(runId, run, call, verdict, ctx);
      }
      veto ??= answer?.blockReason;
      answers.set(id, answer);
    });
    if (veto !== undefined && calls.length > 1) {
      // The gateway's own rule: the first critical loop blocks the whole batch before any of it runs.
      const ran = calls.filter(([id]) => answers.get(id) === undefined).length;
      if (ran > 0) this.log.info(`loopwarden: run=${runId} turn=${turn.id}: ${calls.length} calls vetoed as a whole (${ran} allowed alone)`);
      for (const [id, call] of calls) {
        if (answers.get(id) !== undefined) continue;
        call.vetoed = veto;
        call.warning = undefined;
        answers.set(id, { block: true, blockReason: veto });
      }
    }
    return answers;
  }

  /** Publishes the turn's calls in order; resolves with each one's verdict, or why there is none. */
  private askAll(runId: string, run: Run, turn: Turn, calls: [string, Call][], ctx: CallContext): Promise<(Verdict | string)[]> {
    return new Promise((resolve) => {
      const results: (Verdict | string | undefined)[] = calls.map(() => undefined);
      const keys: string[] = [];
      let left = calls.length;
      let done = false;
      const finish = (): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        for (const key of keys) this.waiters.delete(key);
        resolve(results.map((result) => result ?? "timeout"));
      };
      const settle = (index: number, result: Verdict | string): void => {
        if (done || results[index] !== undefined) return;
        results[index] = result;
        if (--left === 0) finish();
      };
      const timer = setTimeout(finish, this.settings.timeoutMs);
      this.bus.ready().then(() => {
        if (done) return; // answered by the policy already: nothing to wait for
        run.compactionArmed = false;
        calls.forEach(([id, call], index) => {
          const body: ToolCallBody = {
            type: "tool_call",
            tool_call_id: id,
            tool_name: call.toolName,
            turn: turn.id,
            ...this.argsFields(call.toolName, call.args),
          };
          if (ctx.agentId) body.agent_id = ctx.agentId;
          if (ctx.sessionKey) body.session_key = ctx.sessionKey;
          const { seq, sent } = this.send(runId, run, body);
          call.seq = seq;
          const key = waiterKey(runId, seq);
          keys.push(key);
          this.waiters.set(key, (verdict) => settle(index, verdict));
          sent.catch((error: Error) => settle(index, `publish failed: ${error.message}`));
        });
      });
    });
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
    if (!run || !call) return;
    this.report(ctx.runId as string, run, ctx.toolCallId as string, call, result, error);
  }

  private report(runId: string, run: Run, toolCallId: string, call: Call, result: unknown, error: string | undefined): void {
    if (call.seq < 0 || call.reported) return;
    call.reported = true;
    const body: ToolResultBody = {
      type: "tool_result",
      tool_call_id: toolCallId,
      tool_name: call.toolName,
      ...this.argsFields(call.toolName, call.args),
    };
    const veto = call.vetoed ?? run.aborted?.message;
    if (veto !== undefined) {
      // The gateway reports a veto (or a call cut short by the run's abort) as
      // an error; the engine must see a veto, which is not progress (§3, §7.1).
      Object.assign(body, this.outcomeFields(call, vetoResult(veto), undefined));
    } else {
      Object.assign(body, this.outcomeFields(call, result, error));
    }
    this.notify(runId, run, body);
  }

  // -- the transcript: turns ------------------------------------------------------------

  /**
   * before_message_write: an assistant message with tool calls is a turn, written
   * before the gateway prepares its first call; a tool result of a call that the
   * gateway refused before asking the hooks (a missing tool, invalid arguments) is
   * that call's outcome, which after_tool_call does not report.
   */
  noteMessage(message: unknown, sessionKey: string | undefined): void {
    if (!isRecord(message)) return;
    if (message.role === "assistant") this.noteTurn(message, sessionKey ?? "");
    else if (message.role === "toolResult") this.noteToolResult(message, sessionKey ?? "");
  }

  private noteTurn(message: Record<string, unknown>, sessionKey: string): void {
    const content = Array.isArray(message.content) ? message.content : [];
    const calls: TurnCall[] = content.flatMap((item) =>
      isRecord(item) && item.type === "toolCall" && typeof item.id === "string" && item.id && typeof item.name === "string"
        ? [{ id: item.id, name: item.name, args: item.arguments }]
        : [],
    );
    if (calls.length === 0) return;
    let session = this.turns.get(sessionKey);
    if (!session) this.turns.set(sessionKey, (session = { byCall: new Map(), order: [] }));
    const base = turnName(message, calls);
    const before = session.byCall.get(calls[0].id);
    if (before && !before.admission && sameCalls(before.calls, calls) && before.id.startsWith(base)) return; // written again
    const taken = new Set(session.order.map((turn) => turn.id));
    let id = base;
    for (let n = 2; taken.has(id); n++) id = `${base}#${n}`;
    const turn: Turn = { id, calls, seen: true };
    session.order.push(turn);
    for (const call of calls) session.byCall.set(call.id, turn);
    while (session.order.length > TURNS_PER_SESSION) {
      const old = session.order.shift() as Turn;
      for (const call of old.calls) if (session.byCall.get(call.id) === old) session.byCall.delete(call.id);
    }
  }

  private noteToolResult(message: Record<string, unknown>, sessionKey: string): void {
    const toolCallId = typeof message.toolCallId === "string" ? message.toolCallId : undefined;
    const turn = toolCallId ? this.turnOf(sessionKey, toolCallId) : undefined;
    const run = turn?.runId ? this.runs.get(turn.runId) : undefined;
    const call = run?.calls.get(toolCallId as string);
    if (!run || !call || call.turn !== turn || call.hooked) return;
    const result = { content: message.content, details: message.details };
    const text = Array.isArray(message.content)
      ? message.content.flatMap((part) => (isRecord(part) && typeof part.text === "string" ? [part.text] : [])).join("\n")
      : "";
    this.report(turn?.runId as string, run, toolCallId as string, call, message.isError === true ? undefined : result, message.isError === true ? text : undefined);
  }

  /** The turn a tool call belongs to, from its session's transcript. */
  turnOf(sessionKey: string | undefined, toolCallId: string): Turn | undefined {
    return this.turns.get(sessionKey ?? "")?.byCall.get(toolCallId) ?? this.turns.get("")?.byCall.get(toolCallId);
  }

  private argsFields(toolName: string, args: unknown): Pick<ToolCallEvent, "args" | "args_hash"> {
    if (!this.settings.localHashing) return args === undefined ? {} : { args: args as Json };
    const wire = toWire(args);
    const small = minimalArgs(toolName, wire);
    return { args_hash: argsHash(toolName, wire), ...(small === undefined ? {} : { args: small }) };
  }

  private outcomeFields(call: Call, result: unknown, error: string | undefined): Partial<ToolResultEvent> {
    if (!this.settings.localHashing) return error !== undefined ? { error } : result === undefined ? {} : { result: result as Json };
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
    for (const key of run.sessionKeys) {
      if (this.sessions.get(key) === runId) this.sessions.delete(key);
      const session = this.turns.get(key);
      if (session && session.order.every((turn) => !turn.runId || turn.runId === runId)) this.turns.delete(key);
    }
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

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function sameCalls(a: TurnCall[], b: TurnCall[]): boolean {
  return a.length === b.length && a.every((call, index) => call.id === b[index].id);
}

/**
 * A model response's name: the provider's response id, else the gateway's turn id
 * for it, else its time and first call id; one longer than the wire allows is hashed.
 */
export function turnName(message: Record<string, unknown>, calls: TurnCall[]): string {
  const text = (value: unknown): string | undefined => (typeof value === "string" && value.trim() ? value.trim() : undefined);
  const name = text(message.responseId) ?? text(message.turnId) ?? `${String(message.timestamp ?? Date.now())}:${calls[0].id}`;
  // Room for the "#n" that tells apart two responses of one session under one name.
  return [...name].length <= TURN_MAX_CODE_POINTS - 8 ? name : `sha256:${createHash("sha256").update(name).digest("hex")}`;
}

/** What the model is given for a vetoed call, as the gateway itself builds it. */
export function vetoResult(reason: string): Json {
  return { content: [{ type: "text", text: reason }], details: { status: "blocked", deniedReason: "tool-loop", reason } };
}
