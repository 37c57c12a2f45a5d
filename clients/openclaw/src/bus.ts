/**
 * The Kafka side: one producer for the events topic and one consumer of the
 * decisions topic per process, on @platformatic/kafka (pure TypeScript, no
 * native addon to download at install).
 */

import { randomUUID } from "node:crypto";
import { hostname } from "node:os";

import {
  compatibilityPartitioner,
  Consumer,
  type MessagesStream,
  Producer,
  stringDeserializers,
  stringSerializers,
} from "@platformatic/kafka";

import type { Settings } from "./config.js";

export interface Log {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
}

/** How long a dead broker holds a publish before it fails; the verdict wait is bounded by timeoutMs anyway. */
const PRODUCER_TIMEOUT_MS = 5_000;
const RECONNECT_DELAY_MS = 5_000;

export class Bus {
  private readonly producer: Producer<string, string, string, string>;
  private consumer: Consumer<string, string, string, string> | undefined;
  private stream: MessagesStream<string, string, string, string> | undefined;
  private readyPromise: Promise<void>;
  private closed = false;

  constructor(
    private readonly settings: Settings,
    private readonly onMessage: (value: string) => void,
    private readonly log: Log,
  ) {
    // Java's partitioner (murmur2, sign bit masked): a run's events land on the
    // partition any other Kafka client would pick for the same key.
    this.producer = new Producer({
      clientId: `loopwarden-openclaw-${process.pid}`,
      bootstrapBrokers: settings.bootstrap,
      serializers: stringSerializers,
      partitioner: compatibilityPartitioner,
      acks: 1,
      timeout: PRODUCER_TIMEOUT_MS,
      retries: 1,
      retryDelay: 200,
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

  private async subscribe(): Promise<void> {
    while (!this.closed) {
      // A group of its own: every gateway process reads every verdict and keeps those of its runs.
      const consumer = new Consumer({
        clientId: `loopwarden-openclaw-${process.pid}`,
        groupId: `loopwarden-openclaw-${hostname()}-${process.pid}-${randomUUID()}`,
        bootstrapBrokers: this.settings.bootstrap,
        deserializers: stringDeserializers,
        timeout: PRODUCER_TIMEOUT_MS,
        retries: 1,
      });
      try {
        const stream = await consumer.consume({
          topics: [this.settings.decisionsTopic],
          mode: "latest",
          autocommit: false,
          maxWaitTime: 100,
          sessionTimeout: 10_000,
          heartbeatInterval: 1_000,
        });
        stream.on("data", (message) => {
          if (message.value) this.onMessage(message.value);
        });
        stream.on("error", (error: Error) => this.log.warn(`loopwarden: decision reader error: ${error.message}`));
        this.consumer = consumer;
        this.stream = stream;
        this.log.info(`loopwarden: reading verdicts from ${this.settings.decisionsTopic} at ${this.settings.bootstrap.join(",")}`);
        return;
      } catch (error) {
        await consumer.close(true).catch(() => undefined);
        this.log.warn(
          `loopwarden: cannot read ${this.settings.decisionsTopic} at ${this.settings.bootstrap.join(",")}: ` +
            `${(error as Error).message}; retrying in ${RECONNECT_DELAY_MS / 1000}s`,
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
