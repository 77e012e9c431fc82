"""Settings are defined once (profiler._env.SETTINGS): every variable that the
library (hooks/) or the package reads is in the table, the table holds nothing
that nothing reads, and the documentation's environment page is the table."""

from __future__ import annotations

import re
from pathlib import Path

from profiler import _env

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\b(HOROVOD_PROFILE(?:_[A-Z0-9]+)*|HVPROF_LIB)\b")
#: where a variable is read: getenv/os.environ/setting() with the name or a constant
C_READ = re.compile(r"getenv\(\"([A-Z_0-9]+)\"\)|env_long\(\"([A-Z_0-9]+)\"")


def _names_in(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for p in paths:
        found |= set(NAME.findall(p.read_text(encoding="utf-8", errors="replace")))
    return found


def test_every_variable_read_is_in_the_table_and_nothing_else() -> None:
    c_src = sorted((ROOT / "hooks").glob("*.[ch]"))
    py_src = [p for p in sorted((ROOT / "profiler").rglob("*.py")) + sorted(
        (ROOT / "analysis").rglob("*.py")) if p.name != "_env.py"]
    c_read = {a or b for p in c_src for a, b in C_READ.findall(p.read_text(errors="replace"))}
    c_read = {n for n in c_read if n.startswith("HOROVOD_PROFILE")}
    named = _names_in(c_src + py_src)
    table = set(_env.BY_NAME)
    assert len(table) == len(_env.SETTINGS), "a variable is listed twice"
    # every name the code uses is defined (a misspelt or new one fails here)
    assert named - table == set()
    # every C getenv of ours is in the table with C as a reader
    assert {n for n in c_read if _env.BY_NAME[n].side not in ("C", "both")} == set()
    # and nothing in the table is read by nobody
    assert table - named == set()


def test_the_environment_page_is_the_table() -> None:
    page = (ROOT / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    assert "<!-- settings: generated from profiler._env.SETTINGS -->" in page
    table = _env.markdown_table()
    assert all(f"`{s.name}`" in table for s in _env.SETTINGS)
    # the page holds no table of its own that could drift from the generated one
    assert "| `HOROVOD_PROFILE" not in page
