"""The Faust worker: its transport (the events topic in fetched batches), the
processor around the engine, checkpoints, the runs' state store, its settings
and topics."""
