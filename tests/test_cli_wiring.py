"""Each CLI command is wired in one place: `@command(name, help, _add_<cmd>_args)` on its handler, the
function adding its arguments just above it; `cli_parser` only assembles them (COMMAND_ORDER), and no
central `build_parser` holds every command's arguments (issue 32)."""

from __future__ import annotations

import argparse
import inspect

from autoshard import cli


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_registered_command_is_in_the_parser_once():
    assert sorted(cli.COMMAND_ORDER) == sorted(cli.COMMANDS) and len(set(cli.COMMAND_ORDER)) == len(cli.COMMAND_ORDER)
    subs = _subparsers(cli.cli_parser())
    assert list(subs) == list(cli.COMMAND_ORDER)
    for name, c in cli.COMMANDS.items():
        assert subs[name].get_default("func") is c.run and subs[name].description == c.help


def test_arguments_are_added_beside_their_handler():
    """`_add_<cmd>_args` is defined right above `cmd_<cmd>` in cli.py (nothing between the two)."""
    lines = inspect.getsource(cli).splitlines()
    for name, c in cli.COMMANDS.items():
        run_line = inspect.getsourcelines(c.run)[1]  # the decorator's first line
        add_src, add_line = inspect.getsourcelines(c.add_args)
        between = [x for x in lines[add_line - 1 + len(add_src):run_line - 1] if x.strip()]
        assert not between, f"{name}: code between {c.add_args.__name__} and {c.run.__name__}: {between[:2]}"
        assert c.add_args.__name__ == f"_add_{c.run.__name__.removeprefix('cmd_')}_args"


def test_no_central_argument_builder():
    """The 162-line `build_parser` that held every command's arguments far from its handler is gone: the
    assembler adds no argument of a command (each `add_argument` call of cli.py is in an `_add_*_args`)."""
    assert not hasattr(cli, "build_parser")
    src = inspect.getsource(cli.cli_parser)
    assert src.count("add_argument(") == 1 and '"--version"' in src  # the top-level --version only
