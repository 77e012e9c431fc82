"""MkDocs hooks: generated parts of the site, so that nothing is written twice.

* docs/index.md is the checkout's README.md (the front door), its links to
  docs/ pages made relative to the site;
* the commands page's marker is replaced by the reference the parsers give
  (profiler.cli._reference), so the page is `profiler --help`;
* the environment page's marker by the settings table (profiler._env.SETTINGS)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

COMMANDS = "<!-- commands: generated from the parsers -->"
README = "<!-- readme: the checkout's README.md, its links made relative to docs/ -->"
SETTINGS = "<!-- settings: generated from profiler._env.SETTINGS -->"


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    if README in markdown:
        text = (Path(config["docs_dir"]).parent / "README.md").read_text(encoding="utf-8")
        text = re.sub(r"\]\(docs/", "](", text)
        markdown = markdown.replace(README, text)
    if COMMANDS in markdown:
        from profiler.cli._reference import markdown as reference

        markdown = markdown.replace(COMMANDS, reference())
    if SETTINGS in markdown:
        from profiler._env import markdown_table

        markdown = markdown.replace(SETTINGS, markdown_table())
    return markdown
