"""loopwarden: stops AI agents from burning tokens in tool-call loops."""

__version__ = "0.1.0"
