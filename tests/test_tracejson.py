"""trace.json: layout (Chrome trace object form + metadata), event selection,
metadata reading with validation, merge of a profile directory, load() fallback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import orjson
import pytest
import rawgen

from profiler.analysis import load, load_meta
from profiler.errors import (
    CorruptError,
    EmptyProfileError,
    NotATraceError,
    NotFoundError,
    TruncatedError,
    VersionError,
)
from profiler.formats import record as F
from profiler.formats import tracejson as T
from profiler.postjob import window as W
from profiler.postjob.merge import merge


def make_job(d: Path, world: int = 2, n: int = 10, *, skip: tuple[int, ...] = (),
             killed: tuple[int, ...] = ()) -> Path:
    for r in range(world):
        if r in skip:
            continue
        w = rawgen.simple_rank(r, world, n=n + r, nbytes=4096 * (r + 1))
        w.add_track(7000 + r, name="bg", caller="mpi_lib.cpython-311-x86_64-linux-gnu.so")
        w.add(1, rawgen.records(3, t_start=[5, 6, 7], t_end=[6, 7, 8], op=13))
        if r in killed:
            w.state = F.STATE_OPEN | F.STATE_MPI_INIT
        w.write(d / "raw" / f"rank-{r:05d}.hvprof")
    return d


def test_merge_writes_a_chrome_trace(tmp_path: Path) -> None:
    d = make_job(tmp_path / "job")
    res = merge(d)
    assert res.ranks == [0, 1] and res.world_size == 2
    assert res.calls == (10 + 3) + (11 + 3)
    assert res.missing_ranks == [] and res.partial_ranks == []
    assert res.summary_line() == f"{d / 'trace.json'} (2 ranks, 27 calls)"
    doc = orjson.loads((d / "trace.json").read_bytes())
    assert set(doc) == {"traceEvents", "displayTimeUnit", "horovod_profiler"}
    json.loads((d / "trace.json").read_text())  # plain JSON too
    ev = doc["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == 27
    assert {e["pid"] for e in xs} == {0, 1}
    r1 = [e for e in xs if e["pid"] == 1 and e["name"] == "allreduce"]
    assert len(r1) == 11 and all(e["args"]["bytes"] == 8192 for e in r1)
    assert r1[0]["ts"] == 1.0 and r1[0]["dur"] == 2.0  # microseconds
    assert r1[0]["args"]["comm"] == "0x5eed" and r1[0]["args"]["seq"] == 0
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[(0, 0)].startswith("main thread")
    assert names[(1, 1)].startswith("Horovod background thread")
    procs = {e["pid"]: e["args"]["name"] for e in ev
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "rank 0 (testhost)", 1: "rank 1 (testhost)"}
    meta = doc["horovod_profiler"]
    assert meta["format_version"] == T.TRACE_FORMAT_VERSION
    assert meta["world_size"] == 2 and meta["hosts"] == ["testhost"]
    assert meta["dataset"] == {"format": "parquet", "calls": 27, "rows": 27, "aggregates": [],
                               "files": ["ranks/rank-00000.parquet", "ranks/rank-00001.parquet"]}
    assert meta["events"] == {"included": 27, "total": 27, "selection": "all"}
    assert [r["calls"] for r in meta["ranks"]] == [13, 14]
    assert meta["mpi_version"].startswith("Open MPI")
    assert read_first_key(d / "trace.json") == "horovod_profiler"


def read_first_key(p: Path) -> str:
    return p.read_bytes()[2:18].decode()


def test_missing_and_partial_ranks(tmp_path: Path) -> None:
    d = make_job(tmp_path / "job", world=4, skip=(2,), killed=(3,))
    res = merge(d)
    assert res.ranks == [0, 1, 3]
    assert res.missing_ranks == [2] and res.partial_ranks == [3]
    assert "missing ranks: 2" in res.summary_line()
    assert "partial ranks (killed): 3" in res.summary_line()
    meta = load_meta(d)
    assert meta["missing_ranks"] == [2] and meta["partial_ranks"] == [3]
    assert meta["world_size"] == 4


def test_merge_reuses_up_to_date_parquet(tmp_path: Path) -> None:
    d = make_job(tmp_path / "job")
    assert merge(d).converted == [0, 1]
    assert merge(d).converted == []
    make_job(d, n=20)  # the raw files changed
    assert merge(d).converted == [0, 1]


def test_event_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_job(tmp_path / "job", world=2, n=100)
    monkeypatch.setenv("HOROVOD_PROFILE_TRACE_EVENTS", "50")
    merge(d)
    meta = load_meta(d)
    assert meta["events"]["included"] == 50 and meta["events"]["total"] == 207
    assert meta["events"]["selection"].startswith("window: the 50 calls")
    doc = orjson.loads((d / "trace.json").read_bytes())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 50
    ts = sorted(e["ts"] for e in xs)
    assert ts[0] > 5 and ts[-1] < 1000  # the middle, not the start or the end
    # the dataset keeps every call
    assert len(load(d)) == 207


def test_select_window_is_centred() -> None:
    idx, desc = W.select_window(np.arange(100)[::-1].copy(), 10)
    assert idx.tolist() == list(range(45, 55))  # rows of t_start 45..54 (row i: 99 - i)
    assert desc.startswith("window")
    idx, desc = W.select_window(np.arange(5), 10)
    assert idx.tolist() == [0, 1, 2, 3, 4] and desc == "all"


def test_load_falls_back_to_events(tmp_path: Path) -> None:
    d = make_job(tmp_path / "job")
    merge(d)
    full = load(d / "trace.json")
    for p in (d / "ranks").glob("*.parquet"):
        p.unlink()
    with pytest.warns(UserWarning, match="parquet dataset missing"):
        df = load(d / "trace.json")
    assert len(df) == len(full) == 27
    cols = ["rank", "op", "bytes", "count", "seq", "comm", "dur_ns", "t_start_ns", "track"]
    a = full[cols].sort_values(["rank", "t_start_ns", "seq"]).reset_index(drop=True)
    b = df[cols].sort_values(["rank", "t_start_ns", "seq"]).reset_index(drop=True)
    assert a.astype(str).equals(b.astype(str))


def test_load_paths_and_labels(tmp_path: Path) -> None:
    a = make_job(tmp_path / "fused")
    b = make_job(tmp_path / "unfused", n=3)
    merge(a)
    df = load(a / "trace.json", b)  # b: no trace.json yet -> its raw files in memory
    assert df.groupby("label", observed=True).size().to_dict() == {"fused": 27, "unfused": 13}
    df2 = load(a, a, label=["x", "y"])
    assert df2["label"].astype(str).value_counts().to_dict() == {"x": 27, "y": 27}
    one = load(a / "ranks" / "rank-00001.parquet")
    assert len(one) == 14 and "label" not in one.columns
    assert len(load(a, ranks=[1])) == 14
    raw_only = load(b / "raw" / "rank-00000.hvprof")
    assert len(raw_only) == 6


@pytest.mark.parametrize(
    "content, error, text",
    [
        (b"", NotATraceError, "empty file"),
        (b"hello world", NotATraceError, "not JSON"),
        (b'[{"name": "x", "ph": "B", "ts": 0}]', NotATraceError, "Horovod timeline"),
        (b'{"traceEvents": []}', NotATraceError, "no 'horovod_profiler' metadata"),
        (b'{"horovod_profiler": {"format_version": 99}, "traceEvents": []}', VersionError,
         "version 99 is newer"),
        (b'{"horovod_profiler": {"format_version": "1"}, "traceEvents": []}', CorruptError,
         "integer format_version"),
        (b'{"horovod_profiler": {"format_version": 1, "dataset": 5}, "traceEvents": []}',
         CorruptError, "dataset"),
        (b'{"horovod_profiler": {"format_version": 1}, "traceEvents": [{"ph": "X", ',
         TruncatedError, "truncated"),
        (b'{"horovod_profiler": {"format_version": 1, "env": {"A', TruncatedError,
         "truncated"),
        (b'{"other": 1, "horovod_profiler": {"format_version": 1}, "traceEvents": [',
         TruncatedError, "truncated"),
    ],
)
def test_read_meta_refuses(tmp_path: Path, content: bytes, error: type, text: str) -> None:
    p = tmp_path / "trace.json"
    p.write_bytes(content)
    with pytest.raises(error) as info:
        T.read_trace_meta(p)
    assert text in str(info.value) and str(p) in str(info.value)


def test_read_meta_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        T.read_trace_meta(tmp_path / "nope.json")
    with pytest.raises(NotATraceError, match="is a directory"):
        T.read_trace_meta(tmp_path)


def test_read_meta_of_a_resaved_trace(tmp_path: Path) -> None:
    """Key order changed by another tool: the full-parse path still finds the block."""
    d = make_job(tmp_path / "job")
    merge(d)
    doc = orjson.loads((d / "trace.json").read_bytes())
    p = tmp_path / "resaved.json"
    p.write_text(json.dumps({"traceEvents": doc["traceEvents"],
                             "horovod_profiler": doc["horovod_profiler"]}))
    assert T.read_trace_meta(p)["world_size"] == 2


def test_merge_refuses(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        merge(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotATraceError):
        merge(tmp_path / "f")
    with pytest.raises(EmptyProfileError):
        merge(tmp_path)
    (tmp_path / "raw").mkdir()
    with pytest.raises(EmptyProfileError, match="empty profile directory"):
        merge(tmp_path)
    (tmp_path / "raw" / "rank-00000.hvprof").write_bytes(b"garbage" * 100)
    with pytest.raises(EmptyProfileError, match="no raw file could be read"):
        merge(tmp_path)


def test_merge_skips_an_unreadable_rank(tmp_path: Path) -> None:
    d = make_job(tmp_path / "job", world=3)
    head = b"HVPROF\0\0" + np.array([1, 4096, 64], dtype="<u4").tobytes()
    (d / "raw" / "rank-00001.hvprof").write_bytes(head + bytes(100))
    res = merge(d)
    assert res.ranks == [0, 2] and res.missing_ranks == [1]
    assert any("rank 1" in p and "truncated" in p for p in res.problems)


def test_write_is_atomic(tmp_path: Path) -> None:
    d = make_job(tmp_path / "job")
    merge(d)
    leftovers = [p for p in os.listdir(d) if p.endswith(".tmp")]
    assert leftovers == []


def test_rank0_wait_converts_dead_ranks_and_bounds_the_wait(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket
    import subprocess
    import sys
    import time

    from profiler.postjob.convert import convert_raw
    from profiler.postjob.merge import wait_and_merge

    d = tmp_path / "job"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for r, (pid, state) in enumerate([(os.getpid(), 0xF), (dead.pid, 0x3), (os.getpid(), 0x3)]):
        w = rawgen.simple_rank(r, 4, n=5, hostname=socket.gethostname(), pid=pid, state=state)
        w.write(d / "raw" / f"rank-{r:05d}.hvprof")
    convert_raw(d / "raw" / "rank-00000.hvprof", facts={"own": True})
    # rank 1 died (its pid is gone): converted by rank 0 at once; rank 2 still
    # runs (this pid) and never converts: the wait ends at the timeout; rank 3
    # has no file at all: missing
    t0 = time.monotonic()
    res = wait_and_merge(d, world_size=4, own_rank=0, timeout=1.0, poll=0.05)
    waited = time.monotonic() - t0
    assert 1.0 <= waited < 5.0
    assert res.ranks == [0, 1, 2] and res.missing_ranks == [3]
    assert res.partial_ranks == [1, 2]
    assert "gave up waiting for rank(s) 2" in capsys.readouterr().err


def test_rank0_wait_returns_as_soon_as_everyone_is_in(tmp_path: Path) -> None:
    import time

    from profiler.postjob.convert import convert_raw
    from profiler.postjob.merge import wait_and_merge

    d = make_job(tmp_path / "job", world=3)
    for r in range(3):
        convert_raw(d / "raw" / f"rank-{r:05d}.hvprof")
    t0 = time.monotonic()
    res = wait_and_merge(d, world_size=3, own_rank=0, timeout=30)
    assert time.monotonic() - t0 < 5 and res.ranks == [0, 1, 2] and res.converted == []
