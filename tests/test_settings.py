"""Settings are defined once (profiler._env.SETTINGS): every variable that the
library (hooks/) or the package reads is in the table, the table holds nothing
that nothing reads, and the documentation's environment page is the table."""

from __future__ import annotations

import re
from pathlib import Path

from profiler import _env

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\b(HOROVOD_PROFILE(?:_[A-Z0-9]+)*|HVPROF_LIB)\b")
#: the C side reads a setting only through hvprof_setting (hooks/settings.c)
C_READ = re.compile(r"\bhvprof_setting\(\s*\"([A-Z_0-9]+)\"\s*\)")
#: getenv of one of ours, bypassing hvprof_setting
C_GETENV = re.compile(r"\bgetenv\(\s*\"((?:HOROVOD_PROFILE|HVPROF)[A-Z_0-9]*)\"")
#: the C table of the settings the library reads: SETTINGS[] = {"...", ..., NULL}
C_TABLE = re.compile(r"\bSETTINGS\[\]\s*=\s*\{(.*?)\};", re.S)


def _names_in(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for p in paths:
        found |= set(NAME.findall(p.read_text(encoding="utf-8", errors="replace")))
    return found


def test_every_variable_read_is_in_the_table_and_nothing_else() -> None:
    c_src = sorted((ROOT / "hooks").glob("*.[ch]"))
    py_src = [p for p in sorted((ROOT / "profiler").rglob("*.py")) + sorted(
        (ROOT / "analysis").rglob("*.py")) if p.name != "_env.py"]
    c_read = {n for p in c_src for n in C_READ.findall(p.read_text(errors="replace"))}
    named = _names_in(c_src + py_src)
    table = set(_env.BY_NAME)
    assert len(table) == len(_env.SETTINGS), "a variable is listed twice"
    # every name the code uses is defined (a misspelt or new one fails here)
    assert named - table == set()
    # every C read of ours is in the table with C as a reader
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



def _c_table() -> set[str]:
    src = (ROOT / "hooks" / "settings.c").read_text(encoding="utf-8")
    match = C_TABLE.search(src)
    assert match, "hooks/settings.c has no SETTINGS[] table"
    return set(re.findall(r'"([A-Z_0-9]+)"', match.group(1)))


def test_the_c_side_reads_settings_through_one_function() -> None:
    c_src = sorted((ROOT / "hooks").glob("*.c"))
    direct = {
        f"{p.name}: {n}" for p in c_src for n in C_GETENV.findall(p.read_text(errors="replace"))
    }
    assert direct == set(), "read with hvprof_setting, not getenv"
    c_read = {n for p in c_src for n in C_READ.findall(p.read_text(errors="replace"))}
    c_side = {s.name for s in _env.SETTINGS if s.side in ("C", "both")}
    # the C table is the C half of the Python table, and each entry is read
    assert _c_table() == c_side
    assert c_read == c_side
