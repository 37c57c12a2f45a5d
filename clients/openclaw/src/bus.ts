/**
 * The Kafka side: one producer for the events topic and one consumer of the
 * decisions topic per process, on @platformatic/kafka (pure TypeScript, no
 * native addon to download at install).
 */

import { readFileSync } from "node:fs";
import type { ConnectionOptions as TlsOptions } from "node:tls";

import {
  compatibilityPartitioner,
  Consumer,
  type MessagesStream,
  murmur2,
  Producer,
  stringDeserializers,
  stringSerializers,
} from "@platformatic/kafka";

import { choosePartition, readPassword, type Mechanism, type Security, type Settings } from "./config.js";

export interface Log {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
}

/** How long a dead broker holds a publish before it fails; the verdict wait is bounded by timeoutMs anyway. */
const PRODUCER_TIMEOUT_MS = 5_000;
/**
 * Retries of a publish, RETRY_DELAY_MS apart: enough to outlast one broker's
 * failover (a dead leader's partitions move once the controller gives up on
 * it, after broker.session.timeout.ms, 9 s by default), so the event still
 * reaches the worker and the run's history stays whole; a cluster that stays
 * down fails a publish after about 15 s. The call's own wait is timeoutMs.
 */
const PRODUCER_RETRIES = 60;
const RETRY_DELAY_MS = 250;
const RECONNECT_DELAY_MS = 5_000;
/** The client id every gateway's connections show: nothing of the host or process in it. */
export const CLIENT_ID = "loopwarden-openclaw";
/**
 * Required by @platformatic/kafka's Consumer, never sent: the reader assigns
 * its partition itself and never joins, commits to or leaves a group.
 */
const UNUSED_GROUP = "loopwarden-openclaw-no-group";

/** What a connection needs for the settings' TLS and SASL; nothing for PLAINTEXT. */
export interface ConnectionSecurity {
  tls?: TlsOptions;
  sasl?: { mechanism: Mechanism; username: string; password: () => string };
}

/**
 * @platformatic/kafka's `tls` and `sasl` options: the CA (else Node's own),
 * the client certificate for mutual TLS, and a password read from its file
 * each time a connection authenticates (a rotated password is picked up).
 */
export function connectionSecurity(security: Security): ConnectionSecurity {
  const options: ConnectionSecurity = {};
  if (security.protocol === "SSL" || security.protocol === "SASL_SSL") {
    const tls: TlsOptions = { rejectUnauthorized: true };
    if (security.sslCaFile) tls.ca = readFileSync(security.sslCaFile);
    if (security.sslCertFile) tls.cert = readFileSync(security.sslCertFile);
    if (security.sslKeyFile) tls.key = readFileSync(security.sslKeyFile);
    options.tls = tls;
  }
  if (security.protocol === "SASL_PLAINTEXT" || security.protocol === "SASL_SSL") {
    const file = security.saslPasswordFile ?? "";
    options.sasl = {
      mechanism: security.saslMechanism ?? "SCRAM-SHA-512",
      username: security.saslUsername ?? "",
      password: () => readPassword(file),
    };
  }
  return options;
}

/**
 * The causes at the bottom of @platformatic/kafka's errors, which wrap them once
 * per retry and step ("joinGroup failed 2 times. findGroupCoordinator failed
 * ..."): what the operator needs is e.g. "SASL authentication failed."
 */
export function rootCauses(error: unknown): string {
  const leaves = (e: unknown): string[] => {
    if (!(e instanceof Error)) return [String(e)];
    const inner = [...((e as Partial<AggregateError>).errors ?? []), ...(e.cause !== undefined ? [e.cause] : [])];
    return inner.length ? inner.flatMap(leaves) : [e.message];
  };
  return [...new Set(leaves(error))].join("; ");
}

export class Bus {
  private readonly producer: Producer<string, string, string, string>;
  private consumer: Consumer<string, string, string, string> | undefined;
  private stream: MessagesStream<string, string, string, string> | undefined;
  private readyPromise: Promise<void>;
  private closed = false;
  /** The decisions partition read, named on every call and result; known once the reader is positioned. */
  replyPartition: number | undefined;

  constructor(
    private readonly settings: Settings,
    private readonly onMessage: (value: string) => void,
    private readonly log: Log,
    private readonly instanceId: string,
  ) {
    // Java's partitioner (murmur2, sign bit masked): a run's events land on the
    // partition any other Kafka client would pick for the same key. Idempotent,
    // which means acks=all: an event acknowledged survives a lost broker, and
    // the retries after a lost leader neither double nor reorder a run's events.
    this.producer = new Producer({
      clientId: CLIENT_ID,
      bootstrapBrokers: settings.bootstrap,
      ...connectionSecurity(settings.security),
      serializers: stringSerializers,
      partitioner: compatibilityPartitioner,
      idempotent: true,
      timeout: PRODUCER_TIMEOUT_MS,
      retries: PRODUCER_RETRIES,
      retryDelay: RETRY_DELAY_MS,
    });
    this.readyPromise = this.subscribe();
  }

  /** Resolves once verdicts are being read (from the latest offsets); never rejects. */
  ready(): Promise<void> {
    return this.readyPromise;
  }

  async publish(runId: string, event: object): Promise<void> {
    await this.producer.send({ messages: [{ topic: this.settings.eventsTopic, key: runId, value: JSON.stringify(event) }] });
  }

  /**
   * Reads one partition of the decisions topic, assigned by hand from the
   * latest offset: no consumer group, so there is none another gateway could
   * join to take the partition over, and no verdicts of other gateways'
   * partitions cross the wire.
   */
  private async subscribe(): Promise<void> {
    const topic = this.settings.decisionsTopic;
    while (!this.closed) {
      const consumer = new Consumer({
        clientId: CLIENT_ID,
        groupId: UNUSED_GROUP,
        bootstrapBrokers: this.settings.bootstrap,
        ...connectionSecurity(this.settings.security),
        deserializers: stringDeserializers,
        timeout: PRODUCER_TIMEOUT_MS,
        retries: 1,
      });
      try {
        const metadata = await consumer.metadata({ topics: [topic] });
        const count = metadata.topics.get(topic)?.partitionsCount ?? 0;
        if (!count) throw new Error(`topic ${topic} has no partitions`);
        const { partition, warning } = choosePartition(this.settings.replyPartition, this.instanceId, count, (key) => murmur2(key));
        if (warning) this.log.warn(`loopwarden: ${warning}`);
        // What a group's join would have set: with a member id and the topic
        // tracked, consume() streams this assignment and never joins.
        consumer.topics.track(topic);
        consumer.memberId = UNUSED_GROUP;
        consumer.assignments = [{ topic, partitions: [partition] }];
        const stream = await consumer.consume({ topics: [topic], mode: "latest", autocommit: false, maxWaitTime: 100 });
        stream.on("data", (message) => {
          if (message.value) this.onMessage(message.value);
        });
        stream.on("error", (error: Error) => this.log.warn(`loopwarden: decision reader error: ${rootCauses(error)}`));
        this.consumer = consumer;
        this.stream = stream;
        this.replyPartition = partition;
        this.log.info(`loopwarden: reading verdicts from ${topic} partition ${partition} of ${count} at ${this.settings.bootstrap.join(",")}`);
        return;
      } catch (error) {
        await consumer.close(true).catch(() => undefined);
        this.log.warn(
          `loopwarden: cannot read ${topic} at ${this.settings.bootstrap.join(",")}: ` +
            `${rootCauses(error)}; retrying in ${RECONNECT_DELAY_MS / 1000}s`,
        );
        await new Promise((resolve) => setTimeout(resolve, RECONNECT_DELAY_MS).unref());
      }
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.stream?.close().catch(() => undefined);
    await this.consumer?.close(true).catch(() => undefined);
    await this.producer.close(true).catch(() => undefined);
  }
}
