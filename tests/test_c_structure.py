"""The library's C files as a graph: file A depends on file B when A calls a
function (or names a variable) that B defines with external linkage.  The
graph has no cycle, and the core (core.c) depends on no backend: it reaches
them only through the hooks they register (hvprof_register_backend).

Read from the sources (no compiler): comments and string literals are
removed, definitions are the non-static ones at the start of a line.  Calls
made inside a header's inline functions are not followed.

The core is several files (core.c and its parts core_*.c, which share
core_internal.h): one node of the graph, one room split into files."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "hooks"
#: files the core may call by name: leaves that call nothing of the library
CORE_MAY_CALL = {"settings.c"}

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'')
#: the start of a definition: a line opening with its type, then the name
_START = (
    r"^(?!static\b|extern\b|typedef\b|struct\s+\w+\s*\{|enum\b|union\b|return\b)"
    r"[A-Za-z_][\w \t*]*?[ \t*](\w+)"
)
#: `type name(params) {` (params may span lines)
_FUNC_DEF = re.compile(_START + r"\s*\([^;{}]*\)\s*\{", re.M)
#: `type name[...] = ...;`, `type name;`, `__thread type name __attribute__...`
_DATA_DEF = re.compile(_START + r"\s*(?:\[[^\]\n]*\])?\s*(?:=|;|__attribute__)", re.M)


def _code(path: Path) -> str:
    text = _COMMENT.sub(" ", path.read_text(encoding="utf-8", errors="replace"))
    return _STRING.sub('""', text)


def sources() -> dict[str, str]:
    """file -> its code; the core's parts (core_*.c) joined under core.c."""
    src: dict[str, str] = {}
    for p in sorted(HOOKS.glob("*.c")):
        name = "core.c" if p.name.startswith("core_") else p.name
        src[name] = src.get(name, "") + "\n" + _code(p)
    return src


def definitions(src: dict[str, str]) -> dict[str, str]:
    """Every externally visible function or variable -> the file defining it."""
    where: dict[str, str] = {}
    for name, code in src.items():
        for pattern in (_FUNC_DEF, _DATA_DEF):
            for sym in pattern.findall(code):
                assert where.get(sym, name) == name, f"{sym} defined in {where[sym]} and {name}"
                where[sym] = name
    return where


def dependencies(src: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """file -> {file it depends on -> the symbols it uses there}."""
    defs = definitions(src)
    deps: dict[str, dict[str, set[str]]] = {name: {} for name in src}
    for name, code in src.items():
        used = set(re.findall(r"\b[A-Za-z_]\w*\b", code))
        for sym in used & defs.keys():
            if defs[sym] != name:
                deps[name].setdefault(defs[sym], set()).add(sym)
    return deps


def cycle(deps: dict[str, dict[str, set[str]]]) -> list[str]:
    """One cycle of the graph (its files, first repeated last), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str]:
        state[v] = 1
        path.append(v)
        for w in sorted(deps[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        path.pop()
        return []

    for v in sorted(deps):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return []


def test_the_reader_sees_the_known_definitions() -> None:
    defs = definitions(sources())
    assert defs["hvprof_register_backend"] == "core.c"
    assert defs["hvprof_open"] == "core.c"
    assert defs["hvprof_active"] == "core.c"
    assert defs["hvprof_setting_int"] == "settings.c"
    assert defs["hvprof_nccl_json"] == "nccl_backend.c"
    assert defs["hvprof_nccl_comm_register"] == "nccl_common.c"
    assert defs["hvprof_nccl_nest"] == "nccl_common.c"
    assert defs["hvprof_dev_begin"] == "cuda_rt.c"


def test_no_cycle_among_the_c_files() -> None:
    deps = dependencies(sources())
    assert deps["nccl.c"], "the reader found no dependency at all"
    found = cycle(deps)
    assert not found, "C files depend on each other in a cycle: " + " -> ".join(found)


def test_the_core_names_no_backend() -> None:
    deps = dependencies(sources())
    named = {f: sorted(syms) for f, syms in deps["core.c"].items() if f not in CORE_MAY_CALL}
    assert named == {}, f"core.c calls into backends instead of their hooks: {named}"
    for leaf in CORE_MAY_CALL:
        assert deps[leaf] == {}, f"{leaf} is called by the core: it may call nothing"


def test_the_nccl_paths_share_a_module_and_not_each_other() -> None:
    deps = dependencies(sources())
    for wrappers in ("nccl.c", "nccl_lookup.c", "nccl_backend.c"):  # the symbol wrappers' files
        assert "nccl_plugin.c" not in deps[wrappers]
        assert wrappers not in deps["nccl_plugin.c"]
    assert "nccl_common.c" in deps["nccl.c"] and "nccl_common.c" in deps["nccl_plugin.c"]


def test_the_cores_parts_are_private_to_it() -> None:
    """core_internal.h (the core's state and its files' shared functions) is
    included by the core's files only: a backend sees hvprof_internal.h."""
    for p in sorted(HOOKS.glob("*.c")):
        includes = '#include "core_internal.h"' in p.read_text(encoding="utf-8")
        assert includes == (p.name == "core.c" or p.name.startswith("core_")), p.name
