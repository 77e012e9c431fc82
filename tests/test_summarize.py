"""analysis.summarize and `profiler summarize`: exact counts, bytes, latency
statistics, bandwidth factors, buckets, power-of-two marks, control traffic,
per-rank imbalance, table/csv/json output."""

from __future__ import annotations

import csv
import io
import subprocess
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import rawgen
from conftest import profiler_cli

from profiler import layout
from profiler.analysis import bucket_label, bus_factor, comm_time_imbalance, summarize
from profiler.errors import UsageError
from profiler.formats import dataset
from profiler.postjob import convert
from profiler.postjob.merge import merge


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI run from a scratch directory (never the source tree's profiler/)."""
    return profiler_cli(*args, cwd=cwd)


KEYS = ["calls", "total_bytes", "total_us", "mean_us", "p50_us", "p95_us", "p99_us", "max_us",
        "algbw_gbps", "busbw_gbps"]


def frame(rows: list[dict]) -> pd.DataFrame:
    base = {"rank": 0, "backend": "mpi", "comm_size": 2, "device": False, "kind": "data",
            "t_start_ns": 0, "thread_kind": "main", "comm": 1, "comm_name": "MPI_COMM_WORLD",
            "track": 0}
    df = pd.DataFrame([{**base, **r} for r in rows])
    df["t_end_ns"] = df["t_start_ns"] + df["dur_ns"]
    for c in ("backend", "op", "kind", "thread_kind", "comm_name"):
        df[c] = df[c].astype("category")
    return df


def test_bus_factors() -> None:
    assert bus_factor("allreduce", 4) == 1.5
    assert bus_factor("nccl_allreduce", 2) == 1.0
    assert bus_factor("allgather", 4) == 0.75
    assert bus_factor("reduce_scatter", 8) == 0.875
    assert bus_factor("alltoall", 2) == 0.5
    assert bus_factor("bcast", 8) == 1.0 and bus_factor("reduce", 3) == 1.0
    assert np.isnan(bus_factor("barrier", 2))


def test_bucket_labels() -> None:
    assert bucket_label(0) == "0 B" and bucket_label(1) == "1 B"
    assert bucket_label(4096) == "2 KiB-4 KiB"
    assert bucket_label(1 << 20) == "512 KiB-1 MiB"
    assert bucket_label(8) == "4 B-8 B"


def test_exact_statistics() -> None:
    durs = [1_000, 2_000, 3_000, 4_000, 10_000]
    rows = [{"op": "allreduce", "bytes": 4096, "dur_ns": d} for d in durs]
    rows += [{"op": "allreduce", "bytes": 3000, "dur_ns": 500}]
    rows += [{"op": "bcast", "bytes": 64, "dur_ns": 1_000, "comm_size": 4}]
    rows += [{"op": "init", "bytes": 0, "dur_ns": 10**9}]  # set-up: not a call
    rows += [{"op": "step", "backend": "app", "bytes": 0, "dur_ns": 10**9}]
    df = frame(rows)
    s = summarize(df, by=["op", "bytes"])
    assert list(s.columns) == ["op", "bytes", *KEYS, "time_share", "pow2"]
    assert s[["op", "bytes", "calls"]].values.tolist() == [
        ["allreduce", 3000, 1], ["allreduce", 4096, 5], ["bcast", 64, 1]]
    r = s.iloc[1]
    assert r["total_bytes"] == 5 * 4096
    assert r["total_us"] == 20.0 and r["mean_us"] == 4.0 and r["max_us"] == 10.0
    assert r["p50_us"] == 3.0
    assert r["p95_us"] == pytest.approx(np.percentile(durs, 95) / 1e3)
    assert r["p99_us"] == pytest.approx(np.percentile(durs, 99) / 1e3)
    assert r["algbw_gbps"] == pytest.approx(5 * 4096 / 20_000)
    assert r["busbw_gbps"] == pytest.approx(5 * 4096 / 20_000 * 1.0)  # 2(n-1)/n at n=2
    assert bool(r["pow2"]) and not bool(s.iloc[0]["pow2"])
    b = s.iloc[2]
    assert b["busbw_gbps"] == pytest.approx(64 / 1_000)
    assert s["time_share"].sum() == pytest.approx(1.0)
    assert s.iloc[1]["time_share"] == pytest.approx(20_000 / 21_500)


def test_buckets_ranks_and_filters() -> None:
    rows = [{"op": "allreduce", "bytes": b, "dur_ns": 1_000, "rank": r}
            for r in (0, 1) for b in (2049, 3000, 4096, 4097, 0)]
    rows += [{"op": "barrier", "bytes": 0, "dur_ns": 3_000, "rank": 1}]
    df = frame(rows)
    s = summarize(df)  # op, bucket
    got = {(row.op, row.bucket): row.calls for row in s.itertuples()}
    assert got == {("allreduce", "0 B"): 2, ("allreduce", "2 KiB-4 KiB"): 6,
                   ("allreduce", "4 KiB-8 KiB"): 2, ("barrier", "0 B"): 1}
    assert s.loc[s["bucket"] == "2 KiB-4 KiB", "pow2"].tolist() == [False]
    assert s.loc[s["bucket"] == "0 B", "pow2"].tolist() == [True, True]
    one = summarize(df, by="op", rank=1)
    assert one[["op", "calls"]].values.tolist() == [["allreduce", 5], ["barrier", 1]]
    per_rank = summarize(df, by=["rank"])
    assert per_rank[["rank", "calls"]].values.tolist() == [[0, 5], [1, 6]]
    total = summarize(df, by=[])
    assert total["calls"].tolist() == [11]
    imb = comm_time_imbalance(df)
    assert imb is not None
    assert (imb["slowest_rank"], imb["fastest_rank"]) == (1, 0)
    assert imb["ratio"] == pytest.approx(8 / 5)
    with pytest.raises(UsageError):
        summarize(df, by=["nope"])
    assert summarize(df, rank=5).empty


def test_thread_comm_kind_keys() -> None:
    rows = [{"op": "allreduce", "bytes": 8, "dur_ns": 100, "thread_kind": "horovod",
             "kind": "control", "comm": 0xABC, "comm_name": "MPI_COMM_WORLD"},
            {"op": "allreduce", "bytes": 8, "dur_ns": 100, "thread_kind": "main",
             "comm": 0xDEF, "comm_name": ""}]
    df = frame(rows)
    s = summarize(df, by=["thread", "comm", "kind"])
    assert s[["thread", "comm", "kind"]].values.tolist() == [
        ["horovod", "MPI_COMM_WORLD (0xabc)", "control"], ["main", "0xdef", "data"]]
    assert summarize(df, by="op", kinds=["data"])["calls"].tolist() == [1]


def write_job(d: Path, *, control: bool = False) -> Path:
    """Two ranks: allreduce 3000 B x 4 and 4096 B x 2, bcast 64 B x 3 per rank;
    rank 1 slower.  control: + 10 bit-vector allreduces tagged kind=control."""
    for r in range(2):
        w = rawgen.RawWriter(rank=r, world_size=2)
        w.add_comm(0x77, 2, r, "MPI_COMM_WORLD")
        t = w.add_track(100 + r, is_main=True)
        slow = 1 + r
        w.add(t, rawgen.records(4, t_start=np.arange(4) * 10_000, t_end=np.arange(4) * 10_000
                                + 3_000 * slow, bytes=3000, count=750, op=1, dtype_size=4))
        w.add(t, rawgen.records(2, t_start=50_000 + np.arange(2) * 10_000,
                                t_end=50_000 + np.arange(2) * 10_000 + 4_096, bytes=4096,
                                op=1, dtype_size=4))
        w.add(t, rawgen.records(3, t_start=80_000 + np.arange(3) * 1_000,
                                t_end=80_000 + np.arange(3) * 1_000 + 64, bytes=64, op=4,
                                root=0))
        if control:
            w.add(t, rawgen.records(10, t_start=100_000 + np.arange(10) * 1_000,
                                    t_end=100_000 + np.arange(10) * 1_000 + 100, bytes=8,
                                    op=1, redop=6, dtype=12))
        w.write(d / "raw" / f"rank-{r:05d}.hvprof")
    return d


def test_cli_json(tmp_path: Path) -> None:
    d = write_job(tmp_path / "job")
    merge(d)
    p = cli(tmp_path, "summarize", str(d / "trace.json"), "--format", "json", "--by", "op,bytes")
    assert p.returncode == 0, p.stderr
    rows = orjson.loads(p.stdout)
    assert [(r["op"], r["bytes"], r["calls"], r["total_bytes"]) for r in rows] == [
        ("allreduce", 3000, 8, 24000), ("allreduce", 4096, 4, 16384), ("bcast", 64, 6, 384)]
    assert set(rows[0]) >= {"op", "bytes", *KEYS}
    assert rows[1]["mean_us"] == pytest.approx(4.096)
    assert rows[1]["algbw_gbps"] == pytest.approx(1.0)
    assert rows[1]["busbw_gbps"] == pytest.approx(1.0)
    p = cli(tmp_path, "summarize", str(d), "--format", "json", "--by", "rank", "--by", "op",
                     "--rank", "1")
    rows = orjson.loads(p.stdout)
    assert [(r["rank"], r["op"], r["calls"]) for r in rows] == [(1, "allreduce", 6),
                                                               (1, "bcast", 3)]


def test_cli_csv(tmp_path: Path) -> None:
    d = write_job(tmp_path / "job")
    merge(d)
    p = cli(tmp_path, "summarize", str(d / "trace.json"), "--format", "csv")
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert [(r["op"], r["bucket"], r["calls"], r["pow2"]) for r in rows] == [
        ("allreduce", "2 KiB-4 KiB", "12", "False"), ("bcast", "32 B-64 B", "6", "True")]


def test_cli_table(tmp_path: Path) -> None:
    d = write_job(tmp_path / "job")
    merge(d)
    p = cli(tmp_path, "summarize", str(d / "trace.json"))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "allreduce" in out and "2 KiB-4 KiB *" in out and "32 B-64 B" in out
    assert "* sizes that are not powers of two" in out
    assert "per-rank communication time: slowest rank 1" in out and "fastest rank 0" in out
    assert "control traffic" not in out  # the classifier found no control calls
    p = cli(tmp_path, "summarize", str(d / "trace.json"), "--by", "op,bytes")
    assert "3000 *" in p.stdout and "4096 *" not in p.stdout


def test_cli_control_line(tmp_path: Path) -> None:
    d = write_job(tmp_path / "job", control=True)
    # tag the bit-vector allreduces as control in the parquet files (as the
    # Horovod classifier does for Horovod's thread), then merge
    for r in range(2):
        raw = d / "raw" / f"rank-{r:05d}.hvprof"
        convert.convert_raw(raw)
        pq = layout.parquet_path(d, r)
        df = dataset.read_dataset([pq])
        kind = np.where(df["redop"].astype(str) == "band", "control", "data")
        df["kind"] = pd.Categorical(kind, categories=["data", "control", "app"])
        import pyarrow.parquet as pqm

        pqm.write_table(dataset.frame_to_table(df), pq)
        (d / "raw" / raw.name).unlink()  # keep the edited parquet authoritative
    merge(d)
    p = cli(tmp_path, "summarize", str(d / "trace.json"))
    assert p.returncode == 0, p.stderr
    assert "data traffic" in p.stdout
    line = [x for x in p.stdout.splitlines() if x.startswith("control traffic")]
    assert len(line) == 1
    assert line[0].startswith("control traffic: 20 calls (")
    assert "calls/s per rank" in line[0] and "% of communication time" in line[0]
    # json keeps every call, control included
    rows = orjson.loads(cli(tmp_path, "summarize", str(d / "trace.json"), "--format",
                                     "json", "--by", "op,kind").stdout)
    assert [(r["op"], r["kind"], r["calls"]) for r in rows] == [
        ("allreduce", "data", 12), ("allreduce", "control", 20), ("bcast", "data", 6)]


def summary_job(d: Path) -> Path:
    """Two ranks recorded in summary mode (TSC ticks at 2 per ns): aggregates only."""
    from profiler.formats import record as F

    rng = np.random.default_rng(5)
    for r in range(2):
        w = rawgen.RawWriter(rank=r, world_size=2, clock_kind=1, ticks_per_ns=2.0)
        w.add_comm(0x77, 2, r, "MPI_COMM_WORLD")
        w.add_track(100 + r, is_main=True)
        data = w.to_bytes()
        data = rawgen.patch_header(data, mode=F.MODE_SUMMARY)
        (d / "raw").mkdir(parents=True, exist_ok=True)
        (d / "raw" / f"rank-{r:05d}.hvprof").write_bytes(data)
        durs = [int(x) for x in rng.lognormal(np.log(20_000), 0.5, 400)]  # ticks
        e = np.concatenate([
            rawgen.agg_from_durations(1, 3000, durs, t0=10),
            rawgen.agg_from_durations(4, 64, [2_000 * (r + 1)] * 5, t0=20),
            rawgen.agg_from_durations(15, 0, [100], t0=30),  # finalize: not a call
        ])
        (d / "raw" / f"rank-{r:05d}.agg").write_bytes(rawgen.agg_bytes(e, rank=r))
    return d


def test_summary_mode_aggregates(tmp_path: Path) -> None:
    from profiler.analysis import load_aggregates, summarize_aggregates

    d = summary_job(tmp_path / "job")
    res = merge(d)
    assert res.calls == 2 * (400 + 5 + 1) and res.mode == "summary"
    assert "summary mode" in res.summary_line()
    agg = load_aggregates(d / "trace.json")
    assert set(agg.columns) >= {"rank", "op", "bytes", "calls", "total_ns", "hist", "kind"}
    s = summarize_aggregates(agg, by=["op", "bytes"])
    assert s[["op", "bytes", "calls", "total_bytes"]].values.tolist() == [
        ["allreduce", 3000, 800, 2_400_000], ["bcast", 64, 10, 640]]
    b = s.iloc[1]
    assert b["total_us"] == pytest.approx((5 * 1_000 + 5 * 2_000) / 1e3)  # ticks / 2
    assert b["max_us"] == pytest.approx(2.0)
    # percentiles from the histograms: within the bucket resolution of the truth
    rng = np.random.default_rng(5)
    truth = np.concatenate([rng.lognormal(np.log(20_000), 0.5, 400).astype(int)
                            for _ in range(2)]) / 2e3  # the same draws as summary_job
    a = s.iloc[0]
    for q in (50, 95):
        assert a[f"p{q}_us"] == pytest.approx(np.percentile(truth, q), rel=0.15)
    assert a["p50_us"] <= a["p95_us"] <= a["p99_us"] <= a["max_us"]
    assert list(s.columns) == list(summarize(frame([{"op": "bcast", "bytes": 1,
                                                      "dur_ns": 1}]), by=["op", "bytes"]).columns)
    p = cli(tmp_path, "summarize", str(d / "trace.json"), "--format", "json", "--by", "rank,op")
    rows = orjson.loads(p.stdout)
    assert [(r["rank"], r["op"], r["calls"]) for r in rows] == [
        (0, "allreduce", 400), (0, "bcast", 5), (1, "allreduce", 400), (1, "bcast", 5)]
    table = cli(tmp_path, "summarize", str(d / "trace.json"))
    assert "(summary mode)" in table.stdout and "log-scale latency histograms" in table.stdout
    assert "per-rank communication time: slowest rank" in table.stdout
    with pytest.raises(UsageError):
        summarize_aggregates(agg, by=["step"])


def test_aggregates_of_directories_with_the_same_name(tmp_path: Path) -> None:
    """Two runs in directories of one name: default labels numbered (as load() does),
    not a duplicate-category error."""
    from profiler.analysis import load_aggregates

    dirs = [summary_job(tmp_path / part / "run") for part in ("a", "b")]
    for d in dirs:
        merge(d)
    agg = load_aggregates(*(d / "trace.json" for d in dirs))
    assert list(agg["label"].cat.categories) == ["run", "run#2"]
    per = agg.groupby("label", observed=True)["calls"].sum().to_dict()
    assert per == {"run": 2 * (400 + 5 + 1), "run#2": 2 * (400 + 5 + 1)}
    again = load_aggregates(dirs[0], dirs[1], dirs[0])
    assert list(again["label"].cat.categories) == ["run", "run#2", "run#3"]
    named = load_aggregates(*dirs, label=["first", "second"])
    assert list(named["label"].cat.categories) == ["first", "second"]


def test_nccl_calls_timed_by_their_device_rows() -> None:
    """Counts and bytes from the host rows (the enqueue), time from the device rows."""
    host = [{"op": "nccl_allreduce", "backend": "nccl", "bytes": 1 << 20, "dur_ns": 2_000,
             "seq": i} for i in range(4)]
    dev = [{"op": "nccl_allreduce", "backend": "nccl", "bytes": 1 << 20,
            "dur_ns": 100_000 * (i + 1), "seq": i, "device": True, "track": 1,
            "thread_kind": "stream"} for i in range(3)]
    group = [{"op": "nccl_group", "backend": "nccl", "bytes": 0, "dur_ns": 10**9, "seq": 0,
              "device": True, "track": 1, "thread_kind": "stream"}]
    s = summarize(frame(host + dev + group), by=["op"])
    r = s.set_index("op").loc["nccl_allreduce"]
    assert r["calls"] == 4 and r["total_bytes"] == 4 << 20
    # three calls timed on the device (100, 200, 300 us), one by its enqueue (2 us)
    assert r["total_us"] == pytest.approx(602.0)
    assert r["max_us"] == pytest.approx(300.0)
