/**
 * The events the plugin publishes, as loopwarden reads them
 * (schemas/json/events.schema.json). Written by hand; tests/test_contracts.py
 * compares every interface here with the schema field by field (names,
 * required fields, types), so a field added on one side only fails there.
 */

import type { Json } from "./hashing.js";

/** What every event carries; the plugin's `send` fills it in. */
export interface Envelope {
  run_id: string;
  /** Grows within a run; the plugin seeds it from the clock in microseconds. */
  seq: number;
  ts?: number | string | null;
}

export interface ToolCallEvent extends Envelope {
  type: "tool_call";
  tool_call_id: string;
  tool_name: string;
  /** With local hashing, only what classification needs (`minimalArgs`). */
  args?: Json;
  args_hash?: string | null;
  /** The model response that made the call (spec §8.1); never null. */
  turn: string;
  agent_id?: string | null;
  session_key?: string | null;
  /** The decisions partition the plugin reads: its verdict goes there. */
  reply_partition?: number;
}

export interface ToolResultEvent extends Envelope {
  type: "tool_result";
  tool_call_id: string;
  tool_name: string;
  args?: Json;
  args_hash?: string | null;
  result?: Json;
  error?: Json;
  /** The outcome hashed locally (spec §7.5), instead of `result` and `error`. */
  result_hash?: string | null;
  unknown_tool_name?: string | null;
  outcome_kind?: "veto" | "terminal_failure" | null;
  failure_identity?: string | null;
  no_progress?: boolean;
  reply_partition?: number;
}

export interface CompactionEvent extends Envelope {
  type: "compaction";
  agent_id?: string | null;
}

export interface RunEndEvent extends Envelope {
  type: "run_end";
}

export type Event = ToolCallEvent | ToolResultEvent | CompactionEvent | RunEndEvent;

/** A call or a result before `send` numbers it and names its run and its reply partition. */
export type ToolCallBody = Omit<ToolCallEvent, keyof Envelope | "reply_partition">;
export type ToolResultBody = Omit<ToolResultEvent, keyof Envelope | "reply_partition">;

/** Any event before `send`. */
export type EventBody = ToolCallBody | ToolResultBody | Omit<CompactionEvent, keyof Envelope> | Omit<RunEndEvent, keyof Envelope>;
