"""Hostile inputs: every reader fuzzed, names escaped, the CLI one line.

The bounded CI run of benchmarks/fuzz_readers.py (--quick, the subset its
--help states) feeds every reader (raw files, their header, summary-mode .agg
files, the per-rank parquet and json, trace.json, Horovod timelines, bench
plans) real seed files truncated at every byte boundary (raw) or at 120
points, seeded bit flips, extreme header fields, wrong versions, JSON type
swaps, deep and enormous JSON, and a directory, a FIFO, an unreadable file, a
dangling symlink and an empty file in the file's place.  Every case must be
accepted or refused with a ProfilerError, within the time limit, under a
4 GiB address-space limit; a sample runs through the CLI entry point.

Then the real CLI as a subprocess on the path kinds (a FIFO must not hang),
and strings from traces (host, thread, communicator names with escape
sequences) must reach neither the terminal nor the HTML report raw."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, base_env, profiler_cli

FUZZ = ROOT / "benchmarks" / "fuzz_readers.py"
READERS = ["raw", "header", "agg", "meta", "parquet", "trace", "timeline", "plan", "tensors",
           "hang"]
MIN_CASES = {"raw": 5000, "header": 5000, "agg": 300, "meta": 150, "parquet": 300,
             "trace": 150, "timeline": 150, "plan": 150, "tensors": 100, "hang": 300}
# Readers that take anything by design and say what they could not read:
# the tensor names (a bad line ends the list) and the hang diagnosis (an
# unreadable raw file is a rank in state "unreadable")
NEVER_REFUSE = {"tensors", "hang"}
# Findings accepted for now (reader, where, fragment of the message): none.
KNOWN: list[tuple[str, str, str]] = []


def known(f: dict[str, str]) -> bool:
    return any(f["reader"] == r and f["where"] == w and s in f["what"] for r, w, s in KNOWN)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("fuzz") / "report.json"
    p = subprocess.run([PYTHON, "-P", str(FUZZ), "--quick", "--jobs", "2", "--case-timeout", "10",
                        "--max-rss-mb", "1536", "--json", str(out)],
                       env=base_env(), capture_output=True, text=True, timeout=280,
                       preexec_fn=_limit_memory)
    assert out.is_file(), p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads(out.read_text())
    rep["stdout"] = p.stdout
    return rep


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reader", READERS)
def test_reader_refuses_hostile_input(fuzz: dict, reader: str) -> None:
    assert fuzz["cases"][reader] >= MIN_CASES[reader]
    if reader in NEVER_REFUSE:
        assert fuzz["accepted"][reader] == fuzz["cases"][reader] - fuzz["refused"][reader]
    else:
        assert fuzz["refused"][reader] > 0
    found = [f for f in fuzz["findings"] if f["reader"] in (reader, "*") and not known(f)]
    assert found == [], "\n".join(f"{f['where']} {f['case']}: {f['what']}" for f in found[:20])
    assert fuzz["slowest_s"][reader] < 10
    assert fuzz["max_rss_mb"] < 1536


# ---------------------------------------------------------------------------
# the real CLI on path kinds
# ---------------------------------------------------------------------------
def one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("profiler: error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


@pytest.mark.timeout(120)
def test_cli_path_kinds(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    assert "trace" in one_error_line(profiler_cli("summarize", str(fifo), timeout=30))
    prof = tmp_path / "prof"
    (prof / "raw").mkdir(parents=True)
    os.mkfifo(prof / "raw" / "rank-00000.hvprof")
    one_error_line(profiler_cli("merge", str(prof), timeout=30))
    (tmp_path / "dir.json").mkdir()
    one_error_line(profiler_cli("summarize", str(tmp_path / "dir.json"), timeout=30))
    (tmp_path / "mem.json").symlink_to("/proc/self/mem")  # open works, read fails (EIO)
    one_error_line(profiler_cli("summarize", str(tmp_path / "mem.json"), timeout=30))
    (tmp_path / "empty.json").write_bytes(b"")
    one_error_line(profiler_cli("summarize", str(tmp_path / "empty.json"), timeout=30))
    deep = tmp_path / "deep.json"
    deep.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    one_error_line(profiler_cli("summarize", str(deep), timeout=30))


# ---------------------------------------------------------------------------
# names with escape sequences
# ---------------------------------------------------------------------------
EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"


@pytest.fixture(scope="module")
def evil_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rawgen import records, simple_rank

    prof = tmp_path_factory.mktemp("evil") / "prof"
    for r in (0, 1):
        w = simple_rank(r, 2, n=20, hostname=f"host{EVIL}"[:63])
        w.comms[0] = (0x5EED, 2, r, 0, f"world{EVIL}")
        w.tracks[0] = (1000 + r, 1, 1, f"py{EVIL}"[:15], f"horovod{EVIL}"[:31], -1)
        extra = w.add_track(2000 + r, name=f"t{EVIL}"[:15], caller="mpi_lib")
        w.add(extra, records(3, t_start=[5_000, 6_000, 7_000], t_end=[5_500, 6_500, 7_500],
                             bytes=64, count=16, seq=[20, 21, 22], op=1, dtype=14, redop=1,
                             dtype_size=4))
        w.write(prof / "raw" / f"rank-{r:05d}.hvprof")
    p = profiler_cli("merge", str(prof))
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout + p.stderr
    return prof / "trace.json"


@pytest.mark.timeout(120)
def test_terminal_output_has_no_escape_sequences(evil_trace: Path) -> None:
    # the names reached the trace, their control characters spelled out at conversion
    host = json.loads(evil_trace.read_bytes())["horovod_profiler"]["hosts"][0]
    assert host == "host\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31m"
    for by in ("op,bucket", "rank,thread,comm,track", "kind,dtype,backend,bytes"):
        for fmt in ("table", "csv"):
            p = profiler_cli("summarize", str(evil_trace), "--by", by, "--format", fmt)
            assert p.returncode == 0, p.stderr
            assert "\x1b" not in p.stdout and "\x07" not in p.stdout, (by, fmt, p.stdout)
            assert "\x1b" not in p.stderr


@pytest.mark.timeout(200)
def test_html_report_has_no_escape_sequences(evil_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    p = profiler_cli("report", str(evil_trace), "-o", str(out), "--no-progress", timeout=180)
    assert p.returncode == 0, p.stderr
    html = out.read_bytes()
    assert b"\x1b" not in html and b"\x07" not in html
    assert b"pwned" in html  # the name is shown, escaped


@pytest.fixture(scope="module")
def crafted_trace(evil_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The evil trace's dataset rewritten by another tool: raw control characters
    and rich markup in the names (the profiler's converter would have escaped them)."""
    import shutil

    import pandas as pd

    prof = tmp_path_factory.mktemp("crafted") / "prof"
    shutil.copytree(evil_trace.parent, prof)
    for f in sorted((prof / "ranks").glob("rank-*.parquet")):
        df = pd.read_parquet(f)
        df["comm_name"] = df["comm_name"].cat.rename_categories(lambda c: "world" + EVIL)
        df["thread_kind"] = df["thread_kind"].cat.rename_categories(
            lambda c: f"[bold red]{c}[/]")
        df.to_parquet(f)
    return prof / "trace.json"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_crafted_dataset_names_are_escaped_on_the_terminal(crafted_trace: Path,
                                                           engine: str) -> None:
    for fmt in ("table", "csv", "json"):
        p = profiler_cli("summarize", str(crafted_trace), "--by", "comm,thread",
                         "--format", fmt, "--engine", engine)
        assert p.returncode == 0, p.stderr
        assert "\x1b" not in p.stdout and "\x07" not in p.stdout, (fmt, p.stdout)
        # shown spelled out (json doubles the backslash), markup shown as text
        assert "world\\x1b]0;pwned" in p.stdout.replace("\\\\", "\\"), (fmt, p.stdout)
        assert "[bold red]" in p.stdout, (fmt, p.stdout)


def test_crafted_dataset_names_are_escaped_by_the_api(crafted_trace: Path) -> None:
    from profiler.analysis import load

    df = load(crafted_trace)
    names = set(map(str, df["comm_name"].cat.categories))
    assert names == {"world\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31m"}, names
