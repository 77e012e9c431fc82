"""Settings are defined once (profiler._env.SETTINGS), for both languages:

* every variable that the library (hooks/) or the package reads is in the
  table, the table holds nothing that nothing reads, and each side reads
  them one way (C: the generated ids through hooks/settings.c; Python:
  profiler._env);
* the C header and the start-up hook are what scripts/gen_settings.py writes
  from the table, and the two sides parse every value alike (the library's
  own reading, hvprof_settings_json, against Python's);
* an unusable value is said once, in the table's words, by the side that
  reads it; the documentation's environment page is the table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import base_env

from profiler import _env

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\b(HOROVOD_PROFILE(?:_[A-Z0-9]+)*|HVPROF_LIB)\b")
#: a C read of a setting: the generated id, through settings.c's readers
C_READ = re.compile(r"\bhvprof_setting_(?:int|num|text)\(\s*(HVS_[A-Z_0-9]+)\s*\)")
#: getenv of one of ours, bypassing settings.c
C_GETENV = re.compile(r"\bgetenv\(\s*\"((?:HOROVOD_PROFILE|HVPROF)[A-Z_0-9]*)\"")
#: a Python read of one of ours that bypasses profiler._env
PY_READ = re.compile(r"(?:os\.environ\.get\(|os\.getenv\(|os\.environ\[)\s*[\"']"
                     r"((?:HOROVOD_PROFILE|HVPROF_LIB)[A-Z_0-9]*)[\"']\s*[,)\]](?!\s*=[^=])")
GEN = ROOT / "scripts" / "gen_settings.py"


def _c_sources() -> list[Path]:
    return sorted((ROOT / "hooks").glob("*.[ch]"))


def _py_sources() -> list[Path]:
    return [p for p in sorted((ROOT / "profiler").rglob("*.py")) + sorted(
        (ROOT / "analysis").rglob("*.py"))
        if p.name != "_env.py" and "templates" not in p.parts]


def test_every_variable_read_is_in_the_table_and_nothing_else() -> None:
    named: set[str] = set()
    for p in _c_sources() + _py_sources():
        named |= set(NAME.findall(p.read_text(encoding="utf-8", errors="replace")))
    table = set(_env.BY_NAME)
    assert len(table) == len(_env.SETTINGS), "a variable is listed twice"
    assert named - table == set()  # a misspelt or new name fails here
    assert table - named == set()  # and nothing in the table is read by nobody


def test_the_generated_header_and_start_up_hook_are_current() -> None:
    p = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_the_c_side_reads_each_setting_through_settings_c() -> None:
    direct = {f"{p.name}: {n}" for p in _c_sources()
              for n in C_GETENV.findall(p.read_text(errors="replace"))}
    assert direct == set(), "read with hvprof_setting_*, not getenv"
    header = (ROOT / "hooks" / "hvprof_settings.h").read_text()
    ids = dict(re.findall(r"X\((HVS_[A-Z_0-9]+), \"([A-Z_0-9]+)\"", header))
    c_side = {s.name for s in _env.SETTINGS if s.side in ("C", "both")}
    assert set(ids.values()) == c_side
    read = {i for p in _c_sources() if p.name != "settings.c"
            for i in C_READ.findall(p.read_text(errors="replace"))}
    # every C-side setting is read, HOROVOD_PROFILE through hvprof_profile_mode
    assert read | {"HVS_PROFILE"} == set(ids), set(ids) - read
    modes = {p.name for p in _c_sources() if "hvprof_profile_mode" in p.read_text()}
    assert {"mpi.c", "gloo.c", "nccl_common.c", "nccl_plugin.c"} <= modes
    spelt = {f"{p.name}: {n}" for p in _c_sources() if p.name != "hvprof_settings.h"
             for n in re.findall(r'"(HOROVOD_PROFILE[A-Z_0-9]*)"', p.read_text())}
    assert spelt == set(), "a setting's name spelt in C: read it by its id"


def test_python_reads_settings_only_through_the_table() -> None:
    direct = {f"{p.relative_to(ROOT)}: {n}" for p in _py_sources()
              for n in PY_READ.findall(p.read_text(encoding="utf-8"))}
    assert direct == set(), "read through profiler._env (read, text, profile_mode)"


def test_the_environment_page_is_the_table() -> None:
    page = (ROOT / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    assert "<!-- settings: generated from profiler._env.SETTINGS -->" in page
    table = _env.markdown_table()
    assert all(f"`{s.name}`" in table for s in _env.SETTINGS)
    # the page holds no table of its own that could drift from the generated one
    assert "| `HOROVOD_PROFILE" not in page


# ---------------------------------------------------------------------------
# both sides parse alike
# ---------------------------------------------------------------------------
_C_READS = """
import json, sys
from profiler.collect import native
native.load()
print(native.settings_json())
"""

#: values to try per kind: (raw value, usable?)
TRIES = {
    "switch": [("1", True), ("0", True), ("TRUE", True), (" off ", True), ("No", True),
               ("yes", True), ("2", False), ("maybe", False)],
    "choice": [("rank", True), ("monotonic", True), ("TSC", True), ("sometimes", False)],
    "int": [("7", True), ("-5", False), ("1e3", False), ("12x", False), ("99999999", False)],
    "num": [("2.5", True), ("0", True), ("-1", False), ("inf", False), ("x", False)],
}


def _c_reading(env: dict[str, str]) -> dict[str, object]:
    p = subprocess.run([sys.executable, "-c", _C_READS], env=base_env(**env),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    parsed: dict[str, object] = json.loads(p.stdout.splitlines()[-1])
    return parsed


def _as_c(s: _env.Setting, value: object) -> object:
    """Python's reading as the C side writes it (a switch 0/1, a choice its index)."""
    if s.kind == "switch":
        return int(bool(value))
    if s.kind == "choice":
        return s.choices.index(str(value))
    return float(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("attempt", range(max(len(v) for v in TRIES.values())))
def test_c_and_python_read_every_value_alike(attempt: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    typed = [s for s in _env.SETTINGS if s.side in ("C", "both") and s.kind in TRIES]
    env = {}
    for s in typed:
        tries = TRIES[s.kind]
        raw, _ = tries[attempt % len(tries)]
        if s.kind == "choice":  # a valid word of its own where the try is a valid one
            raw = {"rank": s.choices[-1], "monotonic": s.choices[0],
                   "TSC": s.choices[0].upper()}.get(raw, raw)
        env[s.name] = raw
    c = _c_reading(env)
    for s in typed:
        monkeypatch.setenv(s.name, env[s.name])
        assert c[s.name] == _as_c(s, _env.read(s.name, speak=False)), (s.name, env[s.name])
        monkeypatch.delenv(s.name)
    unset = _c_reading({})
    for s in typed:  # the defaults
        assert unset[s.name] == _as_c(s, s.value), s.name


@pytest.mark.parametrize("value,mode", [
    *[(w, "full") for w in ("1", "true", "on", "yes", "full", "ON", " True ")],
    ("summary", "summary"), ("Summary", "summary"),
    *[(w, "off") for w in ("0", "false", "off", "no", "", "  ", "OFF")],
    ("maybe", None), ("2", None), ("fulll", None)])
def test_horovod_profile_is_one_decision(value: str, mode: str | None) -> None:
    assert _env.profile_mode(value) == mode
    c = _c_reading({"HOROVOD_PROFILE": value, "OMPI_COMM_WORLD_RANK": "3"})
    assert c["HOROVOD_PROFILE"] == {"full": 0, "summary": 1, "off": -1, None: -1}[mode]


def test_the_start_up_hook_lets_through_exactly_what_is_not_off() -> None:
    line = (ROOT / "profiler" / "horovod_profiler.pth").read_text()
    for word in ("", *_env.OFF_WORDS, " OFF", "No"):
        assert str(eval(line.split(" and ")[0].split("; ", 1)[1]  # noqa: S307
                        .replace("os.environ.get('HOROVOD_PROFILE', '')", repr(word)))) \
            == "False", word
    for word in (*_env.FULL_WORDS, _env.SUMMARY_WORD, "maybe"):
        assert str(eval(line.split(" and ")[0].split("; ", 1)[1]  # noqa: S307
                        .replace("os.environ.get('HOROVOD_PROFILE', '')", repr(word)))) \
            == "True", word


def test_python_reads_the_tables_defaults_and_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in _env.SETTINGS:
        if s.value is None:
            continue
        monkeypatch.delenv(s.name, raising=False)
        assert _env.read(s.name, speak=False) == s.value
        bad = "maybe" if s.kind in ("switch", "choice") else str(
            (s.lo if s.lo is not None else 0) - 1)
        monkeypatch.setenv(s.name, bad)
        assert _env.read(s.name, speak=False) == s.value, (s.name, bad)
        good = {"switch": "off" if s.value else "on"}.get(s.kind) or (
            s.choices[-1] if s.choices else str(int(s.hi if s.hi is not None else
                                                    (s.lo or 0) + 3)))
        monkeypatch.setenv(s.name, good)
        want = (good == "on") if s.kind == "switch" else good if s.choices else \
            type(s.value)(good)
        assert _env.read(s.name, speak=False) == want, (s.name, good)


def test_an_unusable_python_setting_is_said_once_in_the_tables_words(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "_said", set())
    monkeypatch.setenv("HOROVOD_PROFILE_TRACE_RANKS", "0")
    monkeypatch.setenv("HOROVOD_PROFILE_FASTREC", "perhaps")
    for _ in range(3):
        assert _env.read("HOROVOD_PROFILE_TRACE_RANKS") == 8
        assert _env.read("HOROVOD_PROFILE_FASTREC") is True
    assert capsys.readouterr().err.splitlines() == [
        "horovod-profiler: warning: ignoring HOROVOD_PROFILE_TRACE_RANKS='0' "
        "(an integer >= 1): using 8",
        "horovod-profiler: warning: ignoring HOROVOD_PROFILE_FASTREC='perhaps' "
        "(on: 1/true/on/yes, off: 0/false/off/no): using on"]
    # a setting the C library reads is the library's to say
    monkeypatch.setenv("HOROVOD_PROFILE_MERGE_TIMEOUT", "soon")
    assert _env.read("HOROVOD_PROFILE_MERGE_TIMEOUT") == 60.0
    assert capsys.readouterr().err == ""
