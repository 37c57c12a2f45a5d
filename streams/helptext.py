"""How every `loopwarden` command is added to the parser: with a description
on its own `--help` page as well as its line in the list above it."""

from __future__ import annotations

import argparse
from typing import Any


def add_command(
    commands: argparse._SubParsersAction, name: str, help: str, description: str | None = None, **options: Any
) -> argparse.ArgumentParser:
    """A subcommand whose --help page opens with `description`, else with its `help` as a sentence."""
    text = description or f"{help[0].upper()}{help[1:]}."
    return commands.add_parser(name, help=help, description=text, **options)
