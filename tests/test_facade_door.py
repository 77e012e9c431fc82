"""One door for every command: a CLI command that reads a profile opens it
through profiler.analysis.facade (TraceAnalysis) and asks it questions; it
reads no trace, dataset or raw file itself, and swallows no exception.

Read from the sources with `ast` (no process, no import of the commands)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parent.parent / "profiler" / "cli"

# These build or run things (a merge, a preload, a benchmark, a synthetic
# trace, an exported window's trace.json) rather than read a profile: the rule
# is not theirs.
BUILDERS = {"merge.py", "preload.py", "bench.py", "synth.py", "export.py"}
# A reader that also builds, by the post-job stage: (command, module, name).
# `profiler tensors` builds the lineage the merge did not write and hands it to
# the facade (TraceAnalysis.use_lineage).
BUILDS_TOO = {("tensors.py", "profiler.postjob.lineage", "build_lineage")}

# The readers: a command calling one reads the profile behind the facade's back.
READERS = {"load", "load_meta", "load_aggregates", "trace_meta", "read_trace",
           "read_trace_meta", "read_dataset", "read_files", "read_raw", "read_meta",
           "open_dataset", "read_table", "build_lineage"}
# Modules that read files of a profile directly.
READER_MODULES = ("pyarrow.parquet", "pyarrow.dataset", "profiler.formats.tracejson",
                  "profiler.formats.raw", "profiler.formats.dataset",
                  "profiler.formats.trace_dataset", "profiler.postjob.export",
                  "profiler.formats.lineage", "profiler.postjob.lineage")
# Allowed names from those modules: pure helpers that read no file.
PURE = {("profiler.formats.raw", "printable"),
        ("profiler.formats.dataset", "printable_columns")}

# Known departures, each (module, imported analysis module or "except"): none.
PENDING: set[tuple[str, str]] = set()

BROAD = {"Exception", "BaseException", "ValueError", "KeyError", "OSError", "LookupError",
         "IOError", "EnvironmentError", "RuntimeError", "TypeError", "AttributeError"}


def _modules(skip: set[str] = BUILDERS) -> list[Path]:
    return sorted(p for p in CLI.glob("*.py") if p.name not in skip)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(tree: ast.Module) -> list[tuple[int, str, str | None]]:
    """(line, module, name) for every import, at any depth (functions, TYPE_CHECKING)."""
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: inside profiler.cli
                base = "profiler.cli" + ("." + base if base else "")
            out += [(node.lineno, base, a.name) for a in node.names]
    return out


def _door_violations(path: Path) -> list[str]:
    bad = []
    tree = _tree(path)
    for node in ast.walk(tree):  # a file opened by hand: open(), Path.read_bytes()...
        if isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id == "open")
                or (isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("read_bytes", "read_text"))):
            bad.append(f"{path.name}:{node.lineno}: reads a file itself")
    for line, module, name in _imports(tree):
        where = f"{path.name}:{line}"
        if (path.name, module, name) in BUILDS_TOO:
            continue
        if name in READERS:
            bad.append(f"{where}: imports {name} from {module}")
        elif module.startswith(READER_MODULES) and (module, name) not in PURE:
            bad.append(f"{where}: imports {module}{'.' + name if name else ''}")
        else:
            if module == "profiler.analysis" and name not in (None, "TraceAnalysis"):
                module = f"profiler.analysis.{name}"  # a module or a re-exported function
            if (module.startswith("profiler.analysis.")
                    and module != "profiler.analysis.facade"
                    and (path.name, module) not in PENDING):
                bad.append(f"{where}: imports {module} (not the facade)")
    return bad


def _handler_names(h: ast.ExceptHandler) -> set[str]:
    if h.type is None:
        return {"BaseException"}  # a bare except
    types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
    return {t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute)
            else "?" for t in types}


def _does_nothing(body: list[ast.stmt]) -> bool:
    return all(isinstance(s, (ast.Pass, ast.Continue))
               or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               for s in body)


def _swallowing(path: Path) -> list[str]:
    bad = []
    for node in ast.walk(_tree(path)):
        if (isinstance(node, ast.ExceptHandler) and _handler_names(node) & BROAD
                and _does_nothing(node.body) and (path.name, "except") not in PENDING):
            bad.append(f"{path.name}:{node.lineno}: except "
                       f"{', '.join(sorted(_handler_names(node)))}: swallowed")
    return bad


def test_the_commands_read_profiles_through_the_facade_only() -> None:
    modules = _modules()
    assert {"report.py", "compare.py", "tensors.py", "hang.py", "check.py",
            "summarize.py", "advise.py"} <= {p.name for p in modules}
    bad = [v for p in modules for v in _door_violations(p)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["report.py", "compare.py", "tensors.py", "hang.py",
                                  "check.py", "summarize.py", "advise.py"])
def test_each_command_opens_its_profile_through_the_facade(name: str) -> None:
    imports = _imports(_tree(CLI / name))
    assert any(m == "profiler.analysis.facade" and n == "TraceAnalysis"
               for _, m, n in imports), name


def test_no_command_swallows_an_exception() -> None:
    bad = [v for p in _modules(skip=set()) for v in _swallowing(p)]
    assert not bad, "\n".join(bad)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checks themselves: a module that loads behind the facade's back, or
    swallows a KeyError, is named."""
    src = tmp_path / "cmd.py"
    src.write_text(
        "def run(args):\n"
        "    from profiler.analysis.load import load\n"
        "    from profiler.analysis.hang import diagnose\n"
        "    from profiler.analysis import compare\n"
        "    import pyarrow.parquet as pq\n"
        "    meta = open(args.trace).read()\n"
        "    try:\n"
        "        return load(args.trace)\n"
        "    except (ValueError, KeyError):\n"
        "        pass\n")
    door = _door_violations(src)
    assert any("imports load" in v for v in door)
    assert any("profiler.analysis.hang" in v for v in door)
    assert any("profiler.analysis.compare" in v for v in door)
    assert any("pyarrow.parquet" in v for v in door)
    assert any("reads a file itself" in v for v in door)
    assert _swallowing(src) == ["cmd.py:9: except KeyError, ValueError: swallowed"]
    fine = tmp_path / "fine.py"
    fine.write_text(
        "def run(args):\n"
        "    from profiler.analysis.facade import TraceAnalysis\n"
        "    from profiler.errors import ProfilerError\n"
        "    try:\n"
        "        return TraceAnalysis.open(args.trace).check()\n"
        "    except KeyError as exc:\n"
        "        raise ProfilerError(args.trace, str(exc)) from None\n")
    assert _door_violations(fine) == [] and _swallowing(fine) == []
