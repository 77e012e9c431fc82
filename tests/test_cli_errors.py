"""Bad input for `profiler summarize` and `profiler merge`: one line
`profiler: error: <file>: <what is wrong>` on stderr, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import rawgen
from conftest import profiler_cli

from profiler.merge import merge


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return profiler_cli(*args, cwd=cwd)


def assert_one_line_error(p: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("profiler: error: "), lines[0]
    assert "Traceback" not in p.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("good")
    for r in range(2):
        rawgen.simple_rank(r, 2, n=20).write(d / "raw" / f"rank-{r:05d}.hvprof")
    merge(d)
    return d


def bad_traces(tmp: Path, good: Path) -> dict[str, tuple[Path, str]]:
    text = (good / "trace.json").read_bytes()
    cases: dict[str, tuple[bytes | None, str]] = {
        "empty": (b"", "empty file"),
        "truncated": (text[: len(text) // 2], "truncated"),
        "truncated_meta": (text[:40], "truncated"),
        "corrupt": (bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)),
                    "not a trace"),
        "other_tool": (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}]}',
                       "not a horovod-profiler trace"),
        "timeline": (b'[{"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "ts": 0, "pid": 1}]',
                     "Horovod timeline"),
        "newer": (text.replace(b'"format_version":1', b'"format_version":2', 1),
                  "version 2 is newer"),
        "csv": (b"op,bytes\nallreduce,8\n", "not JSON"),
    }
    out = {}
    for name, (content, fragment) in cases.items():
        p = tmp / f"{name}.json"
        p.write_bytes(content or b"")
        out[name] = (p, fragment)
    return out


def test_summarize_bad_traces(tmp_path: Path, good: Path) -> None:
    for name, (p, fragment) in bad_traces(tmp_path, good).items():
        r = cli(tmp_path, "summarize", str(p))
        assert_one_line_error(r, str(p), fragment)
        assert r.stdout == "", name


def test_summarize_missing_and_directories(tmp_path: Path, good: Path) -> None:
    assert_one_line_error(cli(tmp_path, "summarize", str(tmp_path / "nope.json")),
                          "nope.json", "no such file")
    assert_one_line_error(cli(tmp_path, "summarize", str(tmp_path)), str(tmp_path),
                          "not a profile directory")
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not really")
    assert_one_line_error(cli(tmp_path, "summarize", str(tmp_path / "x.parquet")),
                          "x.parquet", "unreadable parquet")


def test_summarize_dataset_gone_and_corrupt(tmp_path: Path, good: Path) -> None:
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(good, d)
    (d / "ranks" / "rank-00001.parquet").write_bytes(b"garbage")
    assert_one_line_error(cli(tmp_path, "summarize", str(d / "trace.json")), "unreadable parquet")


def test_summarize_bad_arguments(tmp_path: Path, good: Path) -> None:
    t = str(good / "trace.json")
    assert_one_line_error(cli(tmp_path, "summarize", t, "--by", "op,colour"), "colour")
    assert_one_line_error(cli(tmp_path, "summarize", t, "--rank", "9"), "rank 9 is not in")
    assert_one_line_error(cli(tmp_path, "summarize", t, "--rank", "one"), "invalid int")
    assert_one_line_error(cli(tmp_path, "summarize", t, "--format", "xml"), "invalid choice")
    assert_one_line_error(cli(tmp_path, "summarize"), "required")
    assert_one_line_error(cli(tmp_path, "frobnicate"), "invalid choice")


def test_merge_bad_inputs(tmp_path: Path) -> None:
    assert_one_line_error(cli(tmp_path, "merge", str(tmp_path / "nope")), "no such directory")
    f = tmp_path / "file"
    f.write_text("x")
    assert_one_line_error(cli(tmp_path, "merge", str(f)), "not a profile directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(cli(tmp_path, "merge", str(empty)), "no raw/ or ranks/")
    (empty / "raw").mkdir()
    assert_one_line_error(cli(tmp_path, "merge", str(empty)), "empty profile directory")
    bad = tmp_path / "bad"
    for name, content in {"rank-00000.hvprof": b"",
                          "rank-00001.hvprof": b"GARBAGE!" * 1000}.items():
        (bad / "raw").mkdir(parents=True, exist_ok=True)
        (bad / "raw" / name).write_bytes(content)
    assert_one_line_error(cli(tmp_path, "merge", str(bad)), "no raw file could be read")
    newer = tmp_path / "newer"
    data = rawgen.patch_header(rawgen.simple_rank(0, 1).to_bytes(), version=9)
    (newer / "raw").mkdir(parents=True)
    (newer / "raw" / "rank-00000.hvprof").write_bytes(data)
    assert_one_line_error(cli(tmp_path, "merge", str(newer)), "version 9 is newer")


def test_merge_ok_and_partial(tmp_path: Path) -> None:
    d = tmp_path / "job"
    for r in range(3):
        w = rawgen.simple_rank(r, 3, n=5)
        if r == 2:
            w.state = 0x3  # killed: open + mpi_init
        w.write(d / "raw" / f"rank-{r:05d}.hvprof")
    (d / "raw" / "rank-00001.hvprof").write_bytes(b"HVPROF\0\0" + bytes(50))
    p = cli(tmp_path, "merge", str(d))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (f"profiler: trace written to {d / 'trace.json'} (2 ranks, "
                                "10 calls; missing ranks: 1; partial ranks (killed): 2)")
    assert "profiler: warning: rank 1:" in p.stderr


def test_preload_prints_the_library(tmp_path: Path) -> None:
    p = cli(tmp_path, "preload")
    assert p.returncode == 0
    path = Path(p.stdout.strip())
    assert path.name == "libhvprof.so" and path.is_file()
    p = profiler_cli("preload", cwd=tmp_path, env={"HVPROF_LIB": str(tmp_path / "none.so")})
    assert_one_line_error(p, "none.so", "not found")
