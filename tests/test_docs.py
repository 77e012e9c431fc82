"""The front door and the documentation site: the README stays short and its
links resolve, and the commands page is what `profiler <command> --help`
prints (the site itself is built in strict mode by scripts/test.sh)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import profiler_cli

from profiler.cli import COMMANDS
from profiler.cli._reference import WIDTH, command_help, markdown

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_a_front_door_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    for needed in ("bash scripts/main-job.sh", "bash scripts/test.sh", "profiler advise",
                   "profiler hang", "profiler compare", "profiler report"):
        assert needed in text, needed
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert links, "the README links to the docs"
    missing = [t for t in links if not (ROOT / t).exists()]
    assert missing == [], missing
    # every page of the site's navigation exists (mkdocs --strict checks the rest)
    nav = re.findall(r":\s+(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert len(nav) >= 10 and [p for p in nav if not (ROOT / "docs" / p).is_file()] == []


def test_the_commands_page_is_the_clis_own_help() -> None:
    helps = command_help()
    assert sorted(helps) == sorted(COMMANDS)
    page = markdown()
    for name in COMMANDS:
        assert f"### profiler {name}" in page
        out = profiler_cli(name, "--help", env={"COLUMNS": str(WIDTH)}, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.rstrip() == helps[name].rstrip(), name
        assert out.stdout.rstrip() in page
