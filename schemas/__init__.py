"""The wire and disk contract of loopwarden: every byte that crosses a process
boundary is one of these msgspec Structs."""
