"""Every command explains itself: a description on its --help page and help for every option."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from builders import run_cli
from streams.cli import build_parser


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(words, parser) of the program and of every command and subcommand under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from commands(child, (*path, name))


ALL = list(commands(build_parser()))
SUBCOMMANDS = [words for words, _ in ALL if words]


def test_every_command_and_option_has_help_and_each_default_is_said_once() -> None:
    missing = []
    for words, parser in ALL:
        if not parser.description:
            missing.append(f"loopwarden {' '.join(words)}: no description")
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction) and not action.help:
                missing.append(
                    f"loopwarden {' '.join(words)} {'/'.join(action.option_strings) or action.dest}: no help"
                )
            elif action.help and action.help.count("(default") > 1:
                missing.append(f"loopwarden {' '.join(words)} {action.option_strings}: two defaults")
    assert missing == []


@pytest.mark.parametrize("words", SUBCOMMANDS, ids=" ".join)
def test_every_help_page_opens_with_its_description(words: tuple[str, ...]) -> None:
    parser = dict(ALL)[words]
    done = run_cli(*words[1:], "--help", command=words[0])
    assert done.returncode == 0 and done.stderr == b""
    first_words = " ".join(parser.description.split()[:4])
    assert first_words in " ".join(done.stdout.decode().split())


def test_version() -> None:
    done = run_cli(command="--version")
    assert done.returncode == 0 and done.stdout.decode().startswith("loopwarden ")


def test_one_spelling_for_where_to_start_reading_with_the_old_ones_as_aliases() -> None:
    parser = build_parser()
    for command in ("audit", "tail", "dashboard"):
        assert parser.parse_args([command, "--from", "earliest"]).start == "earliest"
        assert parser.parse_args([command, "--from-beginning"]).start == "earliest"
        assert parser.parse_args([command, "--since", "15m"]).start == "15m"
    assert parser.parse_args(["produce", "--topic", "t", "f"]).events_topic == "t"
    assert parser.parse_args(["produce", "--events-topic", "t", "f"]).events_topic == "t"
