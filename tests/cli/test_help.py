"""``sluice <command> --help`` answers for every command, with an example.

The walk covers whatever the real parser holds, nested subcommands included,
so commands added later (``etl_runtime/cli_*.py`` modules) are checked too.
"""

from __future__ import annotations

import argparse

import pytest

from etl_runtime.cli.commands import build_parser, main


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """Every subcommand path under ``parser`` (``("etl",)``, ``("job", "ls")``, ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from command_paths(sub, (*prefix, name))


PATHS = sorted(set(command_paths(build_parser())))


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 0, f"sluice {' '.join(argv)}: exit {exited.value.code}: {err}"
    return out


def test_the_walk_finds_the_commands() -> None:
    assert {("up",), ("put",), ("get",), ("etl",), ("bucket",), ("cluster",)} <= set(PATHS)


@pytest.mark.parametrize("path", [(), *PATHS], ids=lambda p: " ".join(p) or "sluice")
def test_help_has_an_example(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text([*path, "--help"], capsys)
    assert "usage: sluice" in text
    at = text.lower().find("example")  # "Examples:", "example:", ...
    assert at >= 0, f"'sluice {' '.join(path)} --help' shows no example:\n{text}"
    assert "sluice " in text[at:], f"the example is no command line:\n{text}"
