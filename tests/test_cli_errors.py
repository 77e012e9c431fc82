"""Bad input for `profiler summarize` and `profiler merge`: one line
`profiler: error: <file>: <what is wrong>` on stderr, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import rawgen
from conftest import profiler_cli

from profiler.postjob.merge import merge


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


# ---------------------------------------------------------------------------
# Findings of the full reader fuzz (benchmarks/fuzz_readers.py), one test each
# ---------------------------------------------------------------------------
def _copy(good: Path, tmp: Path) -> Path:
    import shutil

    d = tmp / "prof"
    shutil.copytree(good, d)
    return d


def _edit_meta(trace: Path, edit: object) -> None:
    import orjson

    doc = orjson.loads(trace.read_bytes())
    edit(doc["horovod_profiler"])  # type: ignore[operator]
    trace.write_bytes(orjson.dumps(doc))


BAD_META = [
    (lambda m: m["dataset"]["files"].__setitem__(0, 5), "dataset.files[0]"),
    (lambda m: m["dataset"]["files"].__setitem__(0, None), "dataset.files[0] is null"),
    (lambda m: m["ranks"][0].__setitem__("rank", "x"), "ranks[0].rank"),
    (lambda m: m["ranks"][1].__setitem__("rank", None), "ranks[1].rank is missing"),
    (lambda m: m["ranks"][1].__setitem__("dropped", [1]), "ranks[1].dropped"),
    (lambda m: m.__setitem__("missing_ranks", [1.5]), "missing_ranks[0]"),
    (lambda m: m.__setitem__("env", {"HOROVOD_X": 3}), "env.HOROVOD_X"),
    (lambda m: m.__setitem__("events", []), "events is not an object"),
    (lambda m: m.__setitem__("world_size", True), "world_size"),
]


@pytest.mark.parametrize("edit, field", BAD_META)
def test_mistyped_trace_metadata_is_refused_by_name(tmp_path: Path, good: Path, edit: object,
                                                    field: str) -> None:
    """Every command reads the metadata through one validator: the first field
    goes through all four commands, each other field through one of them in
    turn (every command sees several fields, every field one command)."""
    d = _copy(good, tmp_path)
    _edit_meta(d / "trace.json", edit)
    cmds = (["summarize"], ["summarize", "--engine", "pandas"], ["report", "-o",
            str(tmp_path / "r.html"), "--no-progress"], ["export", "--ranks", "0", "-o",
            str(tmp_path / "w.json")])
    i = [f for _, f in BAD_META].index(field)
    for cmd in (cmds if i == 0 else [cmds[i % len(cmds)]]):
        p = cli(tmp_path, cmd[0], str(d / "trace.json"), *cmd[1:])
        assert_one_line_error(p, "malformed metadata", field)


def _rewrite_parquet(d: Path, change: object) -> Path:
    import pyarrow.parquet as pq

    f = sorted((d / "ranks").glob("rank-*.parquet"))[0]
    pq.write_table(change(pq.read_table(f)), f)  # type: ignore[operator]
    return f


def test_parquet_of_the_wrong_shape_is_refused_by_column(tmp_path: Path, good: Path) -> None:
    import pyarrow as pa

    d = _copy(good, tmp_path)
    f = _rewrite_parquet(d, lambda t: t.drop(["t_start_ns"]))
    (d / "trace.json").unlink()
    for cmd in ("merge", "summarize"):
        assert_one_line_error(cli(tmp_path, cmd, str(d)), str(f), "no t_start_ns column")
    assert not (d / "trace.json").exists()

    d = _copy(good, tmp_path / "b")
    f = _rewrite_parquet(d, lambda t: t.set_column(t.schema.get_field_index("bytes"), "bytes",
                                                   pa.array([str(x) for x in t["bytes"]])))
    for engine in ("pandas", "duckdb"):
        p = cli(tmp_path, "summarize", str(d), "--engine", engine)
        assert_one_line_error(p, "column bytes has type string, expected int")
    # wider than 64 bits, where the schema expects an integer
    d = _copy(good, tmp_path / "c")
    _rewrite_parquet(d, lambda t: t.set_column(
        t.schema.get_field_index("dur_ns"), "dur_ns",
        pa.array([10**30] * len(t), pa.decimal128(38, 0))))
    assert_one_line_error(cli(tmp_path, "summarize", str(d)), "column dur_ns has type decimal")


def test_other_tools_extra_columns_are_kept_or_skipped(tmp_path: Path, good: Path) -> None:
    import pyarrow as pa

    from profiler.formats.dataset import read_dataset

    d = _copy(good, tmp_path)
    f = _rewrite_parquet(d, lambda t: t.append_column(
        "huge", pa.array([10**30] * len(t), pa.decimal128(38, 0))).append_column(
        "note", pa.array(["x"] * len(t))).append_column(
        "nested", pa.array([{"a": 1}] * len(t))))
    df = read_dataset([f])
    assert "note" in df.columns and "huge" not in df.columns and "nested" not in df.columns
    ref = cli(tmp_path, "summarize", str(good), "--format", "csv")
    for engine in ("pandas", "duckdb"):
        p = cli(tmp_path, "summarize", str(d), "--format", "csv", "--engine", engine)
        assert p.returncode == 0, p.stderr
        assert p.stdout == ref.stdout


@pytest.mark.parametrize("flags", [0xFFFF, 0x8])
def test_device_flag_on_a_host_record_is_summarized(tmp_path: Path, flags: int) -> None:
    # a record flagged as a device interval (bit 3) in a directory of raw files:
    # summarize must load what device-time matching needs (comm, seq)
    w = rawgen.simple_rank(0, 1, n=10)
    for recs in w.per_track.values():
        for a in recs:
            a["flags"][0] = flags
    d = tmp_path / "prof"
    w.write(d / "raw" / "rank-00000.hvprof")
    for fmt in ("table", "csv"):
        p = cli(tmp_path, "summarize", str(d), "--format", fmt)
        assert p.returncode == 0, p.stderr
    assert "allreduce,2 KiB-4 KiB,9," in p.stdout  # the device-flagged row is not a call


def test_paths_from_a_trace_reach_the_terminal_escaped(tmp_path: Path, good: Path) -> None:
    d = _copy(good, tmp_path)
    _edit_meta(d / "trace.json",
               lambda m: m["dataset"].__setitem__("files", ["ranks/\x1b[2Jgone.parquet"]))
    for engine in ("pandas", "duckdb"):
        p = cli(tmp_path, "summarize", str(d / "trace.json"), "--engine", engine)
        said = p.stdout + p.stderr
        assert "\x1b" not in said and "Traceback" not in said, said
        if engine == "duckdb":  # nothing to query: said in one line
            assert_one_line_error(p, "no parquet dataset to query")
            continue
        # the events in trace.json, with one warning line naming the missing file
        assert p.returncode == 0
        warn = [x for x in p.stderr.splitlines() if x.startswith("profiler: warning: ")]
        assert len(warn) == 1 and "parquet dataset missing" in warn[0], p.stderr
        assert "\\x1b[2Jgone.parquet" in warn[0], p.stderr


def test_compare_runs_bad_input(tmp_path: Path, good: Path) -> None:
    """`profiler compare A1 A2 --vs B1 B2`: a --vs without files, a missing run,
    sides of unequal runs with --paired: one line each, exit status 2."""
    trace = str(good / "trace.json")
    assert_one_line_error(cli(tmp_path, "compare", trace, "--vs"), "--vs",
                          "expected at least one argument")
    assert_one_line_error(cli(tmp_path, "compare", trace, "--vs", str(tmp_path / "nope.json")),
                          "nope.json", "no such file")
    assert_one_line_error(cli(tmp_path, "compare", trace, trace, "--vs", trace, "--paired"),
                          "paired runs", "as many runs")
    assert_one_line_error(cli(tmp_path, "compare", trace, trace, "--paired"), "--paired")
