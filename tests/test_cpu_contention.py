"""CPU contention measured directly (hooks/cpu.c, profiler.formats.cpu).

At every step record the library reads /proc/self/task/<tid>/schedstat of
every thread that recorded and writes one APP_CPU row per thread (op "cpu",
backend "app": t_start = that thread's previous read, t_end = this read,
bytes = ns on a CPU, count = ns waiting on a run queue, dtype_size =
timeslices, seq = the step, track = the measured thread); the rank's metadata
gets a ``cpu`` block (CPUs, affinity, load, the cost of a read, every thread
at start and at the end).  The rows stay out of every call count and out of
trace.json's events.

Unit tests build raw files with tests/rawgen.py; the job tests run real
Horovod under real mpirun: a 2-rank job (one row per known thread per step),
a 1-rank job pinned to one core beside a busy competitor on the same core
(the main thread waits about half its time) and on the other core (it hardly
waits), an mpi4py job whose worker thread exits mid-run, and one killed with
SIGKILL (its start figures survive).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
import rawgen
from conftest import PYTHON, mpirun, profiler_cli, requires_mpi

from profiler.formats import record as F

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "hooks" / "hvprof_format.h"
JOB = Path(__file__).resolve().parent / "hvd_model_job.py"
VALUE_KEYS = {"cpu_ns", "wait_ns", "slices", "nvcsw", "nivcsw", "t_ns", "last_cpu"}


# ---------------------------------------------------------------------------
# the format: op value and record fields, against the header
# ---------------------------------------------------------------------------
def test_app_cpu_op_in_the_header_the_library_and_python() -> None:
    assert F.OPS[36] == ("APP_CPU", "cpu", "app")
    assert F.OP_APP_CPU == 36 and F.OP_BY_NAME["cpu"] == 36
    text = HEADER.read_text()
    assert re.search(r'X\(36,\s*APP_CPU,\s*"cpu",\s*"app"\)', text)
    # every field the record uses is documented in the header's record comment
    m = re.search(r"APP_CPU \(not a call:(.*?)\.\s+MPI point-to-point", text, re.S)
    assert m, "APP_CPU record fields are not documented in hvprof_format.h"
    doc = " ".join(m.group(1).split())
    for field in ("t_start", "t_end", "bytes", "count", "dtype_size", "seq", "track"):
        assert re.search(rf"\b{field}\b", doc), field
    from profiler.collect import native

    layout = orjson.loads(native.layout_json())
    assert layout["ops"]["36"] == ["cpu", "app"]
    fields = layout["record"]["fields"]
    # the fields an APP_CPU record fills, where the Python view reads them
    for name in ("t_start", "t_end", "bytes", "count", "seq", "track", "op", "dtype_size"):
        assert fields[name][0] == F.RECORD_DTYPE.fields[name][1], name  # type: ignore[index]


def _rank_with_cpu_rows(steps: int = 3, calls_per_step: int = 2) -> rawgen.RawWriter:
    """Rank 0: a main thread that marks steps, Horovod's thread making calls,
    and after each step record one APP_CPU record per thread (in the main
    thread's chunk, each naming the thread it measured)."""
    w = rawgen.RawWriter(rank=0, world_size=1, pid=4242, chunk_bytes=1 << 16)
    w.add_comm(0x5EED, 1, 0, "MPI_COMM_WORLD")
    main = w.add_track(4242, is_main=True, name="python")
    hvd = w.add_track(4300, name="python", caller="mpi_lib.cpython-311-x86_64-linux-gnu.so")
    step_len = 10_000
    t0 = 1_000
    ends = t0 + step_len * np.arange(1, steps + 1, dtype=np.uint64)
    starts = ends - step_len
    calls = []
    for s in range(steps):
        at = int(starts[s]) + 1_000 + 3_000 * np.arange(calls_per_step, dtype=np.uint64)
        calls.append(rawgen.records(calls_per_step, t_start=at, t_end=at + 500, bytes=64,
                                    count=16, seq=s * calls_per_step + np.arange(calls_per_step),
                                    op=rawgen.op("allreduce"), dtype=rawgen.dtype("MPI_FLOAT"),
                                    redop=rawgen.redop("sum"), dtype_size=4))
    w.add(hvd, np.concatenate(calls))
    w.add(main, rawgen.records(steps, t_start=starts, t_end=ends, count=32,
                               seq=np.arange(steps), op=rawgen.op("step"),
                               comm=0xFFFFFFFF))
    prev = {main: t0 + 5, hvd: t0 + 7}
    cpu = []
    for s in range(steps):
        for k, tr in enumerate((main, hvd)):
            read = int(ends[s]) + 5 + 2 * k
            cpu.append(rawgen.records(1, t_start=prev[tr], t_end=read, bytes=6_000 + tr,
                                      count=3_000 + s, seq=s, track=tr, dtype_size=7 + k,
                                      op=rawgen.op("cpu"), comm=0xFFFFFFFF))
            prev[tr] = read
    w.add(main, np.concatenate(cpu), keep_track=True)
    return w


def _sidecar(pid: int = 4242) -> dict[str, Any]:
    def vals(base: int, ticks: int) -> dict[str, int]:
        return {"cpu_ns": base, "wait_ns": base // 2, "slices": 3, "nvcsw": 2, "nivcsw": 1,
                "ticks": ticks}

    return {
        "version": 1, "state": "exit", "pid": pid, "schedstat": True, "reason": "",
        "host_cpus": 2, "affinity": [1, 0], "loadavg_start": [0.5, 0.25, 0.125],
        "loadavg_end": [1.0, 0.5, 0.25], "read_cost_ns": 640, "omp_num_threads": "2",
        "helper_tid": 4301, "rows": 6, "steps": 3, "step_read_cpu_ns": 9000,
        "threads_gone": 0, "threads_omitted": 0,
        "threads": [
            {"tid": 4242, "name": "python", "start": vals(100, 500), "end": vals(900, 40_000)},
            {"tid": 4300, "name": "python", "start": vals(10, 600), "end": vals(90, 40_000)},
            {"tid": 4301, "name": "hvprof-io", "start": vals(0, 700), "end": None},
            {"tid": 4302, "name": "hvprof-watchdog", "start": None, "end": vals(5, 40_000)},
            {"tid": 4303, "name": "pt_worker\u0007", "start": vals(1, 800), "end": vals(2, 9)},
            {"tid": "x", "name": "bad"},  # malformed: skipped
            {"tid": 4304, "name": "bad values", "start": {"cpu_ns": -1}, "end": "?"},
        ],
    }


def test_cpu_rows_name_the_measured_thread_and_count_no_call(tmp_path: Path) -> None:
    from profiler.analysis._frame import call_mask
    from profiler.formats import rows
    from profiler.formats.raw import read_raw
    from profiler.postjob import convert

    w = _rank_with_cpu_rows()
    raw = w.write(tmp_path / "raw" / "rank-00000.hvprof")
    df = rows.raw_to_frame(read_raw(raw))
    cpu = df[df["op"].astype(str) == "cpu"]
    assert len(cpu) == 6
    assert set(cpu["backend"].astype(str)) == {"app"} and set(cpu["kind"].astype(str)) == {"app"}
    by_tid = {tid: g for tid, g in cpu.groupby("tid")}
    assert set(by_tid) == {4242, 4300}
    assert set(by_tid[4242]["thread_kind"].astype(str)) == {"main"}
    assert set(by_tid[4300]["thread_kind"].astype(str)) == {"horovod"}
    assert (cpu["step"] == cpu["seq"]).all()
    hv = by_tid[4300].sort_values("seq")
    assert hv["bytes"].tolist() == [6_001] * 3 and hv["count"].tolist() == [3_000, 3_001, 3_002]
    assert hv["dtype_size"].tolist() == [8] * 3
    assert hv["t_start_ns"].iloc[1:].tolist() == hv["t_end_ns"].iloc[:-1].tolist()
    # never a call: the call mask, the rank's call count and comm time leave them out
    assert not call_mask(df, kinds=None)[cpu.index.to_numpy()].any()
    meta = convert.rank_metadata(read_raw(raw), df)
    assert meta["calls"] == int((df["backend"].astype(str) != "app").sum()) == 6
    assert meta["cpu"] == {**meta["cpu"], "rows": 6, "schedstat": None}  # no sidecar
    assert "no rank-00000.cpu.json" in meta["cpu"]["reason"]


def test_rank_doc_reads_the_sidecar_and_names_each_thread(tmp_path: Path) -> None:
    from profiler.formats import cpu as cpu_format
    from profiler.formats.raw import read_raw
    from profiler.formats.rows import track_table

    raw = _rank_with_cpu_rows().write(tmp_path / "raw" / "rank-00000.hvprof")
    (tmp_path / "raw" / "rank-00000.cpu.json").write_bytes(orjson.dumps(_sidecar()))
    r = read_raw(raw)
    doc = cpu_format.rank_doc(raw, r.header, track_table(r), rows=6)
    assert doc is not None
    assert doc["host_cpus"] == 2 and doc["affinity"] == [0, 1]
    assert doc["loadavg_start"] == [0.5, 0.25, 0.125] and doc["loadavg_end"] == [1.0, 0.5, 0.25]
    assert doc["read_cost_ns"] == 640 and doc["schedstat"] is True and doc["rows"] == 6
    assert doc["omp_num_threads"] == "2" and doc["torch_threads"] is None
    kinds = {t["tid"]: t["kind"] for t in doc["threads"]}
    assert kinds == {4242: "main", 4300: "horovod", 4301: "helper", 4302: "watchdog",
                     4303: "other", 4304: "other"}
    by = {t["tid"]: t for t in doc["threads"]}
    assert by[4242]["track"] == 0 and by[4300]["track"] == 1 and by[4303]["track"] is None
    assert set(by[4242]["start"]) == VALUE_KEYS
    assert by[4242]["start"]["t_ns"] == 500  # CLOCK_MONOTONIC ticks, offset 0, t0 0
    assert by[4302]["start"] is None and by[4301]["end"] is None
    assert by[4304]["start"] is None and by[4304]["end"] is None  # malformed figures
    assert by[4303]["name"] == "pt_worker\u0007"
    # garbage: no block (absent) or a block that says nothing is known
    (tmp_path / "raw" / "rank-00000.cpu.json").write_bytes(b"\x00not json")
    assert cpu_format.rank_doc(raw, r.header, track_table(r), rows=0) is None
    (tmp_path / "raw" / "rank-00000.cpu.json").write_bytes(b'{"threads": 5, "affinity": "0"}')
    doc = cpu_format.rank_doc(raw, r.header, track_table(r))
    assert doc is not None and doc["threads"] == [] and doc["affinity"] is None


def test_trace_json_leaves_cpu_rows_out_of_its_events(tmp_path: Path) -> None:
    from profiler.formats.tracejson import read_trace, read_trace_meta
    from profiler.postjob.merge import merge
    from profiler.postjob.window import write_trace

    d = tmp_path / "prof"
    _rank_with_cpu_rows(steps=20).write(d / "raw" / "rank-00000.hvprof")
    (d / "raw" / "rank-00000.cpu.json").write_bytes(orjson.dumps(_sidecar()))
    res = merge(d)
    meta, events = read_trace(res.trace)
    xs = [e for e in events if e.get("ph") == "X"]
    assert xs and not [e for e in xs if e["name"] == "cpu"]
    assert meta["dataset"]["rows"] == 20 + 40 + 40  # steps, calls, cpu rows
    assert meta["events"]["total"] == meta["events"]["included"] == len(xs) == 60
    assert meta["ranks"][0]["cpu"]["rows"] == 40 and meta["ranks"][0]["calls"] == 40
    kinds = {t["kind"] for t in meta["ranks"][0]["cpu"]["threads"]}
    assert {"main", "horovod", "helper"} <= kinds
    assert read_trace_meta(res.trace)["ranks"][0]["cpu"]["schedstat"] is True
    # a window: selected and counted without the cpu rows, from a frame or a file
    from profiler.formats.dataset import read_dataset

    df = read_dataset([d / "ranks" / "rank-00000.parquet"])
    for src in (df, d / "ranks" / "rank-00000.parquet"):
        out = tmp_path / "w.json"
        m = write_trace(out, {}, [src], [{"rank": 0, "tracks": []}], limit=20)
        _, ev = read_trace(out)
        xs = [e for e in ev if e.get("ph") == "X"]
        assert 0 < len(xs) == m["events"]["included"] <= 20 and m["events"]["total"] == 60
        assert not [e for e in xs if e["name"] == "cpu"]
        assert m["events"]["steps"] is not None


# ---------------------------------------------------------------------------
# real jobs
# ---------------------------------------------------------------------------
def _rows(prof: Path) -> pd.DataFrame:
    files = sorted((prof / "ranks").glob("rank-*.parquet"))
    assert files, f"no parquet in {prof}"
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def _trace_meta(prof: Path) -> dict[str, Any]:
    from profiler.formats.tracejson import read_trace_meta

    return read_trace_meta(prof / "trace.json")


STEPS = 8  # optimizer steps: the first opens step 0, so STEPS - 1 step records


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    tmp = tmp_path_factory.mktemp("cpu2")
    prof = tmp / "prof"
    mpirun(2, [PYTHON, str(JOB)], cwd=tmp, timeout=240,
           env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                "STEPS": str(STEPS)})
    return prof


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
def test_one_cpu_row_per_known_thread_per_step(two_ranks: Path) -> None:
    df = _rows(two_ranks)
    cpu = df[df["op"].astype(str) == "cpu"]
    meta = _trace_meta(two_ranks)
    n_steps = STEPS - 1
    for r in (0, 1):
        ranks_json = orjson.loads((two_ranks / "ranks" / f"rank-{r:05d}.json").read_bytes())
        known = {int(t["index"]) for t in ranks_json["tracks"] if t["kind"] == "thread"}
        mine = cpu[cpu["rank"] == r]
        steps = df[(df["rank"] == r) & (df["op"].astype(str) == "step")].sort_values("seq")
        assert steps["seq"].tolist() == list(range(n_steps)), f"rank {r}"
        assert set(mine["track"]) == known, f"rank {r}"
        assert {"main", "horovod"} <= set(mine["thread_kind"].astype(str)), f"rank {r}"
        assert (mine["backend"].astype(str) == "app").all() and (mine["step"] == mine["seq"]).all()
        assert (mine["bytes"] >= 0).all() and (mine["count"] >= 0).all()
        assert (mine["dtype_size"] >= 0).all() and (mine["dur_ns"] > 0).all()
        step0 = int(steps["t_start_ns"].iloc[0])
        for track, g in mine.groupby("track"):
            g = g.sort_values("seq")
            assert g["seq"].tolist() == list(range(n_steps)), f"rank {r} track {track}"
            # each read starts where the thread's previous one ended ...
            assert g["t_start_ns"].iloc[1:].tolist() == g["t_end_ns"].iloc[:-1].tolist()
            # ... the first where step 0 opened (or later: a thread seen later)
            assert int(g["t_start_ns"].iloc[0]) >= step0
            # after each step record, before the next step's
            ends = steps["t_end_ns"].to_numpy()
            assert (g["t_end_ns"].to_numpy() >= ends).all()
            # CPU + run-queue time within the interval (kernel accounting lags a
            # running thread by at most a scheduler tick at either end)
            assert (g["bytes"] + g["count"]).sum() <= g["dur_ns"].sum() + 25_000_000
            assert g["bytes"].sum() > 0
        # never a call: the rank's call count, and no cpu event in trace.json
        rm = next(m for m in meta["ranks"] if m["rank"] == r)
        assert rm["calls"] == int(((df["rank"] == r) & (df["backend"].astype(str) != "app")).sum())
        assert rm["cpu"]["rows"] == len(mine)
    assert meta["events"]["total"] == len(df) - len(cpu) == meta["dataset"]["rows"] - len(cpu)
    doc = orjson.loads((two_ranks / "trace.json").read_bytes())
    assert not [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] == "cpu"]


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
def test_cpu_rows_change_no_call_total(two_ranks: Path) -> None:
    from profiler.analysis import summarize

    df = _rows(two_ranks)
    without = df[df["op"].astype(str) != "cpu"].reset_index(drop=True)
    assert len(without) < len(df)
    for by in (("op", "bucket"), ("rank", "op", "kind"), ("thread",)):
        pd.testing.assert_frame_equal(summarize(df, by=list(by), kinds=None),
                                      summarize(without, by=list(by), kinds=None))
    p = profiler_cli("summarize", str(two_ranks / "trace.json"), "--by", "op",
                     "--format", "json")
    assert p.returncode == 0, p.stderr
    assert '"cpu"' not in p.stdout


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
def test_cpu_metadata_for_every_rank(two_ranks: Path) -> None:
    meta = _trace_meta(two_ranks)
    assert [m["rank"] for m in meta["ranks"]] == [0, 1]
    df = _rows(two_ranks)
    for m in meta["ranks"]:
        c = m["cpu"]
        assert c["schedstat"] is True and c["reason"] == "" and c["state"] == "exit"
        assert isinstance(c["host_cpus"], int) and c["host_cpus"] >= 1
        assert c["affinity"] and c["affinity"] == sorted(c["affinity"])
        assert set(c["affinity"]) <= set(os.sched_getaffinity(0)) | set(range(c["host_cpus"]))
        assert len(c["loadavg_start"]) == 3 and len(c["loadavg_end"]) == 3
        assert 0 < c["read_cost_ns"] < 1_000_000
        assert isinstance(c["torch_threads"], int) and c["torch_threads"] >= 1
        assert c["omp_num_threads"] == os.environ.get("OMP_NUM_THREADS")
        assert c["steps"] == STEPS - 1 and c["threads_gone"] == 0
        assert c["step_read_cpu_ns"] > 0
        threads = c["threads"]
        tids = [t["tid"] for t in threads]
        assert len(tids) == len(set(tids))
        for t in threads:
            assert t["kind"] in ("main", "horovod", "helper", "watchdog", "other")
            for when in ("start", "end"):
                v = t[when]
                assert v is None or set(v) == VALUE_KEYS, (t, when)
            assert t["start"] is not None or t["end"] is not None
        kinds = {t["kind"]: t for t in threads}
        assert {"main", "horovod", "helper", "watchdog"} <= set(kinds)
        main, hvd = kinds["main"], kinds["horovod"]
        assert main["tid"] == m["pid"]
        mine = df[(df["rank"] == m["rank"]) & (df["op"].astype(str) == "cpu")]
        assert set(mine.loc[mine["thread_kind"].astype(str) == "main", "tid"]) == {main["tid"]}
        assert set(mine.loc[mine["thread_kind"].astype(str) == "horovod", "tid"]) == {hvd["tid"]}
        for t in (main, hvd):  # both lived from MPI_Init to MPI_Finalize
            assert t["start"] is not None and t["end"] is not None
            assert t["end"]["cpu_ns"] >= t["start"]["cpu_ns"]
            assert t["end"]["wait_ns"] >= t["start"]["wait_ns"]
            assert t["end"]["t_ns"] > t["start"]["t_ns"]
            # the step rows fall between the two snapshots
            rows_t = mine[mine["tid"] == t["tid"]]
            assert rows_t["bytes"].sum() <= t["end"]["cpu_ns"] - t["start"]["cpu_ns"] + 25_000_000


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.parametrize(("every", "fastrec"), [
    ("0", "1"), ("4", "1"),
    # the Python hook reads the same rule as the C one
    pytest.param("4", "0", marks=pytest.mark.full)])
def test_steps_not_read_have_no_cpu_figures(tmp_path: Path, every: str, fastrec: str) -> None:
    """HOROVOD_PROFILE_CPU=0: no cpu rows and no CPU figures in the sync rows;
    =4: rows and figures only in the steps read (0-63, then one in 4), in the
    C synchronize hook and the Python one (HOROVOD_PROFILE_FASTREC=0); the
    steps and the sidecar's start and end figures as ever."""
    prof = tmp_path / "prof"
    n = STEPS if every == "0" else 72
    mpirun(2, [PYTHON, str(JOB)], cwd=tmp_path, timeout=240,
           env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                "HOROVOD_PROFILE_CPU": every, "HOROVOD_PROFILE_FASTREC": fastrec,
                "STEPS": str(n)})
    df = _rows(prof)
    ops = df["op"].astype(str)
    read = [] if every == "0" else [*range(64), 64, 68]
    for r in (0, 1):
        steps = df[(df["rank"] == r) & (ops == "step")]
        assert sorted(steps["seq"]) == list(range(n - 1))
        main = df[(df["rank"] == r) & (ops == "cpu") & (df["thread_kind"].astype(str) == "main")]
        assert sorted(main["seq"]) == read
        sync = df[(df["rank"] == r) & (ops == "sync")].set_index("seq")
        assert len(sync) == n - 1
        off = sync.drop(index=read)
        assert (off["count"] == 0).all() and (off["bytes"] == 0).all()
        if read:  # synchronize ran on a CPU (a short one may fall inside one tick)
            assert (sync.loc[read, "bytes"] > 0).sum() >= len(read) // 2
    for m in _trace_meta(prof)["ranks"]:
        c = m["cpu"]
        assert c["schedstat"] is True and c["step_reads"] is (every != "0")
        assert c["step_every"] == int(every) and c["rows"] >= len(read)
        kinds = {t["kind"]: t for t in c["threads"]}
        assert kinds["main"]["start"] is not None and kinds["main"]["end"] is not None


# ---------------------------------------------------------------------------
# sampled steps: every step of the first 64, then one in HOROVOD_PROFILE_CPU
# ---------------------------------------------------------------------------
SAMPLED = """
import threading
from mpi4py import MPI
import profiler

comm = MPI.COMM_WORLD
recorded, go = threading.Event(), threading.Event()

def worker():
    comm.Barrier()      # its track, first seen in step 65 (not read)
    recorded.set()
    go.wait()

t = threading.Thread(target=worker)
for i in range(100):    # 99 step records, seq 0..98
    profiler.step()
    if i == 66:         # step 65 is open
        t.start()
        recorded.wait()
go.set()
t.join()
"""


@requires_mpi
@pytest.mark.mpi
def test_steps_past_the_first_64_are_read_one_in_k(tmp_path: Path) -> None:
    """HOROVOD_PROFILE_CPU=4: rows for steps 0-63 and every fourth after, each
    covering its own step alone (read at both its ends), also for a thread
    first seen in a step that is not read; the sidecar counts the reads."""
    prof = tmp_path / "prof"
    mpirun(1, [PYTHON, "-c", SAMPLED], cwd=tmp_path, timeout=120,
           env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                "HOROVOD_PROFILE_CPU": "4"})
    df = _rows(prof)
    ops = df["op"].astype(str)
    steps = df[ops == "step"].set_index("seq").sort_index()
    assert steps.index.tolist() == list(range(99))
    cpu = df[ops == "cpu"]
    read = list(range(64)) + list(range(64, 99, 4))
    main = cpu[cpu["thread_kind"].astype(str) == "main"].set_index("seq").sort_index()
    assert main.index.tolist() == read
    s = steps.loc[read]
    # the row's start: the read just after the step opened; its end: just after it closed
    assert (main["t_start_ns"] >= s["t_start_ns"]).all()
    assert (main["t_start_ns"] <= s["t_end_ns"]).all()
    nxt = steps["t_end_ns"].reindex([q + 1 for q in read]).fillna(float("inf")).to_numpy()
    assert (main["t_end_ns"].to_numpy() >= s["t_end_ns"].to_numpy()).all()
    assert (main["t_end_ns"].to_numpy() <= nxt).all()
    other = cpu[cpu["thread_kind"].astype(str) == "other"]
    assert sorted(other["seq"]) == list(range(68, 99, 4))
    assert (other["t_start_ns"].to_numpy() >= steps.loc[sorted(other["seq"]), "t_start_ns"]
            .to_numpy()).all()
    c = _trace_meta(prof)["ranks"][0]["cpu"]
    assert c["step_first"] == 64 and c["step_every"] == 4 and c["step_reads"] is True
    # reads: each of steps 0-63's ends, then the ends of 64, 67, 68, 71, ... 96
    assert c["steps"] == 99 and c["steps_read"] == 64 + 9 + 8
    assert c["rows"] == len(cpu) == len(read) + 8


# ---------------------------------------------------------------------------
# a known contention: one core, shared with a busy competitor or not
# ---------------------------------------------------------------------------
def _nice_prefix() -> list[str]:
    """Run the job and its competitor above other users' processes (nice -15,
    when allowed): on a shared machine another job's busy thread on "our" core
    then takes ~3% of it, not half, and the uncontended case stays quiet."""
    if shutil.which("nice") is None:
        return []
    try:
        cur = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, cur - 1)
        os.setpriority(os.PRIO_PROCESS, 0, cur)
    except OSError:
        return []
    return ["nice", "-n", "-15"]


def _pinned_run(tmp: Path, cpu: int, competitor: int | None) -> pd.DataFrame:
    """The job pinned to `cpu`; the busy competitor on `competitor` starts once
    the job is set up (its start-up on a shared core would take a minute), before
    its first step."""
    import threading

    prof = tmp / f"prof-{competitor}"
    ready = tmp / f"ready-{competitor}"
    nice = _nice_prefix()
    procs: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()

    def start_competitor() -> None:
        while not ready.exists() and not stop.wait(0.01):
            pass
        if ready.exists():
            if competitor is not None:
                procs.append(subprocess.Popen([*nice, "taskset", "-c", str(competitor),
                                               PYTHON, "-c", "while True: pass"]))
                time.sleep(0.2)  # running before the steps begin
            Path(f"{ready}.go").touch()

    t = threading.Thread(target=start_competitor, daemon=True)
    t.start()
    try:
        mpirun(1, [*nice, "taskset", "-c", str(cpu), PYTHON, str(JOB)], cwd=tmp, timeout=240,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                    "STEPS": "12", "BUSY_MS": "30", "READY_FILE": str(ready)})
    finally:
        stop.set()
        t.join(timeout=30)
        for c in procs:
            c.kill()
            c.wait()
    return _rows(prof)


def _wait_share(df: pd.DataFrame, kind: str = "main") -> float:
    c = df[(df["op"].astype(str) == "cpu") & (df["thread_kind"].astype(str) == kind)
           & (df["step"] >= 1)]
    assert len(c) == 10, len(c)
    return float(c["count"].sum() / c["dur_ns"].sum())


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_main_thread_waits_for_a_core_it_shares_with_a_busy_process(tmp_path: Path) -> None:
    if shutil.which("taskset") is None:
        pytest.skip("taskset not installed")
    cpus = sorted(os.sched_getaffinity(0))
    core = cpus[-1]
    other = cpus[0] if len(cpus) > 1 else None
    contended = _wait_share(_pinned_run(tmp_path, core, core))
    alone = _wait_share(_pinned_run(tmp_path, core, other))
    print(f"main thread's run-queue wait: {contended:.1%} sharing core {core} with a busy "
          f"process, {alone:.1%} with it on {other}")
    # CFS shares the core about equally between two busy threads: ~50% here
    assert contended > 0.20
    assert alone < contended / 3


# ---------------------------------------------------------------------------
# a thread that exits mid-run: its rows stop, the metadata counts it
# ---------------------------------------------------------------------------
EXITING = """
import threading, time
from mpi4py import MPI
import profiler

comm = MPI.COMM_WORLD
recorded, go = threading.Event(), threading.Event()

def worker():
    comm.Barrier()      # a record: the thread gets a track (and its first read)
    recorded.set()
    go.wait()

profiler.step()         # opens step 0
t = threading.Thread(target=worker)
t.start()
recorded.wait()
profiler.step()         # closes step 0: main + worker
profiler.step()         # step 1: main + worker
go.set()
t.join()
time.sleep(0.3)         # the kernel has let the thread go
profiler.step()         # step 2: main only, the worker exited
profiler.step()         # step 3
"""


@requires_mpi
@pytest.mark.mpi
def test_a_thread_that_exited_writes_nothing_more(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    mpirun(1, [PYTHON, "-c", EXITING], cwd=tmp_path, timeout=120,
           env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    df = _rows(prof)
    cpu = df[df["op"].astype(str) == "cpu"]
    seqs = {str(k): sorted(g["seq"].tolist()) for k, g in cpu.groupby(
        cpu["thread_kind"].astype(str), observed=True)}
    assert seqs == {"main": [0, 1, 2, 3], "other": [0, 1]}
    c = _trace_meta(prof)["ranks"][0]["cpu"]
    assert c["threads_gone"] == 1 and c["rows"] == 6 and c["steps"] == 4
    main = next(t for t in c["threads"] if t["kind"] == "main")
    assert main["start"] is not None and main["end"] is not None


# ---------------------------------------------------------------------------
# a rank killed mid-run keeps what was read at start
# ---------------------------------------------------------------------------
KILLED = """
import os, signal, time
from mpi4py import MPI
import profiler

MPI.COMM_WORLD.Barrier()
for _ in range(4):
    profiler.step()     # 3 step records, each with the main thread's cpu row
time.sleep(0.5)         # five of the helper's flush periods (100 ms)
os.kill(os.getpid(), signal.SIGKILL)
"""


@requires_mpi
@pytest.mark.mpi
def test_a_killed_rank_keeps_its_start_figures(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    p = mpirun(1, [PYTHON, "-c", KILLED], cwd=tmp_path, timeout=120, check=False,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    assert p.returncode != 0 and not (prof / "trace.json").exists()
    m = profiler_cli("merge", str(prof))
    assert m.returncode == 0, m.stderr
    meta = _trace_meta(prof)
    assert meta["partial_ranks"] == [0]
    c = meta["ranks"][0]["cpu"]
    assert c["state"] == "start" and c["schedstat"] is True and c["loadavg_end"] is None
    assert c["torch_threads"] is None and len(c["loadavg_start"]) == 3
    main = next(t for t in c["threads"] if t["kind"] == "main")
    assert main["start"] is not None and main["end"] is None
    assert main["tid"] == meta["ranks"][0]["pid"]
    df = _rows(prof)
    cpu = df[df["op"].astype(str) == "cpu"]
    assert cpu["seq"].tolist() == [0, 1, 2] and c["rows"] == 3
    assert set(cpu["tid"]) == {main["tid"]}


def test_cores_per_host_are_the_union_of_the_ranks_affinities() -> None:
    """Two ranks bound to a core each (mpirun --bind-to core) use two cores of
    their host, not one (the smallest affinity, read until 12-05); ranks on
    another host count for theirs; no affinity: the host's CPUs."""
    from profiler.analysis.findings.contention import _threads

    def rank(r: int, host: str, aff: list[int] | None) -> dict[str, Any]:
        cpu: dict[str, Any] = {"host_cpus": 4, "threads": []}
        if aff is not None:
            cpu["affinity"] = aff
        return {"rank": r, "host": host, "cpu": cpu}

    bound = {"ranks": [rank(0, "a", [0]), rank(1, "a", [1])]}
    assert _threads(bound)[1]["job_cores"] == 2
    shared = {"ranks": [rank(0, "a", [0, 1]), rank(1, "a", [0, 1])]}
    assert _threads(shared)[1]["job_cores"] == 2
    hosts = {"ranks": [rank(0, "a", [0]), rank(1, "a", [1]), rank(2, "b", [3])]}
    assert _threads(hosts)[1]["job_cores"] == 1  # the smaller host's
    none = {"ranks": [rank(0, "a", None)]}
    info = _threads(none)[1]
    assert (info["job_cores"], info["host_cpus"]) == (0, 4)
