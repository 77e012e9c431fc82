"""Settings are defined once (profiler._env.SETTINGS): every variable that the
library (hooks/) or the package reads is in the table, the table holds nothing
that nothing reads, and the documentation's environment page is the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


# ---------------------------------------------------------------------------
# the C side's ranges, choices and defaults against the table's
# ---------------------------------------------------------------------------
#: `if ((v = hvprof_setting("NAME")) && !int_in(v, LO, HI)) hvprof_warn(..., DEFAULT);`
C_INT_IN = re.compile(r'hvprof_setting\("([A-Z_0-9]+)"\)\)\s*&&\s*!int_in\(v,\s*([^,]+),'
                      r'\s*([^)]+?)\)\)\s*hvprof_warn\((.*?)\);', re.S)
#: `env_long(hvprof_setting("NAME"), DEFAULT, LO, HI)`
C_ENV_LONG = re.compile(r'env_long\(hvprof_setting\("([A-Z_0-9]+)"\),\s*([^,]+),\s*([^,]+),'
                        r'\s*([^)]+)\)')
#: `... hvprof_setting("NAME")) && !one_of(v, ARRAY)` and the arrays
C_ONE_OF = re.compile(r'hvprof_setting\("([A-Z_0-9]+)"\)\)\s*&&\s*!one_of\(v,\s*([a-z_]+)\)')
C_ARRAY = re.compile(r'static const char \*const ([a-z_]+)\[\] = \{([^}]*)\}')
C_DEFINE = re.compile(r"^#define\s+([A-Z_0-9]+)\s+(.+?)\s*(?:/\*.*)?$", re.M)
#: C-side settings read otherwise, each with how (checked by hand, and by
#: the tests of their behaviour): their table entries still give the value.
C_READ_OTHERWISE = {
    "HOROVOD_PROFILE_MERGE": "exitmerge.c: \"0\" turns it off, anything else is the default",
    "HOROVOD_PROFILE_MERGE_TIMEOUT": "exitmerge.c: strtod, >= 0 (DEFAULT_MERGE_TIMEOUT_S)",
}


def _c_value(expr: str, defines: dict[str, str]) -> float:
    """A C constant expression of the hooks (numbers, macros, <<, /, *) as a number."""
    for _ in range(5):  # macros of macros
        expr = re.sub(r"\b[A-Z_][A-Z_0-9]*\b", lambda m: f"({defines[m.group(0)]})", expr)
    expr = re.sub(r"(\d)u\b", r"\1", expr)
    assert re.fullmatch(r"[\d\s.()<>*/+-]+", expr), expr
    return float(eval(expr))  # noqa: S307  (digits and operators only, checked above)


def test_the_c_sides_ranges_choices_and_defaults_are_the_tables() -> None:
    src = "\n".join(p.read_text(errors="replace") for p in sorted((ROOT / "hooks").glob("*.[ch]")))
    defines = {m.group(1): m.group(2) for m in C_DEFINE.finditer(src)}
    arrays = {m.group(1): set(re.findall(r'"([^"]*)"', m.group(2)))
              for m in C_ARRAY.finditer(src)}
    found: dict[str, dict[str, object]] = {}
    for name, lo, hi, warn in C_INT_IN.findall(src):
        found.setdefault(name, {}).update(lo=_c_value(lo, defines), hi=_c_value(hi, defines),
                                          value=_c_value(warn.rsplit(",", 1)[1], defines))
    for name, default, lo, hi in C_ENV_LONG.findall(src):
        found.setdefault(name, {}).update(lo=_c_value(lo, defines), hi=_c_value(hi, defines),
                                          value=_c_value(default, defines))
    for name, array in C_ONE_OF.findall(src):
        found.setdefault(name, {})["choices"] = arrays[array]
    typed = {s.name: s for s in _env.SETTINGS
             if s.side in ("C", "both") and s.value is not None}
    assert set(found) - {"HOROVOD_PROFILE"} == set(typed) - set(C_READ_OTHERWISE), \
        "a C setting with a range or choices has no typed entry, or the reverse"
    for name, c in found.items():
        if name == "HOROVOD_PROFILE":  # its modes: "1" and its synonyms, and summary
            assert {"1", "summary"} <= c["choices"]  # type: ignore[operator]
            continue
        s = typed[name]
        if "choices" in c:
            assert set(s.choices) == c["choices"], name
            continue
        assert s.value is not None
        assert (s.lo, s.hi, float(s.value)) == (c["lo"], c["hi"], c["value"]), name
    assert float(_c_value("DEFAULT_MERGE_TIMEOUT_S", defines)) == \
        _env.BY_NAME["HOROVOD_PROFILE_MERGE_TIMEOUT"].value


def test_python_reads_the_tables_defaults_and_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in _env.SETTINGS:
        if s.value is None:
            continue
        monkeypatch.delenv(s.name, raising=False)
        assert _env.read(s.name, speak=False) == s.value
        bad = "maybe" if s.choices else str((s.lo if s.lo is not None else 0) - 1)
        monkeypatch.setenv(s.name, bad)
        assert _env.read(s.name, speak=False) == s.value, (s.name, bad)
        good = s.choices[-1] if s.choices else str(int(s.hi if s.hi is not None else
                                                       (s.lo or 0) + 3))
        monkeypatch.setenv(s.name, good)
        want = (good == "1" if isinstance(s.value, bool) else good) if s.choices else \
            type(s.value)(good)
        assert _env.read(s.name, speak=False) == want, (s.name, good)
