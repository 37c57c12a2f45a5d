/**
 * The OpenClaw plugin `loopwarden`: every tool call of a gateway's agent runs
 * goes to loopwarden over Kafka, and the gateway obeys the verdict.
 *
 * OpenClaw calls register() more than once per process; the Kafka clients and
 * the run state live once per process (on globalThis), and every handler is
 * idempotent, so a second registration only adds handlers that find their
 * work already done.
 */

import type { OpenClawPluginApi, OpenClawPluginDefinition } from "openclaw/plugin-sdk/plugin-entry";

import { Bus, type Log } from "./bus.js";
import { parseSettings } from "./config.js";
import { Guard } from "./guard.js";
import { instanceId } from "./instance.js";

interface Shared {
  guards: Map<string, Guard>;
  unsubscribeAgentEvents?: () => void;
}

const SHARED = Symbol.for("loopwarden.openclaw");
const shared: Shared = ((globalThis as Record<symbol, Shared | undefined>)[SHARED] ??= { guards: new Map() });

/**
 * Ends an agent run through the plugin SDK's harness runtime (the gateway's
 * own abort: the run stops after the current tool result).
 */
async function abortAgentRun(sessionId: string): Promise<boolean> {
  const runtime = await import("openclaw/plugin-sdk/agent-harness-runtime");
  return runtime.abortAgentHarnessRun(sessionId);
}

function guardFor(api: OpenClawPluginApi): Guard {
  const settings = parseSettings(api.pluginConfig ?? {});
  const key = JSON.stringify(settings);
  const log: Log = { debug: (m) => api.logger.debug?.(m), info: (m) => api.logger.info(m), warn: (m) => api.logger.warn(m) };
  let guard = shared.guards.get(key);
  if (!guard) {
    let created: Guard | undefined;
    let id = settings.instanceId;
    if (id === undefined) {
      let stateDir: string | undefined;
      try {
        stateDir = api.runtime.state.resolveStateDir();
      } catch {
        stateDir = undefined;
      }
      const kept = instanceId(stateDir);
      if (kept.warning) log.warn(`loopwarden: ${kept.warning}`);
      id = kept.id;
    }
    const bus = new Bus(settings, (value) => created?.verdict(value), log, id);
    created = guard = new Guard(settings, bus, log, abortAgentRun);
    shared.guards.set(key, guard);
    log.info(
      `loopwarden: guarding tool calls via ${settings.bootstrap.join(",")} (${settings.eventsTopic} -> ${settings.decisionsTopic}, ` +
        `timeout ${settings.timeoutMs} ms, ${settings.failurePolicy}, local hashing ${settings.localHashing ? "on" : "off"})`,
    );
  }
  guard.log = log;
  return guard;
}

const plugin: OpenClawPluginDefinition = {
  id: "loopwarden",
  name: "loopwarden",
  description: "Stops agents that loop on tool calls, with verdicts from a loopwarden stream processor.",
  register(api: OpenClawPluginApi) {
    const guard = guardFor(api);

    api.on("before_tool_call", async (event, ctx) => {
      const answer = await guard.beforeToolCall(event.toolName, event.params, {
        runId: event.runId ?? ctx.runId,
        toolCallId: event.toolCallId ?? ctx.toolCallId,
        agentId: ctx.agentId,
        sessionKey: ctx.sessionKey,
        sessionId: ctx.sessionId,
      });
      return answer;
    });

    // The model's response is written to the transcript before its first call is
    // prepared: the plugin learns the whole turn there. The hook is synchronous and
    // only observes (it returns nothing, so the message is written as it is).
    api.on("before_message_write", (event, ctx) => {
      guard.noteMessage(event.message, ctx.sessionKey ?? event.sessionKey);
    });

    api.on("after_tool_call", (event, ctx) => {
      guard.afterToolCall(event.result, event.error, {
        runId: event.runId ?? ctx.runId,
        toolCallId: event.toolCallId ?? ctx.toolCallId,
      });
    });

    api.on("after_compaction", (event, ctx) => {
      guard.afterCompaction(event.compactedCount, ctx.sessionKey, ctx.sessionId, ctx.agentId);
    });

    api.registerAgentToolResultMiddleware(
      (event, ctx) => {
        const warning = guard.takeWarning(ctx.runId, event.toolCallId);
        if (warning === undefined) return undefined;
        const content = Array.isArray(event.result.content) ? event.result.content : [];
        return { result: { ...event.result, content: [...content, { type: "text", text: warning }] } };
      },
      { runtimes: ["openclaw"] },
    );

    // One subscription per process: the agent-event bus is process-wide.
    shared.unsubscribeAgentEvents?.();
    shared.unsubscribeAgentEvents = api.runtime.events.onAgentEvent((evt) => {
      for (const each of shared.guards.values()) {
        each.agentEvent(evt.runId, evt.stream, evt.seq, evt.data, evt.sessionKey, (evt as { agentId?: string }).agentId);
      }
    });
  },
};

export default plugin;
