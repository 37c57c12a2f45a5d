/**
 * Every part of @platformatic/kafka the plugin relies on beyond its documented
 * API, in one place. Reading one partition without a consumer group is not an
 * option of its Consumer: `consume()` joins a group first, unless the consumer
 * looks as if it had joined already. The package is pinned to an exact version
 * (package.json); test/seams.test.ts checks each seam below against the
 * installed copy, so an upgrade that changes one fails naming it (docs/OPENCLAW.md,
 * "Upgrading @platformatic/kafka").
 */

import type { Consumer } from "@platformatic/kafka";

/** One seam: the member set by hand, where the package reads it, and the line of its source relied on. */
export interface Seam {
  member: string;
  file: string;
  relied: string;
  why: string;
}

export const SEAMS: readonly Seam[] = [
  {
    member: "Consumer.topics.track",
    file: "dist/clients/consumer/consumer.js",
    relied: "if (this.topics.track(topic)) {",
    why: "consume() joins for every topic it has not tracked yet; one tracked beforehand asks for no join",
  },
  {
    member: "Consumer.memberId",
    file: "dist/clients/consumer/consumer.js",
    relied: "let joinNeeded = this.memberId === null;",
    why: "consume() joins while the member id is null; any other value skips the join",
  },
  {
    member: "Consumer.assignments",
    file: "dist/clients/consumer/messages-stream.js",
    relied: "this.#consumer.assignments?.find(assignment => assignment.topic === topic)",
    why: "the messages stream fetches the partitions listed here, which a group's sync would have set",
  },
  {
    member: "Consumer.close without a membership",
    file: "dist/clients/consumer/consumer.js",
    relied: "else if (this.#membershipActive) {",
    why: "close() leaves a group only if a join made the membership active, so it sends no LeaveGroup",
  },
];

/**
 * Makes `consume()` stream `partition` of `topic` without joining, committing
 * to or leaving a group: what a join and sync would have set, set by hand.
 */
export function assignWithoutGroup(
  consumer: Consumer<string, string, string, string>,
  topic: string,
  partition: number,
  memberId: string,
): void {
  consumer.topics.track(topic);
  consumer.memberId = memberId;
  consumer.assignments = [{ topic, partitions: [partition] }];
}
