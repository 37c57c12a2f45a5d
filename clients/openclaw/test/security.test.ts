/**
 * TLS and SASL settings: checked with errors that name the setting, and mapped
 * onto @platformatic/kafka's `tls` and `sasl` options. The plugin's clients
 * against the real secure broker are in tests/openclaw/test_openclaw_secure.py.
 */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { connectionSecurity, rootCauses } from "../src/bus.js";
import { parseSettings, SettingsError } from "../src/config.js";

const dir = mkdtempSync(join(tmpdir(), "loopwarden-security-"));
const file = (name: string, text: string): string => {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
};
const PASSWORD = "s3cret-Pa55word-that-must-not-leak";
const passwordFile = file("gateway.password", `${PASSWORD}\n`);
const caFile = file("ca.pem", "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n");
const certFile = file("client.pem", "CERT");
const keyFile = file("client.key", "KEY");

const base = { bootstrap: "127.0.0.1:9093" };
const saslSsl = { ...base, securityProtocol: "SASL_SSL", saslUsername: "gateway", saslPasswordFile: passwordFile, sslCaFile: caFile };

test("plaintext is the default and adds no connection options", () => {
  const settings = parseSettings(base);
  assert.deepEqual(settings.security, { protocol: "PLAINTEXT" });
  assert.deepEqual(connectionSecurity(settings.security), {});
});

test("the manifest's defaults, which the gateway fills in, are a valid config", () => {
  const manifest = JSON.parse(readFileSync(new URL("../../openclaw.plugin.json", import.meta.url), "utf8"));
  const properties: Record<string, { default?: unknown }> = manifest.configSchema.properties;
  const defaults = Object.fromEntries(
    Object.entries(properties).flatMap(([key, schema]) => ("default" in schema ? [[key, schema.default]] : [])),
  );
  assert.equal(defaults.securityProtocol, "PLAINTEXT");
  assert.deepEqual(parseSettings({ ...defaults, ...base }).security, { protocol: "PLAINTEXT" });
});

test("a refused connection is reported by its root causes, not by the retries that wrap them", () => {
  const sasl = new Error("SASL authentication failed.");
  const wrapped = new AggregateError([new AggregateError([sasl], "findGroupCoordinator failed 2 times.")], "joinGroup failed 2 times.");
  assert.equal(rootCauses(wrapped), "SASL authentication failed.");
  assert.equal(rootCauses(new Error("outer", { cause: new Error("connect ECONNREFUSED 127.0.0.1:9") })), "connect ECONNREFUSED 127.0.0.1:9");
});

test("SASL_SSL maps to tls and sasl, the password read from its file only when asked", () => {
  const settings = parseSettings(saslSsl);
  assert.deepEqual(settings.security, {
    protocol: "SASL_SSL",
    saslMechanism: "SCRAM-SHA-512",
    saslUsername: "gateway",
    saslPasswordFile: passwordFile,
    sslCaFile: caFile,
  });
  assert.ok(!JSON.stringify(settings).includes(PASSWORD), "the settings never hold the password");
  const options = connectionSecurity(settings.security);
  assert.equal(options.tls?.rejectUnauthorized, true);
  assert.equal(String(options.tls?.ca), "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n");
  assert.equal(options.sasl?.mechanism, "SCRAM-SHA-512");
  assert.equal(options.sasl?.username, "gateway");
  assert.equal(options.sasl?.password(), PASSWORD);
});

test("mutual TLS and SASL_PLAINTEXT", () => {
  const mtls = parseSettings({ ...base, securityProtocol: "SSL", sslCaFile: caFile, sslCertFile: certFile, sslKeyFile: keyFile });
  const options = connectionSecurity(mtls.security);
  assert.equal(String(options.tls?.cert), "CERT");
  assert.equal(String(options.tls?.key), "KEY");
  assert.equal(options.sasl, undefined);
  const plain = parseSettings({ ...base, securityProtocol: "SASL_PLAINTEXT", saslMechanism: "SCRAM-SHA-256", saslUsername: "gw", saslPasswordFile: passwordFile });
  const mapped = connectionSecurity(plain.security);
  assert.equal(mapped.tls, undefined);
  assert.equal(mapped.sasl?.mechanism, "SCRAM-SHA-256");
});

const wrong: [string, Record<string, unknown>, string][] = [
  ["an unknown protocol", { securityProtocol: "TLS" }, 'securityProtocol: expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, got "TLS"'],
  ["an unknown mechanism", { saslMechanism: "GSSAPI" }, 'saslMechanism: expected one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, got "GSSAPI"'],
  ["SASL without a user", { saslUsername: undefined }, "saslUsername: required with SASL_SSL, got undefined"],
  ["SASL without a password file", { saslPasswordFile: undefined }, "saslPasswordFile: required with SASL_SSL"],
  ["a missing password file", { saslPasswordFile: join(dir, "nope") }, `saslPasswordFile: cannot read ${join(dir, "nope")}: ENOENT`],
  ["an empty password file", { saslPasswordFile: file("empty", "\n") }, `saslPasswordFile: ${join(dir, "empty")} is empty`],
  ["a missing CA file", { sslCaFile: join(dir, "ca-nope.pem") }, `sslCaFile: cannot read ${join(dir, "ca-nope.pem")}: ENOENT`],
  ["a key without a certificate", { sslKeyFile: keyFile }, "sslKeyFile is set without sslCertFile"],
  ["SASL settings without SASL", { securityProtocol: "SSL" }, "saslUsername is set, but securityProtocol is SSL, not SASL_PLAINTEXT or SASL_SSL"],
  ["TLS settings without TLS", { securityProtocol: "SASL_PLAINTEXT" }, "sslCaFile is set, but securityProtocol is SASL_PLAINTEXT, not SSL or SASL_SSL"],
];

for (const [what, changes, message] of wrong) {
  test(`refused, naming the setting: ${what}`, () => {
    const config: Record<string, unknown> = { ...saslSsl, ...changes };
    for (const key of Object.keys(changes)) if (changes[key] === undefined) delete config[key];
    assert.throws(() => parseSettings(config), (error: Error) => error instanceof SettingsError && error.message === message);
  });
}
