"""MkDocs hooks: generated parts of the site, so that nothing is written twice.

* docs/index.md is the checkout's README.md (the front door), its links to
  docs/ pages made relative to the site;
* the commands page's two markers by what the parsers give: the list of
  commands (each one's name, what it must be given, and its one-line help:
  a new command appears by being in profiler.cli.COMMANDS) and the reference
  (profiler.cli._reference: every command's `--help`), so the page is
  `profiler --help`;
* the environment page's marker by the settings table (profiler._env.SETTINGS)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

COMMANDS = "<!-- commands: generated from the parsers -->"
COMMAND_LIST = "<!-- command list: generated from the parsers -->"
README = "<!-- readme: the checkout's README.md, its links made relative to docs/ -->"
SETTINGS = "<!-- settings: generated from profiler._env.SETTINGS -->"


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    if README in markdown:
        text = (Path(config["docs_dir"]).parent / "README.md").read_text(encoding="utf-8")
        text = re.sub(r"\]\(docs/", "](", text)
        markdown = markdown.replace(README, text)
    if COMMAND_LIST in markdown:
        markdown = markdown.replace(COMMAND_LIST, command_list())
    if COMMANDS in markdown:
        from profiler.cli._reference import markdown as reference

        markdown = markdown.replace(COMMANDS, reference())
    if SETTINGS in markdown:
        from profiler._env import markdown_table

        markdown = markdown.replace(SETTINGS, markdown_table())
    return markdown


def command_list() -> str:
    """A table of every command in profiler.cli.COMMANDS: `profiler NAME` with
    what it must be given (its positionals and required options), linked to
    its reference section, and its one-line help."""
    import argparse

    from profiler.cli import COMMANDS as NAMES
    from profiler.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    rows = ["| command | what it answers |", "|---|---|"]
    for name in NAMES:
        parser = sub.choices[name]
        fmt = parser._get_formatter()
        words = [f"profiler {name}"]
        for a in parser._actions:
            if not a.option_strings:
                words.append(fmt._format_args(a, a.dest))
            elif a.required:
                words.append(f"{a.option_strings[0]} {fmt._format_args(a, a.dest.upper())}")
        synopsis = " ".join(w for w in words if w).replace("|", "\\|")
        rows.append(f"| [`{synopsis}`](#profiler-{name}) | {helps.get(name, '')} |")
    return "\n".join(rows) + "\n"
