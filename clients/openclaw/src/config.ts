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
  "securityProtocol",
  ...SASL_KEYS,
  ...SSL_KEYS,
];
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
    security: parseSecurity(config),
  };
}
