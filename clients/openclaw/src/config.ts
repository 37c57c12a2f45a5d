/** The plugin's settings (`plugins.entries.loopwarden.config`), checked with errors that name the field. */

import { accessSync, constants, readFileSync } from "node:fs";

export type FailurePolicy = "fail_open" | "fail_closed";

export const PROTOCOLS = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] as const;
export const MECHANISMS = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] as const;
export type Protocol = (typeof PROTOCOLS)[number];
export type Mechanism = (typeof MECHANISMS)[number];

/**
 * TLS and SASL, as loopwarden's own clients take them (docs/SECURITY.md): the
 * password stays in its file, read when a connection authenticates, so it is
 * never part of the settings.
 */
export interface Security {
  protocol: Protocol;
  saslMechanism?: Mechanism;
  saslUsername?: string;
  saslPasswordFile?: string;
  sslCaFile?: string;
  sslCertFile?: string;
  sslKeyFile?: string;
}

export interface Settings {
  bootstrap: string[];
  eventsTopic: string;
  decisionsTopic: string;
  timeoutMs: number;
  failurePolicy: FailurePolicy;
  localHashing: boolean;
  security: Security;
  /** The decisions partition to read and name on events; else the one `instanceId` picks. */
  replyPartition?: number;
  /** Picks the reply partition when `replyPartition` is not set; else the gateway installation's own id. */
  instanceId?: string;
}

/** Past the gateway's 15 s hook budget the gateway blocks the call itself; stay well under it. */
export const MAX_TIMEOUT_MS = 14_000;
const SASL_KEYS = ["saslMechanism", "saslUsername", "saslPasswordFile"] as const;
const SSL_KEYS = ["sslCaFile", "sslCertFile", "sslKeyFile"] as const;
const KNOWN = [
  "bootstrap",
  "eventsTopic",
  "decisionsTopic",
  "timeoutMs",
  "failurePolicy",
  "localHashing",
  "replyPartition",
  "instanceId",
  "securityProtocol",
  ...SASL_KEYS,
  ...SSL_KEYS,
];
const HOST_PORT = /^[^,:\s]+:\d+$/;

export class SettingsError extends Error {}

function show(value: unknown): string {
  return JSON.stringify(value) ?? String(value);
}

/** A topic setting; unset, the variable a tenant's gateway.env sets, else the default pair. */
function topic(raw: Record<string, unknown>, name: string, variable: string, fallback: string, env: NodeJS.ProcessEnv): string {
  const value = raw[name] ?? (env[variable] || fallback);
  if (typeof value !== "string" || !value) throw new SettingsError(`${name}: expected a topic name, got ${show(value)}`);
  return value;
}

function readable(name: string, path: unknown): string {
  if (typeof path !== "string" || !path) throw new SettingsError(`${name}: expected a file path, got ${show(path)}`);
  try {
    accessSync(path, constants.R_OK);
  } catch (error) {
    throw new SettingsError(`${name}: cannot read ${path}: ${(error as NodeJS.ErrnoException).code ?? error}`);
  }
  return path;
}

/** The password of a SASL password file (its trailing newline dropped). */
export function readPassword(path: string): string {
  return readFileSync(path, "utf8").replace(/[\r\n]+$/, "");
}

function parseSecurity(config: Record<string, unknown>): Security {
  const protocol = config.securityProtocol ?? "PLAINTEXT";
  if (!PROTOCOLS.includes(protocol as Protocol)) {
    throw new SettingsError(`securityProtocol: expected one of ${PROTOCOLS.join(", ")}, got ${show(protocol)}`);
  }
  const security: Security = { protocol: protocol as Protocol };
  const sasl = security.protocol.startsWith("SASL_");
  const tls = security.protocol === "SSL" || security.protocol === "SASL_SSL";
  for (const key of SASL_KEYS) {
    if (config[key] !== undefined && !sasl) {
      throw new SettingsError(`${key} is set, but securityProtocol is ${security.protocol}, not SASL_PLAINTEXT or SASL_SSL`);
    }
  }
  for (const key of SSL_KEYS) {
    if (config[key] !== undefined && !tls) {
      throw new SettingsError(`${key} is set, but securityProtocol is ${security.protocol}, not SSL or SASL_SSL`);
    }
  }
  if (sasl) {
    const mechanism = config.saslMechanism ?? "SCRAM-SHA-512";
    if (!MECHANISMS.includes(mechanism as Mechanism)) {
      throw new SettingsError(`saslMechanism: expected one of ${MECHANISMS.join(", ")}, got ${show(mechanism)}`);
    }
    security.saslMechanism = mechanism as Mechanism;
    if (typeof config.saslUsername !== "string" || !config.saslUsername) {
      throw new SettingsError(`saslUsername: required with ${security.protocol}, got ${show(config.saslUsername)}`);
    }
    security.saslUsername = config.saslUsername;
    if (config.saslPasswordFile === undefined) throw new SettingsError(`saslPasswordFile: required with ${security.protocol}`);
    security.saslPasswordFile = readable("saslPasswordFile", config.saslPasswordFile);
    if (!readPassword(security.saslPasswordFile)) throw new SettingsError(`saslPasswordFile: ${security.saslPasswordFile} is empty`);
  }
  if (config.sslKeyFile !== undefined && config.sslCertFile === undefined) {
    throw new SettingsError("sslKeyFile is set without sslCertFile");
  }
  if (config.sslCaFile !== undefined) security.sslCaFile = readable("sslCaFile", config.sslCaFile);
  if (config.sslCertFile !== undefined) security.sslCertFile = readable("sslCertFile", config.sslCertFile);
  if (config.sslKeyFile !== undefined) security.sslKeyFile = readable("sslKeyFile", config.sslKeyFile);
  return security;
}

export function parseSettings(raw: unknown, env: NodeJS.ProcessEnv = process.env): Settings {
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
  const { replyPartition, instanceId } = config;
  if (replyPartition !== undefined && instanceId !== undefined) {
    throw new SettingsError("replyPartition and instanceId are both set: give one (replyPartition names the partition, instanceId picks one)");
  }
  if (replyPartition !== undefined && (typeof replyPartition !== "number" || !Number.isInteger(replyPartition) || replyPartition < 0)) {
    throw new SettingsError(`replyPartition: expected an integer from 0, got ${show(replyPartition)}`);
  }
  if (instanceId !== undefined && (typeof instanceId !== "string" || !instanceId.trim())) {
    throw new SettingsError(`instanceId: expected a non-empty string, got ${show(instanceId)}`);
  }
  const settings: Settings = {
    bootstrap: servers,
    eventsTopic: topic(config, "eventsTopic", "LOOPWARDEN_EVENTS_TOPIC", "loopwarden.events", env),
    decisionsTopic: topic(config, "decisionsTopic", "LOOPWARDEN_DECISIONS_TOPIC", "loopwarden.decisions", env),
    timeoutMs,
    failurePolicy,
    localHashing,
    security: parseSecurity(config),
  };
  if (replyPartition !== undefined) settings.replyPartition = replyPartition as number;
  if (instanceId !== undefined) settings.instanceId = instanceId as string;
  return settings;
}

/**
 * The decisions partition a gateway reads, of `count`: `replyPartition` when
 * it is one of them, else the partition Kafka's default partitioner gives the
 * key `instanceId` (the Python client's choice for the same id). An
 * out-of-range `replyPartition` falls back to the instance id's partition,
 * with `warning` saying so: the gateway still reads one partition, its own.
 */
export function choosePartition(
  replyPartition: number | undefined,
  instanceId: string,
  count: number,
  hash: (key: string) => number,
): { partition: number; warning?: string } {
  const derived = (hash(instanceId) & 0x7fffffff) % count;
  if (replyPartition === undefined) return { partition: derived };
  if (replyPartition < count) return { partition: replyPartition };
  return {
    partition: derived,
    warning: `replyPartition ${replyPartition} is not a partition of a topic with ${count}; reading partition ${derived} (from the instance id) instead`,
  };
}
