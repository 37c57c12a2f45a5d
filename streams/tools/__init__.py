"""Operator tools behind the `loopwarden` command: replay, audit, explain,
produce, tail, the local quick start and the local Kafka broker."""
