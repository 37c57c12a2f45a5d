/**
 * Local hashing: the fields loopwarden's engine would derive from a call's
 * args and a tool's result, computed in the gateway so that only hashes,
 * tool names and the `action` field leave it (spec §3, §7.1, §7.5).
 *
 * The definition is "what the engine computes from the same event sent in the
 * clear": a payload is first brought to its wire form (a JSON round trip, then
 * unpaired UTF-16 surrogates dropped, as the engine's decoder drops them), and
 * then hashed. The shared golden vectors (tests/vectors/hashing.json, written
 * by the Python engine) pin every byte.
 */

import { createHash } from "node:crypto";

/** A JSON value as it travels on the wire (and `undefined` for a missing field). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Hashable = Json | undefined | { [key: string]: Hashable } | Hashable[];

/** The longest name a run's record keeps as is (the engine's id bound). */
const MAX_ID_CHARS = 4096;

const SEND_ACTIONS = new Set([
  "send", "broadcast", "reply", "thread-reply", "sendWithEffect", "sendAttachment", "upload-file", "sticker", "poll",
]);
const VOLATILE_SEND_KEYS = new Set([
  "messageId", "message_id", "messageIds", "platformMessageId", "platformMessageIds",
  "fileId", "file_id", "fileKey", "pollId", "poll_id", "receipt", "runId",
  "idempotencyKey", "ts", "timestamp", "sentAt", "deliveredAt", "createdAt",
]);

export type CallKind = "other" | "process_poll" | "process_log" | "command_status" | "volatile_send";

// -- wire form ---------------------------------------------------------------

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

function wellFormed(text: string): string {
  return text.isWellFormed() ? text : text.replace(LONE_SURROGATE, "");
}

function dropLoneSurrogates(value: Json): Json {
  if (typeof value === "string") return wellFormed(value);
  if (Array.isArray(value)) return value.map(dropLoneSurrogates);
  if (value === null || typeof value !== "object") return value;
  const out: { [key: string]: Json } = {};
  for (const [key, item] of Object.entries(value)) out[wellFormed(key)] = dropLoneSurrogates(item);
  return out;
}

/** The value as the engine would decode it from the event's JSON; undefined when nothing would be sent. */
export function toWire(value: unknown): Json | undefined {
  if (value === undefined) return undefined;
  const text = JSON.stringify(value, (_key, item: unknown) => (typeof item === "bigint" ? item.toString() : item));
  return text === undefined ? undefined : dropLoneSurrogates(JSON.parse(text) as Json);
}

// -- stable JSON and digests -------------------------------------------------

const identity = (text: string): string => text;

/**
 * Keys sorted by UTF-16 code units, numbers and strings as JSON.stringify
 * prints them, non-finite numbers as strings, a missing field as `undefined`.
 * `canon` rewrites every string (keys included) before it is written; keys are
 * then sorted by their rewritten form, ties by the original.
 */
export function stableJson(value: Hashable, canon: (text: string) => string = identity): string {
  if (value === undefined) return "undefined";
  if (value === null) return "null";
  if (typeof value === "number") return Number.isFinite(value) ? JSON.stringify(value) : JSON.stringify(String(value));
  if (typeof value === "string") return JSON.stringify(canon(value));
  if (typeof value === "boolean") return value ? "true" : "false";
  if (Array.isArray(value)) return `[${value.map((item) => stableJson(item, canon)).join(",")}]`;
  const keys = Object.keys(value).map((key) => ({ key, shown: canon(key) }));
  keys.sort((a, b) => compare(a.shown, b.shown) || compare(a.key, b.key));
  return `{${keys.map(({ key, shown }) => `${JSON.stringify(shown)}:${stableJson(value[key], canon)}`).join(",")}}`;
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function sha256(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex");
}

export function digest(value: Hashable): string {
  return sha256(stableJson(value));
}

const WRAP =
  /(<<<EXTERNAL_UNTRUSTED_CONTENT id=(\\*)")[0-9a-f]{16}(\2">>>(?:(?!<<<(?:END_)?EXTERNAL_UNTRUSTED_CONTENT)[^])*<<<END_EXTERNAL_UNTRUSTED_CONTENT id=\2")([0-9a-f]{16})(\2">>>)/g;
const QUOTE_RUN = /(?<!\\)\\*"/g;
const CANONICAL_ID = "0000000000000000";

/**
 * Untrusted-content wraps carry a fresh random id each time: both ids of a
 * wrap become zeros, so the same external content hashes the same (§7.1).
 * A wrap inside serialised text has its quotes escaped; it is rewritten only
 * when the escaping is consistent: a valid escape depth (2^k - 1 backslashes)
 * that every quote inside the wrap is escaped to a multiple of.
 */
export function canonicalMarkers(text: string): string {
  if (!text.includes("<<<EXTERNAL_UNTRUSTED_CONTENT")) return text;
  return text.replace(WRAP, (whole: string, open: string, slashes: string, middle: string, closeId: string, end: string) => {
    const depth = slashes.length + 1;
    const openId = whole.slice(open.length, open.length + 16);
    if (openId !== closeId || (depth & (depth - 1)) !== 0) return whole;
    for (const quote of middle.matchAll(QUOTE_RUN)) if (quote[0].length % depth !== 0) return whole;
    return open + CANONICAL_ID + middle + CANONICAL_ID + end;
  });
}

/** A result's digest: its strings' untrusted-content ids made stable first. */
function outcomeDigest(value: Hashable): string {
  return sha256(stableJson(value, canonicalMarkers));
}

// -- calls ---------------------------------------------------------------------

function isObject(value: unknown): value is { [key: string]: Json } {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

// JavaScript's String#trim is the definition the engine follows.
function hasText(value: Json | undefined): boolean {
  return typeof value === "string" && value.trim() !== "";
}

/** update_plan reduced to its shape: rewording a plan is not progress. */
function planShape(value: Json | undefined): Hashable {
  if (!isObject(value)) return value;
  const steps = Array.isArray(value.plan) ? value.plan : [];
  return {
    planLength: steps.length,
    statuses: steps.map((step) => (isObject(step) && typeof step.status === "string" ? step.status : null)),
    stepPresence: steps.map((step) => isObject(step) && hasText(step.step)),
    hasExplanation: hasText(value.explanation),
  };
}

/** `tool:sha256(stable_json(args))`; absent args hash as `undefined`. */
export function argsHash(tool: string, args: Json | undefined): string {
  return `${tool}:${digest(tool === "update_plan" ? planShape(args) : args)}`;
}

/** How a call's result is hashed, and whether it polls: decided by its args. */
export function classify(tool: string, args: Json | undefined): CallKind {
  if (tool === "command_status") return "command_status";
  if (tool === "sessions_send") return "volatile_send";
  const action = isObject(args) ? args.action : undefined;
  if (tool === "process" && action === "poll") return "process_poll";
  if (tool === "process" && action === "log") return "process_log";
  if (tool === "message" && typeof action === "string" && SEND_ACTIONS.has(action)) return "volatile_send";
  return "other";
}

/** What of the args the engine still needs when only hashes are sent: `action` for process and message. */
export function minimalArgs(tool: string, args: Json | undefined): Json | undefined {
  if ((tool === "process" || tool === "message") && isObject(args) && typeof args.action === "string") {
    return { action: args.action };
  }
  return undefined;
}

// -- results -------------------------------------------------------------------

/** The §7.5 fields of a locally hashed result, named as on the wire. */
export interface Outcome {
  result_hash?: string;
  unknown_tool_name?: string;
  outcome_kind?: "veto" | "terminal_failure";
  failure_identity?: string;
  no_progress?: true;
}

const UNKNOWN_TOOL = [
  /unknown tool[:\s]+["']?([a-z0-9_.-]+)/i,
  /tool\s+["']?([a-z0-9_.-]+)["']?\s+(?:not found|is not available)/i,
];

export function unknownToolName(text: string): string | undefined {
  const trimmed = text.trim();
  if (!trimmed) return undefined;
  for (const pattern of UNKNOWN_TOOL) {
    const name = pattern.exec(trimmed)?.[1]?.toLowerCase();
    if (name) return name.length <= MAX_ID_CHARS ? name : `sha256:${sha256(name)}`;
  }
  return undefined;
}

function errorText(error: Json): string {
  if (typeof error === "string") return error;
  if (typeof error === "number" || typeof error === "boolean") return String(error);
  return stableJson(error);
}

function textContent(result: { [key: string]: Json }): string {
  const content = result.content;
  if (!Array.isArray(content)) return "";
  const parts: string[] = [];
  for (const entry of content) {
    if (isObject(entry) && typeof entry.type === "string" && typeof entry.text === "string") parts.push(entry.text);
  }
  return parts.join("\n").trim();
}

function stringOr<T>(value: Json | undefined, fallback: T): string | T {
  return typeof value === "string" ? value : fallback;
}

// Volatile parts of a failing command's output, each replaced by "#" in this order (§7.1).
const VOLATILE_FAILURE_TEXT = [
  /\d{4}-\d{2}-\d{2}[tT ]\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:[zZ]|[+-]\d{2}:\d{2})?/gu,
  /\d{1,2}:\d{2}:\d{2}(?:\.\d{1,6})?/gu,
  /\b(?:attempt|retry)\b[\s#:=]*\d+/giu,
  /\b\d+(?:\.\d+)?\s?(?:ns|us|ms|seconds?|minutes?|hours?|s)\b/giu,
  /\b(?:pid|ppid)\b[\s#:=]*\d+/giu,
];

function execOutcome(details: { [key: string]: Json }, text: string): Outcome | undefined {
  const status = details.status;
  if (typeof status !== "string" || !status) return undefined;
  if (status === "running") {
    return { result_hash: outcomeDigest({ status, tail: stringOr(details.tail, "") }) };
  }
  if (status === "completed" || status === "failed") {
    const exitCode = typeof details.exitCode === "number" ? details.exitCode : null;
    const timedOut = details.timedOut === true;
    const aggregated = typeof details.aggregated === "string" ? details.aggregated.trim() : "";
    const output = aggregated || text;
    const outcome: Outcome = { result_hash: outcomeDigest({ status, exitCode, timedOut, output }) };
    if (
      exitCode !== null && Number.isFinite(exitCode) && exitCode !== 0 && !timedOut &&
      output !== "" && output !== `(Command exited with code ${exitCode})`
    ) {
      const shape = VOLATILE_FAILURE_TEXT.reduce((current, pattern) => current.replace(pattern, "#"), output);
      outcome.outcome_kind = "terminal_failure";
      outcome.failure_identity = outcomeDigest({ status, exitCode, timedOut, output: shape });
    }
    return outcome;
  }
  if (status === "approval-pending" || status === "approval-unavailable") {
    return {
      result_hash: outcomeDigest({
        status,
        reason: stringOr(details.reason, null),
        host: stringOr(details.host, null),
        command: stringOr(details.command, ""),
        warningText: stringOr(details.warningText, ""),
      }),
    };
  }
  return undefined;
}

const POLL_FIELDS = ["exitCode", "exitSignal", "aggregated"];
const LOG_FIELDS = ["totalLines", "totalChars", "truncated", "exitCode", "exitSignal"];

function processOutcome(action: string, fields: string[], details: { [key: string]: Json }, text: string): string {
  const shape: { [key: string]: Hashable } = { action, status: details.status, text };
  for (const name of fields) shape[name] = details[name] ?? null;
  return outcomeDigest(shape);
}

function isMessageObject(value: { [key: string]: Json }): boolean {
  return (
    typeof value.id === "string" && typeof value.text === "string" &&
    (typeof value.direction === "string" || typeof value.senderId === "string" ||
      typeof value.accountId === "string" || isObject(value.conversation))
  );
}

/** A sent message's fresh ids and time stamps are not progress: dropped at any depth. */
function stripVolatile(value: Json): Json {
  if (Array.isArray(value)) return value.map(stripVolatile);
  if (!isObject(value)) return value;
  const dropId = isMessageObject(value);
  const out: { [key: string]: Json } = {};
  for (const [key, item] of Object.entries(value)) {
    if (!VOLATILE_SEND_KEYS.has(key) && !(dropId && key === "id")) out[key] = stripVolatile(item);
  }
  return out;
}

/**
 * The outcome of a finished call from its wire-form result or error: the
 * result hash (none for a loop-guard veto or a missing result), the missing
 * tool an error names, and the §7.5 fields.
 */
export function resultOutcome(tool: string, kind: CallKind, result: Json | undefined, error: Json | undefined): Outcome {
  if (error !== undefined && error !== null) {
    const text = errorText(error);
    const outcome: Outcome = { result_hash: `error:${outcomeDigest(text)}`, no_progress: true };
    const missing = unknownToolName(text);
    if (missing !== undefined) outcome.unknown_tool_name = missing;
    return outcome;
  }
  if (result === undefined) return {};
  if (!isObject(result)) return { result_hash: outcomeDigest(result) };
  const details = isObject(result.details) ? result.details : {};
  if (details.status === "blocked" && details.deniedReason === "tool-loop") return { outcome_kind: "veto" };
  const text = textContent(result);
  if (tool === "exec") {
    const outcome = execOutcome(details, text);
    if (outcome) return outcome;
  }
  if (tool === "write" && details.changed === false) {
    return { result_hash: outcomeDigest({ status: "unchanged" }), no_progress: true };
  }
  if (kind === "process_poll") return { result_hash: processOutcome("poll", POLL_FIELDS, details, text) };
  if (kind === "process_log") return { result_hash: processOutcome("log", LOG_FIELDS, details, text) };
  if (kind === "volatile_send") return { result_hash: outcomeDigest(stripVolatile(details)) };
  if (tool === "update_plan") return { result_hash: outcomeDigest({ details: planShape(details), text: "" }) };
  return { result_hash: outcomeDigest({ details, text }) };
}
