"""The Faust worker: intake from the events topic, the processor around the
engine, the run table in RocksDB, its settings and topics."""
