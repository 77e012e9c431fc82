"""The command reference in Markdown, from the parsers themselves
(build_parser): every command's `--help`, as `profiler <command> --help`
prints it at a fixed width.  The documentation site's commands page is
generated from it (docs/hooks.py), so the page and the CLI cannot drift."""

from __future__ import annotations

import argparse
import os

from . import COMMANDS, build_parser

#: the width help is formatted at (argparse reads COLUMNS)
WIDTH = 100


def command_help() -> dict[str, str]:
    """name -> that command's help text, for every command in COMMANDS."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        parser = build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return {name: sub.choices[name].format_help() for name in COMMANDS}
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def markdown() -> str:
    """One section per command, its help in a code block."""
    out = []
    for name, text in sorted(command_help().items()):
        out += [f"### profiler {name}", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)
