/**
 * Reply routing: the settings that name the decisions partition a gateway
 * reads, the tenant topics from gateway.env, the partition choice (the Python
 * client's for the same instance id), the instance id kept in the state
 * directory, and `reply_partition` on the calls and results published.
 */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { murmur2 } from "@platformatic/kafka";

import { CLIENT_ID } from "../src/bus.js";
import { choosePartition, parseSettings, SettingsError, type Settings } from "../src/config.js";
import { Guard, type Publisher } from "../src/guard.js";
import { INSTANCE_FILE, instanceId } from "../src/instance.js";

const base = { bootstrap: "127.0.0.1:9092" };
const hash = (key: string): number => murmur2(key);

test("replyPartition: an integer from 0; instanceId: a non-empty string; not both", () => {
  assert.equal(parseSettings({ ...base, replyPartition: 0 }).replyPartition, 0);
  assert.equal(parseSettings({ ...base, replyPartition: 7 }).replyPartition, 7);
  assert.equal(parseSettings({ ...base, instanceId: "gw-1" }).instanceId, "gw-1");
  const plain = parseSettings(base);
  assert.equal(plain.replyPartition, undefined);
  assert.equal(plain.instanceId, undefined);
  for (const bad of [-1, 1.5, "2", null, true]) {
    assert.throws(() => parseSettings({ ...base, replyPartition: bad }), (e: Error) => e instanceof SettingsError && e.message.startsWith("replyPartition:"));
  }
  for (const bad of ["", "  ", 3, null]) {
    assert.throws(() => parseSettings({ ...base, instanceId: bad }), (e: Error) => e instanceof SettingsError && e.message.startsWith("instanceId:"));
  }
  assert.throws(() => parseSettings({ ...base, replyPartition: 1, instanceId: "gw" }), /both set/);
});

test("topics: the settings, else LOOPWARDEN_EVENTS_TOPIC / LOOPWARDEN_DECISIONS_TOPIC, else the default pair", () => {
  const env = { LOOPWARDEN_EVENTS_TOPIC: "loopwarden.acme.events", LOOPWARDEN_DECISIONS_TOPIC: "loopwarden.acme.decisions" };
  const tenant = parseSettings(base, env);
  assert.equal(tenant.eventsTopic, "loopwarden.acme.events");
  assert.equal(tenant.decisionsTopic, "loopwarden.acme.decisions");
  const set = parseSettings({ ...base, eventsTopic: "e", decisionsTopic: "d" }, env);
  assert.equal(set.eventsTopic, "e");
  assert.equal(set.decisionsTopic, "d");
  const none = parseSettings(base, { LOOPWARDEN_EVENTS_TOPIC: "" });
  assert.equal(none.eventsTopic, "loopwarden.events");
  assert.equal(none.decisionsTopic, "loopwarden.decisions");
});

test("the partition: replyPartition when in range, else the instance id's, as the Python client picks it", () => {
  // kafka-python: murmur2(id) & 0x7FFFFFFF % count
  assert.equal(choosePartition(undefined, "gateway-a", 3, hash).partition, 1);
  assert.equal(choosePartition(undefined, "gateway-a", 8, hash).partition, 2);
  assert.equal(choosePartition(undefined, "7f3c1e2a-0000-4000-8000-000000000001", 3, hash).partition, 2);
  assert.equal(choosePartition(undefined, "7f3c1e2a-0000-4000-8000-000000000001", 8, hash).partition, 0);
  assert.deepEqual(choosePartition(2, "gateway-a", 3, hash), { partition: 2 });
  assert.deepEqual(choosePartition(0, "gateway-a", 1, hash), { partition: 0 });
  const out = choosePartition(3, "gateway-a", 3, hash);
  assert.equal(out.partition, 1);
  assert.match(out.warning ?? "", /replyPartition 3 is not a partition of a topic with 3; reading partition 1/);
  for (let count = 1; count < 20; count++) {
    for (const id of ["a", "b", "gateway-z", "x".repeat(40)]) {
      const { partition } = choosePartition(undefined, id, count, hash);
      assert.ok(partition >= 0 && partition < count);
    }
  }
});

test("the instance id: kept in the state directory, owner-only, the same next time; nothing of host or pid", () => {
  const dir = mkdtempSync(join(tmpdir(), "loopwarden-state-"));
  const first = instanceId(dir);
  assert.equal(first.warning, undefined);
  assert.equal(instanceId(dir).id, first.id);
  assert.equal(readFileSync(join(dir, INSTANCE_FILE), "utf8").trim(), first.id);
  assert.equal(statSync(join(dir, INSTANCE_FILE)).mode & 0o777, 0o600);
  assert.notEqual(instanceId(mkdtempSync(join(tmpdir(), "loopwarden-state-"))).id, first.id);
  assert.ok(!first.id.includes(String(process.pid)));
  assert.ok(!CLIENT_ID.includes(String(process.pid)));
  const none = instanceId(undefined);
  assert.match(none.warning ?? "", /per process/);
});

test("tool_call and tool_result name the reply partition; other events do not", async () => {
  const events: Record<string, unknown>[] = [];
  const bus: Publisher = {
    replyPartition: 2,
    ready: () => Promise.resolve(),
    publish: async (_runId: string, event: object) => {
      events.push(event as Record<string, unknown>);
    },
  };
  const settings: Settings = { ...parseSettings(base, {}), timeoutMs: 50 };
  const log = { debug: () => undefined, info: () => undefined, warn: () => undefined };
  const guard = new Guard(settings, bus, log, async () => true);
  const ctx = { runId: "r1", toolCallId: "c1", agentId: "main", sessionKey: "agent:main:main", sessionId: "s1" };
  await guard.beforeToolCall("exec", { command: "ls" }, ctx);
  guard.afterToolCall({ content: [] }, undefined, ctx);
  await new Promise((resolve) => setTimeout(resolve, 20));
  const byType = new Map(events.map((event) => [event.type, event]));
  assert.equal(byType.get("tool_call")?.reply_partition, 2, JSON.stringify(events));
  assert.equal(byType.get("tool_result")?.reply_partition, 2, JSON.stringify(events));
  for (const event of events) if (event.type !== "tool_call" && event.type !== "tool_result") assert.equal(event.reply_partition, undefined);
});
