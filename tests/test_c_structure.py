"""The library's C files as a graph: file A depends on file B when A calls a
function (or names a variable) that B defines with external linkage.  Every
file is a node of its own (the core's files too: a split whose parts call
each other both ways is one file with a longer name), and the graph has no
cycle: each file calls only files below it.  The core depends on no backend:
it reaches them only through the hooks they register
(hvprof_register_backend).  The core's shared state is defined in one file,
core_state.c, and declared in one header, core_internal.h (with
hvprof_internal.h for what the backends see of it).

Read from the sources (no compiler): comments and string literals are
removed, definitions are the non-static ones at the start of a line.  A
header's inline functions and function-like macros count where they are
used: a file that calls call_open (mpi_internal.h) depends on what
call_open's body names.  A name a file defines itself as static is its own,
whoever else defines it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "hooks"
#: files the core may call by name: leaves that call nothing of the library
CORE_MAY_CALL = {"settings.c"}
#: the file that defines the core's shared state, and the header declaring it
STATE_FILE = "core_state.c"
STATE_HEADER = "core_internal.h"

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'')
#: the start of a definition: a line opening with its type, then the name
_START = (
    r"^(?!static\b|extern\b|typedef\b|struct\s+\w+\s*\{|enum\b|union\b|return\b)"
    r"[A-Za-z_][\w \t*]*?[ \t*](\w+)"
)
#: `type name(params) {` (params may span lines)
_FUNC_DEF = re.compile(_START + r"\s*\([^;{}]*\)\s*\{", re.M)
#: `type name[...] = ...;`, `type name;` (attributes are removed first)
_DATA_DEF = re.compile(_START + r"\s*(?:\[[^\]\n]*\])?\s*(?:=|;)", re.M)
#: a file-scope static: `static ... name(`, `static ... name[`, `= `, `;`
_STATIC_DEF = re.compile(r"^static\b[^;(){}=]*?\b(\w+)\s*(?:\(|\[|=|;)", re.M)
#: a header's inline function: `static inline ... name(params) {`
_INLINE_DEF = re.compile(r"^static\s+inline\b[^;{}]*?\b(\w+)\s*\([^;{}]*\)\s*\{", re.M)
#: a header's function-like macro: `#define NAME(args) body` (continued lines)
_MACRO_DEF = re.compile(r"^#\s*define\s+(\w+)\(([^)]*)\)((?:[^\n]*\\\n)*[^\n]*)", re.M)
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")


def _code(path: Path) -> str:
    text = _COMMENT.sub(" ", path.read_text(encoding="utf-8", errors="replace"))
    return _ATTRIBUTE.sub(" ", _STRING.sub('""', text))


def _body(code: str, start: int) -> str:
    """The braces' content from the `{` at or after `start`."""
    i = code.index("{", start)
    depth = 0
    for j in range(i, len(code)):
        depth += {"{": 1, "}": -1}.get(code[j], 0)
        if depth == 0:
            return code[i:j + 1]
    return code[i:]


def sources() -> dict[str, str]:
    """file -> its code, one entry per C file."""
    return {p.name: _code(p) for p in sorted(HOOKS.glob("*.c"))}


_INCLUDE = re.compile(r'^#\s*include\s+"([^"]+)"', re.M)


def _includes(path: Path) -> list[str]:
    """The project headers a file includes (before comments are removed)."""
    text = _COMMENT.sub(" ", path.read_text(encoding="utf-8", errors="replace"))
    return [h for h in _INCLUDE.findall(text) if (HOOKS / h).exists()]


def header_bodies(header: str | None = None) -> dict[str, str]:
    """The inline functions and function-like macros of `header` and the
    headers it includes (None: of every header) -> their bodies."""
    if header is None:
        names = [p.name for p in sorted(HOOKS.glob("*.h"))]
    else:
        names, todo = [], [header]
        while todo:
            h = todo.pop()
            if h not in names:
                names.append(h)
                todo.extend(_includes(HOOKS / h))
    out: dict[str, str] = {}
    for name in names:
        code = _code(HOOKS / name)
        for m in _INLINE_DEF.finditer(code):
            out[m[1]] = _body(code, m.start())
        for m in _MACRO_DEF.finditer(code):
            out[m[1]] = m[3]
    return out


def file_bodies(cfile: str) -> dict[str, str]:
    """The inline functions and macros a C file sees: its headers'."""
    out: dict[str, str] = {}
    for h in _includes(HOOKS / cfile):
        out.update(header_bodies(h))
    return out


def statics(code: str) -> set[str]:
    """The names a file defines as static at file scope."""
    return set(_STATIC_DEF.findall(code))


def definitions(src: dict[str, str]) -> dict[str, str]:
    """Every externally visible function or variable -> the file defining it."""
    where: dict[str, str] = {}
    for name, code in src.items():
        for pattern in (_FUNC_DEF, _DATA_DEF):
            for sym in pattern.findall(code):
                assert where.get(sym, name) == name, f"{sym} defined in {where[sym]} and {name}"
                where[sym] = name
    return where


def data_definitions(src: dict[str, str]) -> dict[str, str]:
    """Every externally visible variable -> the file defining it."""
    return {sym: name for name, code in src.items() for sym in _DATA_DEF.findall(code)}


def used_names(code: str, bodies: dict[str, str]) -> set[str]:
    """The names a file's code uses, with those of the header inline functions
    and macros it uses, followed to a fixpoint."""
    used = set(_WORD.findall(code))
    todo = [n for n in used if n in bodies]
    seen: set[str] = set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        more = set(_WORD.findall(bodies[n]))
        used |= more
        todo.extend(m for m in more if m in bodies and m not in seen)
    return used


def dependencies(src: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """file -> {file it depends on -> the symbols it uses there}."""
    defs = definitions(src)
    deps: dict[str, dict[str, set[str]]] = {name: {} for name in src}
    for name, code in src.items():
        bodies = file_bodies(name) if (HOOKS / name).exists() else {}
        used = used_names(code, bodies) - statics(code)
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


def core_files(src: dict[str, str]) -> list[str]:
    return [f for f in src if f == "core.c" or f.startswith("core_")]


def test_the_reader_sees_the_known_definitions() -> None:
    defs = definitions(sources())
    assert defs["hvprof_register_backend"] == STATE_FILE
    assert defs["hvprof_active"] == STATE_FILE
    assert defs["hvprof_open"] == "core_open.c"
    assert defs["hvprof_close"] == "core.c"
    assert defs["hvprof_refill"] == "core_flush.c"
    assert defs["hvprof_setting_int"] == "settings.c"
    assert defs["hvprof_nccl_json"] == "nccl_backend.c"
    assert defs["hvprof_nccl_comm_register"] == "nccl_common.c"
    assert defs["hvprof_nccl_nest"] == "nccl_common.c"
    assert defs["hvprof_dev_begin"] == "cuda_rt.c"
    assert defs["mpi_describe_slow"] == "mpi_handles.c"


def test_the_reader_follows_header_inline_functions_and_macros() -> None:
    """mpi_wrappers.c names none of these itself: its MPI_WRAPPER and
    NBC_WRAPPER macros and their inline functions (mpi_internal.h,
    hvprof_internal.h) do."""
    src = sources()
    assert {"hvprof_refill", "mpi_nbc_post"}.isdisjoint(_WORD.findall(src["mpi_wrappers.c"]))
    deps = dependencies(src)
    assert "mpi_nbc_post" in deps["mpi_wrappers.c"]["mpi_p2p.c"]
    assert "hvprof_refill" in deps["mpi_wrappers.c"]["core_flush.c"]
    assert "mpi_describe_slow" in deps["mpi_wrappers.c"]["mpi_handles.c"]


def test_a_files_own_static_is_not_another_files_symbol() -> None:
    """cuda_rt_pool.c's static helper_started is its own (a name the core's
    helper might share is no edge)."""
    src = sources()
    assert "helper_started" in statics(src["cuda_rt_pool.c"])
    deps = dependencies({**src, "x.c": "int helper_started;\n"})
    assert "x.c" not in deps["cuda_rt_pool.c"]


def test_a_circle_is_found_between_two_files_of_one_part() -> None:
    """The reader and the search: two core files calling each other are a
    circle (the core is not one node)."""
    src = sources()
    knot = {**src, "core_a.c": "void a_f(void) { b_f(); }\n",
            "core_b.c": "void b_f(void) { a_f(); }\n"}
    found = cycle(dependencies(knot))
    assert set(found) == {"core_a.c", "core_b.c"} and found[0] == found[-1]


def test_no_cycle_among_the_c_files() -> None:
    deps = dependencies(sources())
    assert deps["nccl.c"], "the reader found no dependency at all"
    assert deps["core.c"] and deps["core_flush.c"], "the core's files are nodes of their own"
    found = cycle(deps)
    assert not found, "C files depend on each other in a cycle: " + " -> ".join(found)


def test_the_core_names_no_backend() -> None:
    src = sources()
    deps = dependencies(src)
    core = set(core_files(src))
    for f in sorted(core):
        named = {g: sorted(syms) for g, syms in deps[f].items()
                 if g not in core and g not in CORE_MAY_CALL}
        assert named == {}, f"{f} calls into backends instead of their hooks: {named}"
    for leaf in CORE_MAY_CALL:
        assert deps[leaf] == {}, f"{leaf} is called by the core: it may call nothing"


def test_the_cores_state_has_one_owner() -> None:
    """Every variable a core file shares is defined in core_state.c, which
    calls no other file; the others keep theirs static."""
    src = sources()
    data = data_definitions(src)
    elsewhere = sorted(f"{sym} ({f})" for sym, f in data.items()
                       if f in core_files(src) and f != STATE_FILE)
    assert elsewhere == [], f"core state defined outside {STATE_FILE}: {elsewhere}"
    assert {s for s, f in data.items() if f == STATE_FILE} >= {
        "hvprof_active", "hvprof_core", "app_active", "hvprof_generation", "hvprof_divert"}
    assert dependencies(src)[STATE_FILE] == {}, f"{STATE_FILE} calls another file"


def test_the_cores_parts_are_private_to_it() -> None:
    """core_internal.h (the core's state and its files' shared functions) is
    included by the core's files only: a backend sees hvprof_internal.h."""
    for p in sorted(HOOKS.glob("*.c")):
        includes = f'#include "{STATE_HEADER}"' in p.read_text(encoding="utf-8")
        assert includes == (p.name == "core.c" or p.name.startswith("core_")), p.name
