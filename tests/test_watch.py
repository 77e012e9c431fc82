"""`profiler watch`: the incremental reader of raw files being written
(profiler.formats.rawtail), the watcher's aggregates (profiler.analysis.live),
the view, the JSON snapshot and the Prometheus exposition, on synthetic
ranks.  Real jobs watched: test_watch_jobs.py."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rawgen
from conftest import PYTHON, ROOT, base_env, profiler_cli

from profiler.analysis.live import Watcher
from profiler.formats import record as F
from profiler.formats.raw import read_raw
from profiler.formats.rawtail import RawTail


# ---------------------------------------------------------------------------
# synthetic raw files
# ---------------------------------------------------------------------------
def two_track_rank(rank: int = 0, world: int = 2, n_main: int = 150, n_hvd: int = 100,
                   steps: int = 12, host: str = "testhost") -> rawgen.RawWriter:
    """A rank with a main thread (steps, allreduce) and a second thread (bcast),
    spread over several 63-record chunks of each track."""
    w = rawgen.RawWriter(rank=rank, world_size=world, hostname=host)
    w.add_comm(0x5EED, world, rank, "MPI_COMM_WORLD")
    main = w.add_track(1000 + rank, is_main=True)
    other = w.add_track(2000 + rank, name="worker")
    t = 1000 + np.arange(n_main, dtype=np.uint64) * 10_000
    w.add(main, rawgen.records(n_main, t_start=t, t_end=t + 2_000 + rank * 500,
                               bytes=1 << 20, count=1 << 18, seq=np.arange(n_main),
                               op=rawgen.op("allreduce"), dtype=rawgen.dtype("MPI_FLOAT"),
                               redop=rawgen.redop("sum"), dtype_size=4))
    s = 1000 + np.arange(steps, dtype=np.uint64) * 100_000
    w.add(main, rawgen.records(steps, t_start=s, t_end=s + 90_000, count=16,
                               seq=np.arange(steps), op=rawgen.op("step")))
    t2 = 5000 + np.arange(n_hvd, dtype=np.uint64) * 7_000
    w.add(other, rawgen.records(n_hvd, t_start=t2, t_end=t2 + 300, bytes=64, count=16,
                                seq=np.arange(n_hvd), comm=0, op=rawgen.op("bcast"),
                                dtype=rawgen.dtype("MPI_FLOAT"), dtype_size=4, root=0))
    return w


def op_counts(rec: np.ndarray) -> dict[str, int]:
    return dict(Counter(F.op_name(int(o)) for o in rec["op"]))


def snapshot_counts(snap: dict[str, Any]) -> dict[int, dict[str, int]]:
    return {r["rank"]: r["ops"] for r in snap["ranks"]}


def test_two_reads_equal_one_read(tmp_path: Path) -> None:
    """Appending the file in two steps gives the totals of one read, each record
    once: the first poll sees the prefix, the second only what was added."""
    image = two_track_rank().to_bytes()
    path = tmp_path / "raw" / "rank-00000.hvprof"
    path.parent.mkdir()
    # the first half: chunks up to the middle of one, with the header as written then
    cut = rawgen.chunk_offset(image, 3) + F.CHUNK_HEADER_BYTES + 10 * F.RECORD_BYTES
    path.write_bytes(image[:cut])
    tail = RawTail(path)
    first = tail.poll()
    path.write_bytes(image)
    second = tail.poll()
    third = tail.poll()
    tail.close()
    whole = read_raw(path).records
    both = np.concatenate([first.records, second.records])
    assert 0 < len(first.records) < len(whole)
    assert len(both) == len(whole) and len(third.records) == 0
    assert op_counts(both) == op_counts(whole)
    assert sorted(both["t_start"].tolist()) == sorted(whole["t_start"].tolist())
    # the watcher's totals likewise: two refreshes == one
    path.write_bytes(image[:cut])
    w2 = Watcher(tmp_path)
    w2.refresh()
    path.write_bytes(image)
    w2.refresh()
    w1 = Watcher(tmp_path)
    w1.refresh()
    a, b = w2.snapshot(), w1.snapshot()
    assert snapshot_counts(a) == snapshot_counts(b) == {0: op_counts(whole)}
    assert a["collectives"] == b["collectives"]
    assert a["ranks"][0]["steps"] == 12 and a["ranks"][0]["images"] == 12 * 16
    w1.close()
    w2.close()


def test_a_partial_chunk_counts_only_once_complete(tmp_path: Path) -> None:
    """A chunk whose header is not written yet (magic 0), records past nrec, and
    a record cut by the end of the file are not counted; once written they are,
    once."""
    w = rawgen.simple_rank(0, 1, n=100)  # 63 + 37 records in two chunks
    image = bytearray(w.to_bytes())
    base1 = rawgen.chunk_offset(image, 1)
    path = tmp_path / "raw" / "rank-00000.hvprof"
    path.parent.mkdir()
    # chunk 1 allocated, its header not yet written
    stage = bytearray(image)
    stage[base1:base1 + F.CHUNK_HEADER_BYTES] = bytes(F.CHUNK_HEADER_BYTES)
    path.write_bytes(bytes(stage))
    tail = RawTail(path)
    assert len(tail.poll().records) == 63
    # its header says 20 records, the file holds 20.5 of them
    ch = np.frombuffer(bytes(image[base1:base1 + F.CHUNK_HEADER_BYTES]),
                       dtype=F.CHUNK_HEADER_DTYPE).copy()
    ch["nrec"] = 30
    stage[base1:base1 + F.CHUNK_HEADER_BYTES] = ch.tobytes()
    end = base1 + F.CHUNK_HEADER_BYTES + 20 * F.RECORD_BYTES + F.RECORD_BYTES // 2
    path.write_bytes(bytes(stage[:end]))
    got = tail.poll().records
    assert len(got) == 20
    assert got["seq"].tolist() == list(range(63, 83))
    # the rest of the file, nrec still 30
    path.write_bytes(bytes(stage))
    assert tail.poll().records["seq"].tolist() == list(range(83, 93))
    # the chunk as the writer finished it
    path.write_bytes(bytes(image))
    assert tail.poll().records["seq"].tolist() == list(range(93, 100))
    assert len(tail.poll().records) == 0 and tail.records_read == 100
    # a full chunk is not read again; the open one is the only one kept
    assert tail.open_chunks == 1
    tail.close()


def test_bad_chunk_is_reported_and_skipped(tmp_path: Path) -> None:
    image = bytearray(rawgen.simple_rank(0, 1, n=100).to_bytes())
    base1 = rawgen.chunk_offset(image, 1)
    image[base1:base1 + 4] = b"XXXX"
    path = tmp_path / "raw" / "rank-00000.hvprof"
    path.parent.mkdir()
    path.write_bytes(bytes(image))
    tail = RawTail(path)
    r = tail.poll()
    assert len(r.records) == 63 and r.problems == ["chunk 1 has a bad magic: skipped"]
    assert tail.poll().problems == [] and tail.open_chunks == 0


def _with_inflight(image: bytes, *, op: str, handle: int, t_start: int, track: int = 0,
                   **header: object) -> bytes:
    """A raw image whose flight recorder holds one call in progress."""
    out = bytearray(rawgen.patch_header(image, inflight_offset=F.INFLIGHT_OFFSET,
                                        inflight_capacity=32, **header))
    e = np.zeros(1, dtype=F.INFLIGHT_ENTRY_DTYPE)
    e["state"], e["op"], e["comm"], e["t_start"] = 1, rawgen.op(op), handle, t_start
    off = F.INFLIGHT_OFFSET + track * F.INFLIGHT_ENTRY_DTYPE.itemsize
    out[off:off + e.nbytes] = e.tobytes()
    return bytes(out)


def test_watcher_snapshot_on_synthetic_ranks(tmp_path: Path) -> None:
    """Steps, images/sec, collectives with bus bandwidth, the slowest rank, a
    call in flight far longer than usual (stuck), a stalled rank."""
    host = socket.gethostname()
    now = time.monotonic_ns()
    live_state = F.STATE_OPEN | F.STATE_MPI_INIT
    for r in range(2):
        w = two_track_rank(r, host=host)
        w.state = live_state
        w.pid = os.getpid()  # alive
        w.cal0 = (0, now - 60_000_000_000)
        w.cal1 = (0, now - (30_000_000_000 if r == 1 else 0))  # rank 1: no beat for 30 s
        image = w.to_bytes()
        image = rawgen.patch_header(image, helper_cpu_ns=5_000_000, call_cost_ns=40.0)
        if r == 0:  # clock_kind 2: ticks are CLOCK_MONOTONIC ns
            image = _with_inflight(image, op="allreduce", handle=0x1000,
                                   t_start=now - 20_000_000_000)
        (tmp_path / "raw").mkdir(exist_ok=True)
        (tmp_path / "raw" / f"rank-{r:05d}.hvprof").write_bytes(image)
    w8 = Watcher(tmp_path, stale_s=5.0)
    w8.refresh()
    s = w8.snapshot()
    assert s["world_size"] == 2 and s["ranks_seen"] == 2 and not s["finished"]
    r0, r1 = s["ranks"]
    assert r0["status"] == "running" and not r0["stopped"]
    assert r1["status"] == "stalled" and r1["stopped"] and r1["heartbeat_age_s"] > 25
    assert s["job"]["stopped_ranks"] == [1]
    assert r0["steps"] == 12 and r0["images_per_sec"] == pytest.approx(16 / 90e-6)
    assert s["job"]["images_per_sec"] == pytest.approx(2 * 16 / 90e-6)
    (f,) = s["in_flight"]
    assert f["rank"] == 0 and f["op"] == "allreduce" and f["comm"] == "MPI_COMM_WORLD"
    assert 19 < f["age_s"] < 60 and f["usual_s"] == pytest.approx(2e-6) and f["stuck"]
    c = {x["op"]: x for x in s["collectives"]}
    assert c["allreduce"]["calls"] == 300 and c["bcast"]["calls"] == 200
    # allreduce busbw factor 2(n-1)/n = 1 at n = 2: bytes / time
    ns = 150 * 2000 + 150 * 2500
    assert c["allreduce"]["busbw_gbps"] == pytest.approx(300 * (1 << 20) / ns)
    assert c["allreduce"]["mean_bytes"] == 1 << 20
    assert s["collectives"][0]["op"] == "allreduce"  # by time
    # equal step times: no slowest rank named above the others
    assert s["job"]["slowest_rank"]["ratio"] == pytest.approx(1.0)
    assert r0["cost"]["recorded_calls"] == 262
    assert r0["cost"]["cost_s"] == pytest.approx((262 * 40 + 5_000_000) / 1e9)
    # the view: 80 columns, the stuck call and the stopped rank named
    from profiler.cli.watch import render

    lines = render(s)
    assert max(len(ln) for ln in lines) <= 80
    text = "\n".join(lines)
    assert "STUCK" in text and "rank 1 stalled" in text and "allreduce" in text
    w8.close()


MS = 1_000_000


def synchronize_rank(rank: int, steps: int = 10) -> rawgen.RawWriter:
    """Steps of 100 ms on the main thread: tensors handed over until 50 + 10r ms,
    synchronize from 55 + 10r to 95 ms, one gradient allreduce 70-85 ms on a
    second thread.  By advise's rules: rank 0 waits 5 ms for rank 1, transfer
    15 ms, Horovod 20 ms (rank 0) and 15 ms (rank 1), compute the rest."""
    w = rawgen.RawWriter(rank=rank, world_size=2, hostname="testhost")
    w.add_comm(0x5EED, 2, rank, "MPI_COMM_WORLD")
    main = w.add_track(1000 + rank, is_main=True)
    other = w.add_track(2000 + rank, name="worker")
    b = np.arange(steps, dtype=np.uint64) * 100 * MS + 10 * MS
    one = np.ones(steps, dtype=np.uint64)
    rows = [("step", b, b + 100 * MS), ("tensor", b + 40 * MS, b + (50 + 10 * rank) * MS),
            ("sync", b + (55 + 10 * rank) * MS, b + 95 * MS)]
    recs = np.concatenate([rawgen.records(steps, t_start=t0, t_end=t1, seq=np.arange(steps),
                                          count=16 * one if name == "step" else one,
                                          op=rawgen.op(name)) for name, t0, t1 in rows])
    w.add(main, recs[np.argsort(recs["t_start"], kind="stable")])
    w.add(other, rawgen.records(steps, t_start=b + 70 * MS, t_end=b + 85 * MS,
                                bytes=4 << 20, count=1 << 20, seq=np.arange(steps),
                                op=rawgen.op("allreduce"), dtype=rawgen.dtype("MPI_FLOAT"),
                                redop=rawgen.redop("sum"), dtype_size=4))
    return w


def test_where_a_step_goes_live(tmp_path: Path) -> None:
    """The live breakdown applies advise's rules to the window's shared steps:
    known parts, summing to the step."""
    (tmp_path / "raw").mkdir()
    for r in range(2):
        synchronize_rank(r).write(tmp_path / "raw" / f"rank-{r:05d}.hvprof")
    w8 = Watcher(tmp_path)
    w8.refresh()
    bd = w8.snapshot()["breakdown"]
    w8.close()
    assert bd is not None and bd["source"] == "sync" and bd["ranks"] == 2, bd
    assert bd["step_numbers"] == list(range(10)) and bd["steps"] == 10
    got = {p["part"]: p["ms"] for p in bd["parts"]}
    want = {"compute": 65.0, "wait_ranks": 2.5, "horovod": 17.5, "transfer": 15.0,
            "profiler": 0.0, "unexplained": 0.0}
    assert got == pytest.approx(want, abs=1e-9), got
    assert bd["step_ms"] == pytest.approx(100.0)
    from profiler.cli.watch import render

    text = "\n".join(render({**_empty_snap(), "breakdown": bd}))
    assert "where a step goes (10 steps of the last 10 s, mean of 2 ranks): 100" in text
    assert "waiting for other ranks" in text and "unexplained" not in text


def _empty_snap() -> dict[str, Any]:
    return {"directory": "d", "time": "2026-12-03T00:00:00+0000", "ranks_seen": 0,
            "world_size": 0, "elapsed_s": None, "finished": False, "window_s": 10.0,
            "missing_ranks": [], "ranks": [], "collectives": [], "in_flight": [],
            "job": {"steps": 0, "images_per_sec": None, "images_per_sec_recent": None,
                    "slowest_rank": None, "dropped_records": 0,
                    "profiler_helper_cpu_s": 0.0, "profiler_cost_share_max": None}}


def test_no_waiting_claimed_without_the_other_ranks_steps(tmp_path: Path) -> None:
    """Rank 1 recorded no step: nobody's arrival is known, so synchronize is
    not split into waiting and transfer; it stays unexplained (40 ms)."""
    (tmp_path / "raw").mkdir()
    synchronize_rank(0).write(tmp_path / "raw" / "rank-00000.hvprof")
    rawgen.simple_rank(rank=1, world_size=2, n=10).write(tmp_path / "raw" / "rank-00001.hvprof")
    w8 = Watcher(tmp_path)
    w8.refresh()
    bd = w8.snapshot()["breakdown"]
    w8.close()
    assert bd is not None and bd["ranks"] == 1, bd
    got = {p["part"]: p["ms"] for p in bd["parts"]}
    assert got["wait_ranks"] == 0 and got["transfer"] == 0 and got["horovod"] == 0, got
    assert got["unexplained"] == pytest.approx(40.0) and got["compute"] == pytest.approx(60.0)


def test_heartbeat_of_a_rank_on_another_host(tmp_path: Path) -> None:
    """A rank on another host: its pid cannot be checked and its
    CLOCK_MONOTONIC is not ours (here 5000 s ahead), so its heartbeat alone
    decides.  At the first look (`--once`) the heartbeat's age comes from the
    host's wall clock (realtime at start + monotonic since): 0.5 s old is
    running, 30 s old is stalled; without that anchor the rank is unknown
    until a refresh sees the heartbeat move, then running."""
    live_state = F.STATE_OPEN | F.STATE_MPI_INIT
    mono0 = time.monotonic_ns() + 5000 * 10**9  # another machine's (or namespace's) clock
    for r, age_s in enumerate([0.5, 30.0, None]):
        w = two_track_rank(r, world=3, host="elsewhere")
        w.state, w.pid = live_state, os.getpid()  # a pid of ours: must not be looked at
        w.cal0, w.cal1 = (0, mono0), (0, mono0 + 60 * 10**9)  # stored 60 s after start
        rt0 = 0 if age_s is None else time.time_ns() - int((60 + age_s) * 1e9)
        image = rawgen.patch_header(w.to_bytes(), helper_cpu_ns=5_000_000, cal0_realtime_ns=rt0)
        (tmp_path / "raw").mkdir(exist_ok=True)
        (tmp_path / "raw" / f"rank-{r:05d}.hvprof").write_bytes(image)
    wt = Watcher(tmp_path, stale_s=5.0)
    wt.refresh()
    r0, r1, r2 = wt.snapshot()["ranks"]
    assert r0["status"] == "running" and not r0["stopped"]
    assert r0["heartbeat_age_s"] == pytest.approx(0.5, abs=0.5)
    assert r1["status"] == "stalled" and r1["stopped"]
    assert r1["heartbeat_age_s"] == pytest.approx(30.0, abs=0.5)
    assert r2["status"] == "unknown" and r2["heartbeat_age_s"] is None and not r2["stopped"]
    # rank 2's helper stores its heartbeat: seen to move, running
    path = tmp_path / "raw" / "rank-00002.hvprof"
    path.write_bytes(rawgen.patch_header(path.read_bytes(), helper_cpu_ns=6_000_000))
    wt.refresh()
    r0, r1, r2 = wt.snapshot()["ranks"]
    assert r2["status"] == "running" and r2["heartbeat_age_s"] < 1.0
    assert r1["status"] == "stalled"  # not moved: its age carries on from the first look
    assert r1["heartbeat_age_s"] >= 30.0 - 0.5
    wt.close()


def test_summary_mode_aggregates_count(tmp_path: Path) -> None:
    """HOROVOD_PROFILE=summary: the collectives come from rank-R.agg (a snapshot
    read again when it changes), steps from the raw file."""
    w = rawgen.RawWriter(rank=0, world_size=2)
    w.add_comm(0x5EED, 2, 0, "MPI_COMM_WORLD")
    tr = w.add_track(1000, is_main=True)
    w.add(tr, rawgen.records(3, t_start=[0, 100, 200], t_end=[90, 190, 290], count=8,
                             seq=[0, 1, 2], op=rawgen.op("step")))
    raw = w.write(tmp_path / "raw" / "rank-00000.hvprof")
    agg = raw.with_suffix(".agg")
    e = rawgen.agg_from_durations(rawgen.op("allreduce"), 4096, [1000, 2000, 3000])
    agg.write_bytes(rawgen.agg_bytes(e))
    wt = Watcher(tmp_path)
    wt.refresh()
    s = wt.snapshot()
    assert s["ranks"][0]["ops"] == {"allreduce": 3, "step": 3}
    (c,) = s["collectives"]
    assert c["calls"] == 3 and c["bytes"] == 3 * 4096 and c["time_s"] == pytest.approx(6e-6)
    e2 = rawgen.agg_from_durations(rawgen.op("allreduce"), 4096, [1000] * 5)
    agg.write_bytes(rawgen.agg_bytes(e2) + b"")  # rewritten whole: replaces, never adds
    os.utime(agg, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    wt.refresh()
    assert wt.snapshot()["ranks"][0]["ops"] == {"allreduce": 5, "step": 3}
    wt.close()


def test_prometheus_exposition_and_bounded_labels(tmp_path: Path) -> None:
    """Counters equal the snapshot's; ranks past the limit are rank="other"."""
    import threading

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from profiler.cli._prometheus import make_registry

    for r in range(3):
        two_track_rank(r, world=3).write(tmp_path / "raw" / f"rank-{r:05d}.hvprof")
    wt = Watcher(tmp_path)
    wt.refresh()
    reg = make_registry(wt, threading.Lock(), max_ranks=2)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    calls: dict[tuple[str, str], float] = {}
    for smp in fams["hvprof_calls"].samples:
        if smp.name == "hvprof_calls_total":
            k = (smp.labels["rank"], smp.labels["op"])
            calls[k] = calls.get(k, 0.0) + smp.value
    assert calls[("0", "allreduce")] == 150 and calls[("1", "bcast")] == 100
    assert calls[("other", "allreduce")] == 150  # rank 2, folded
    assert {smp.labels["rank"] for smp in fams["hvprof_calls"].samples} == {"0", "1", "other"}
    buckets = [smp for smp in fams["hvprof_call_duration_seconds"].samples
               if smp.name.endswith("_count") and smp.labels["op"] == "allreduce"]
    assert [(b.labels["size_class"], b.value) for b in buckets] == [("64KiB-1MiB", 450)]
    steps = {smp.labels["rank"]: smp.value for smp in fams["hvprof_steps"].samples
             if smp.name == "hvprof_steps_total"}
    assert steps == {"0": 12, "1": 12, "other": 12}
    assert "hvprof_payload_bytes" in fams and "hvprof_profiler_cpu_seconds" in fams
    wt.close()


def test_grafana_dashboard_uses_only_exported_series(tmp_path: Path) -> None:
    """Every series the shipped dashboard queries is one the exporter serves
    (on ranks with steps, synchronize and collectives), and the file is a
    dashboard Grafana imports: panels with unique ids, a Prometheus data
    source variable."""
    import threading

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from profiler.cli._prometheus import make_registry

    (tmp_path / "raw").mkdir()
    now = time.monotonic_ns()
    for r in range(2):
        w = synchronize_rank(r)
        w.cal0, w.cal1 = (0, now - 60_000_000_000), (0, now)  # a run time: the cost share
        w.write(tmp_path / "raw" / f"rank-{r:05d}.hvprof")
    wt = Watcher(tmp_path)
    wt.refresh()
    served = {smp.name for f in text_string_to_metric_families(
        generate_latest(make_registry(wt, threading.Lock())).decode()) for smp in f.samples}
    wt.close()
    dash = json.loads((ROOT / "docs" / "grafana" / "horovod-profiler.json").read_text())
    ids = [panel["id"] for panel in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["title"]
    assert any(v.get("type") == "datasource" and v.get("query") == "prometheus"
               for v in dash["templating"]["list"])
    used = {m for panel in dash["panels"] for t in panel.get("targets", [])
            for m in re.findall(r"\bhvprof_[a-z_]+", t["expr"])}
    assert used and used <= served, sorted(used - served)
    assert "hvprof_step_part_seconds" in used


# ---------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------
def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    cases = [
        ([str(tmp_path / "nope"), "--once"], "no such directory"),
        ([str(tmp_path), "--once"], "no raw/rank-*.hvprof files"),
        ([str(tmp_path), "--interval", "0"], "must be a positive number"),
        ([str(tmp_path), "--prometheus", "localhost:notaport"], "expected [HOST]:PORT"),
    ]
    for args, what in cases:
        p = profiler_cli("watch", *args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and what in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "rank-00000.hvprof").write_bytes(b"not a raw file at all")
    p = profiler_cli("watch", str(tmp_path), "--once")
    # an unreadable rank is shown, not a traceback
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr


def test_cli_once_json_and_textfile(tmp_path: Path) -> None:
    for r in range(2):
        two_track_rank(r).write(tmp_path / "raw" / f"rank-{r:05d}.hvprof")
    prom = tmp_path / "hvprof.prom"
    p = profiler_cli("watch", str(tmp_path), "--once", "--format", "json",
                     "--textfile", str(prom))
    assert p.returncode == 0, p.stderr
    snap = json.loads(p.stdout)
    assert snap["schema"] == "horovod-profiler.watch/1" and snap["finished"]
    assert snapshot_counts(snap)[1] == {"allreduce": 150, "bcast": 100, "step": 12}
    assert 'hvprof_calls_total{host="testhost",kind="data",op="allreduce",rank="1"} 150.0' \
        in prom.read_text()
    t = profiler_cli("watch", str(tmp_path), "--once")
    assert t.returncode == 0 and max(len(x) for x in t.stdout.splitlines()) <= 80
    assert "allreduce" in t.stdout and "FINISHED" in t.stdout


def test_live_view_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal (a pty, as over ssh or in tmux) the view is redrawn in
    place, fits 80 columns, and exits 0 on a finished job with its final
    state, the step breakdown included."""
    import pty
    import select

    (tmp_path / "raw").mkdir()
    for r in range(2):
        synchronize_rank(r).write(tmp_path / "raw" / f"rank-{r:05d}.hvprof")
    master, slave = pty.openpty()
    env = base_env(TERM="xterm-256color", COLUMNS="80", LINES="50")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([PYTHON, "-P", "-m", "profiler.cli", "watch", str(tmp_path),
                             "--interval", "0.2"], stdin=slave, stdout=slave, stderr=slave,
                            env=env, close_fds=True)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the other side closed
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0, out[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        os.close(master)
    text = out.decode("utf-8", "replace")
    assert "\x1b[" in text  # drawn with terminal control sequences, not printed
    # each redraw moves the cursor up and erases lines: a line break, for reading
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", text).replace("\r", "")
    assert "FINISHED" in plain and "where a step goes (10 steps" in plain, plain[-2000:]
    assert max(len(x) for x in plain.splitlines()) <= 80
