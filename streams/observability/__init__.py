"""What the worker tells operators: Prometheus metrics and structured log lines."""
