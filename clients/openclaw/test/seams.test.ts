/**
 * The seams of src/seams.ts still hold on the installed @platformatic/kafka:
 * the members exist on a consumer, and each line of the package's source they
 * rely on is still there. An upgrade that changes one fails here, naming it.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Consumer, stringDeserializers } from "@platformatic/kafka";

import { assignWithoutGroup, SEAMS } from "../src/seams.js";

const here = dirname(fileURLToPath(import.meta.url));
const pluginDir = join(here, "..", "..");
/** The installed package's root: its entry point is dist/index.js. */
const packageDir = join(dirname(fileURLToPath(import.meta.resolve("@platformatic/kafka"))), "..");

test("@platformatic/kafka is pinned to one exact version, the one installed", () => {
  const wanted = JSON.parse(readFileSync(join(pluginDir, "package.json"), "utf8")).dependencies["@platformatic/kafka"];
  assert.match(wanted, /^\d+\.\d+\.\d+$/, `package.json pins @platformatic/kafka to ${wanted}, not one exact version`);
  const locked = JSON.parse(readFileSync(join(pluginDir, "package-lock.json"), "utf8")).packages["node_modules/@platformatic/kafka"];
  assert.equal(locked.version, wanted, "package-lock.json locks another version than package.json pins");
  const installed = JSON.parse(readFileSync(join(packageDir, "package.json"), "utf8")).version;
  assert.equal(installed, wanted, "the installed version is not the pinned one: run npm ci");
});

for (const seam of SEAMS) {
  test(`seam ${seam.member}: ${seam.file} still has the line relied on`, () => {
    const source = readFileSync(join(packageDir, seam.file), "utf8");
    assert.ok(
      source.includes(seam.relied),
      `@platformatic/kafka changed ${seam.member}: ${seam.file} no longer has "${seam.relied}" (${seam.why})`,
    );
  });
}

test("assignWithoutGroup sets the members consume() reads, on a consumer that never connected", async () => {
  const consumer = new Consumer({
    clientId: "seams-test",
    groupId: "seams-test",
    bootstrapBrokers: ["127.0.0.1:1"],
    deserializers: stringDeserializers,
  });
  try {
    assert.equal(consumer.memberId, null, "Consumer.memberId: a new consumer no longer starts with null");
    assert.equal(typeof consumer.topics.track, "function", "Consumer.topics.track is gone");
    assert.equal(consumer.assignments, null, "Consumer.assignments: a new consumer no longer starts with null");
    assignWithoutGroup(consumer, "t", 3, "no-group");
    assert.deepEqual([...consumer.topics.keys()], ["t"], "Consumer.topics.track no longer tracks the topic");
    assert.equal(consumer.memberId, "no-group");
    assert.deepEqual(consumer.assignments, [{ topic: "t", partitions: [3] }]);
  } finally {
    await consumer.close(true);
  }
});
