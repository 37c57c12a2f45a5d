/** The plugin's settings (`plugins.entries.loopwarden.config`), checked with errors that name the field. */

export type FailurePolicy = "fail_open" | "fail_closed";

export interface Settings {
  bootstrap: string[];
  eventsTopic: string;
  decisionsTopic: string;
  timeoutMs: number;
  failurePolicy: FailurePolicy;
  localHashing: boolean;
}

/** Past the gateway's 15 s hook budget the gateway blocks the call itself; stay well under it. */
export const MAX_TIMEOUT_MS = 14_000;
const KNOWN = ["bootstrap", "eventsTopic", "decisionsTopic", "timeoutMs", "failurePolicy", "localHashing"];
const HOST_PORT = /^[^,:\s]+:\d+$/;

export class SettingsError extends Error {}

function show(value: unknown): string {
  return JSON.stringify(value) ?? String(value);
}

function topic(raw: Record<string, unknown>, name: string, fallback: string): string {
  const value = raw[name] ?? fallback;
  if (typeof value !== "string" || !value) throw new SettingsError(`${name}: expected a topic name, got ${show(value)}`);
  return value;
}

export function parseSettings(raw: unknown): Settings {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new SettingsError(`expected an object with at least "bootstrap", got ${show(raw)}`);
  }
  const config = raw as Record<string, unknown>;
  for (const key of Object.keys(config)) {
    if (!KNOWN.includes(key)) throw new SettingsError(`${key}: unknown setting (expected one of ${KNOWN.join(", ")})`);
  }
  const bootstrap = config.bootstrap;
  const servers = typeof bootstrap === "string" ? bootstrap.split(",").map((part) => part.trim()) : [];
  if (!servers.length || !servers.every((server) => HOST_PORT.test(server))) {
    throw new SettingsError(`bootstrap: expected host:port[,host:port], got ${show(bootstrap)}`);
  }
  const timeoutMs = config.timeoutMs ?? 2000;
  if (typeof timeoutMs !== "number" || !Number.isInteger(timeoutMs) || timeoutMs < 1 || timeoutMs > MAX_TIMEOUT_MS) {
    throw new SettingsError(`timeoutMs: expected an integer from 1 to ${MAX_TIMEOUT_MS}, got ${show(timeoutMs)}`);
  }
  const failurePolicy = config.failurePolicy ?? "fail_open";
  if (failurePolicy !== "fail_open" && failurePolicy !== "fail_closed") {
    throw new SettingsError(`failurePolicy: expected "fail_open" or "fail_closed", got ${show(failurePolicy)}`);
  }
  const localHashing = config.localHashing ?? false;
  if (typeof localHashing !== "boolean") throw new SettingsError(`localHashing: expected true or false, got ${show(localHashing)}`);
  return {
    bootstrap: servers,
    eventsTopic: topic(config, "eventsTopic", "loopwarden.events"),
    decisionsTopic: topic(config, "decisionsTopic", "loopwarden.decisions"),
    timeoutMs,
    failurePolicy,
    localHashing,
  };
}
