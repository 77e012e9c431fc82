"""profiler.formats.dataset: raw -> rows (row schema), parquet + json per rank, reading back."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import rawgen

from profiler.collect.facts import rank_facts
from profiler.errors import CorruptError, NotFoundError
from profiler.formats import clock, dataset, rows, schema
from profiler.formats import record as F
from profiler.formats.raw import read_raw
from profiler.postjob import convert
from profiler.postjob.classify import classify


def test_schema_and_values(tmp_path: Path) -> None:
    w = rawgen.simple_rank(1, 2, n=5, nbytes=3000, t0=1_000, gap=10_000, dur=2_000,
                           offset_ns=100, job_t0_ns=500)
    df = rows.raw_to_frame(read_raw(w.write(tmp_path / "raw" / "rank-00001.hvprof")))
    assert list(df.columns) == schema.COLUMNS
    assert len(df) == 5
    assert (df["rank"] == 1).all()
    assert df["t_start_ns"].tolist() == [400, 10_400, 20_400, 30_400, 40_400]
    assert (df["dur_ns"] == 2_000).all()
    assert (df["t_end_ns"] - df["t_start_ns"] == df["dur_ns"]).all()
    assert (df["bytes"] == 3000).all() and (df["count"] == 750).all()
    assert df["op"].astype(str).unique().tolist() == ["allreduce"]
    assert df["backend"].astype(str).unique().tolist() == ["mpi"]
    assert df["dtype"].astype(str).unique().tolist() == ["MPI_FLOAT"]
    assert df["redop"].astype(str).unique().tolist() == ["sum"]
    assert (df["comm"] == 0x5EED).all() and (df["comm_size"] == 2).all()
    assert (df["comm_rank"] == 1).all()
    assert df["comm_name"].astype(str).unique().tolist() == ["MPI_COMM_WORLD"]
    assert df["seq"].tolist() == [0, 1, 2, 3, 4]
    assert (df["tid"] == 1001).all()
    assert df["thread_kind"].astype(str).unique().tolist() == ["main"]
    assert (df["step"] == -1).all()
    expected = {"rank": "int32", "t_start_ns": "int64", "dur_ns": "int64", "bytes": "int64",
                "dtype_size": "int32", "flags": "int32", "in_place": "bool", "rc": "int16",
                "comm": "uint64", "comm_size": "int32", "root": "int32", "seq": "int64",
                "track": "int32", "tid": "int32", "group": "int32", "step": "int32"}
    for col, dt in expected.items():
        assert str(df[col].dtype) == dt, col
    for col in schema.CATEGORY_COLUMNS:
        assert isinstance(df[col].dtype, pd.CategoricalDtype), col


def test_tsc_calibration_pairs_and_fallback() -> None:
    h = {"clock_kind": 1, "ticks_per_ns": 3.0, "cal0_ticks": 1_000, "cal0_mono_ns": 50,
         "cal1_ticks": 1_000 + 2_000_000, "cal1_mono_ns": 50 + 1_000_000,
         "offset_ns": 0, "job_t0_ns": 0}
    ticks = np.array([1_000, 3_000, 1_000 + 2_000_000], dtype=np.uint64)
    # the pair says 2 ticks per ns (beats ticks_per_ns = 3)
    assert clock.ticks_to_mono_ns(ticks, h).tolist() == [50, 1_050, 1_000_050]
    h["cal1_ticks"], h["cal1_mono_ns"] = 0, 0  # no later pair: ticks_per_ns
    assert clock.ticks_to_mono_ns(ticks, h).tolist() == [50, 717, 666_717]
    h.update(offset_ns=-7, job_t0_ns=40)
    assert clock.ticks_to_job_ns(ticks, h).tolist() == [17, 684, 666_684]
    mono = {"clock_kind": 2, "offset_ns": 10, "job_t0_ns": 5}
    assert clock.ticks_to_job_ns(np.array([100], dtype=np.uint64), mono).tolist() == [85]


def test_tsc_ranks_line_up(tmp_path: Path) -> None:
    """Two ranks with different TSC rates and offsets: the same instant lines up."""
    frames = []
    for rank, (tpn, offset) in enumerate([(2.0, 0), (3.0, 1_000)]):
        w = rawgen.RawWriter(rank=rank, world_size=2, clock_kind=1, ticks_per_ns=tpn,
                             cal0=(0, 0), cal1=(int(tpn * 1e9), int(1e9)), offset_ns=offset,
                             job_t0_ns=10_000)
        w.add_comm(1, 2, rank, "MPI_COMM_WORLD")
        t = w.add_track(10 + rank, is_main=True)
        mono = 50_000 + offset  # same instant on rank 0's axis: 50_000
        w.add(t, rawgen.records(1, t_start=int(mono * tpn), t_end=int((mono + 10) * tpn), op=1))
        frames.append(rows.raw_to_frame(read_raw(w.write(tmp_path / f"{rank}.hvprof"))))
    assert [int(f["t_start_ns"][0]) for f in frames] == [40_000, 40_000]
    assert [int(f["dur_ns"][0]) for f in frames] == [10, 10]


def test_thread_kinds_groups_devices(tmp_path: Path) -> None:
    w = rawgen.RawWriter(chunk_bytes=4096)
    w.add_comm(1, 2, 0, "MPI_COMM_WORLD")
    w.add_comm(2, 2, 0, "nccl", backend=1)
    tracks = [w.add_track(1, is_main=True), w.add_track(2, caller="mpi_lib.cpython-311.so"),
              w.add_track(3, caller="libhorovod_torch.so"), w.add_track(4, name="worker"),
              w.add_track(-1, stream=True)]
    for i, t in enumerate(tracks):
        w.add(t, rawgen.records(1, t_start=i * 10, t_end=i * 10 + 5, op=64, comm=1, aux=7,
                                flags=F.FLAG_DEVICE if i == 4 else F.FLAG_IN_PLACE))
    df = rows.raw_to_frame(read_raw(w.write(tmp_path / "r.hvprof")))
    assert df["thread_kind"].astype(str).tolist() == ["main", "horovod", "horovod", "other",
                                                       "stream"]
    assert df["thread_name"].astype(str).tolist()[3] == "worker"
    assert df["backend"].astype(str).unique().tolist() == ["nccl"]
    assert df["group"].tolist() == [7, 7, 7, 7, 0]  # device rows: aux is the host track
    assert df["device"].tolist() == [False] * 4 + [True]
    assert df["in_place"].tolist() == [True] * 4 + [False]
    assert df["comm_name"].astype(str).unique().tolist() == ["nccl"]


def test_unknown_codes_and_out_of_range_indices(tmp_path: Path) -> None:
    w = rawgen.RawWriter()
    w.add_comm(1, 2, 0, "MPI_COMM_WORLD")
    t = w.add_track(1, is_main=True)
    w.add(t, rawgen.records(2, t_start=[0, 10], t_end=[5, 15], op=[200, 1], dtype=[250, 14],
                            redop=[99, 1], comm=[5, 0]))
    df = rows.raw_to_frame(read_raw(w.write(tmp_path / "r.hvprof")))
    assert df["op"].astype(str).tolist() == ["op_200", "allreduce"]
    assert df["backend"].astype(str).tolist() == ["unknown", "mpi"]
    assert df["dtype"].astype(str).tolist() == ["dtype_250", "MPI_FLOAT"]
    assert df["redop"].astype(str).tolist() == ["redop_99", "sum"]
    assert df["comm"].tolist() == [0, 1] and df["comm_size"].tolist() == [-1, 2]


def test_uncompleted_request_has_zero_duration(tmp_path: Path) -> None:
    w = rawgen.RawWriter()
    w.add_comm(1, 1, 0, "MPI_COMM_WORLD")
    t = w.add_track(1, is_main=True)
    w.add(t, rawgen.records(1, t_start=100, t_end=0, op=2, flags=F.FLAG_NO_COMPLETION))
    df = rows.raw_to_frame(read_raw(w.write(tmp_path / "r.hvprof")))
    assert df["dur_ns"].tolist() == [0]


def test_steps_and_default_kinds(tmp_path: Path) -> None:
    w = rawgen.RawWriter()
    w.add_comm(1, 1, 0, "MPI_COMM_WORLD")
    t = w.add_track(1, is_main=True)
    # steps 0: [100, 200), 1: [200, 300); calls at 50, 100, 150, 250, 299, 300, 400
    w.add(t, rawgen.records(2, t_start=[100, 200], t_end=[200, 300], op=32, seq=[0, 1],
                            count=[64, 64]))
    w.add(t, rawgen.records(7, t_start=[50, 100, 150, 250, 299, 300, 400],
                            t_end=[51, 101, 151, 251, 300, 301, 401], op=1))
    df = rows.raw_to_frame(read_raw(w.write(tmp_path / "r.hvprof")))
    assert df["t_start_ns"].is_monotonic_increasing
    calls = df[df["op"] == "allreduce"]
    assert calls["step"].tolist() == [-1, 0, 0, 1, 1, -1, -1]
    steps = df[df["op"] == "step"]
    assert steps["step"].tolist() == [0, 1] and steps["count"].tolist() == [64, 64]
    assert steps["kind"].astype(str).unique().tolist() == ["app"]
    assert calls["kind"].astype(str).unique().tolist() == ["data"]
    assert steps["backend"].astype(str).unique().tolist() == ["app"]


def test_classify_hook_is_used(tmp_path: Path) -> None:
    def classify(df: pd.DataFrame) -> pd.Series:
        return pd.Series(np.where(df["redop"].astype(str) == "band", "control", "data"),
                         index=df.index)

    w = rawgen.RawWriter()
    w.add_comm(1, 1, 0, "MPI_COMM_WORLD")
    t = w.add_track(1, is_main=True)
    w.add(t, rawgen.records(3, t_start=[0, 1, 2], t_end=[1, 2, 3], op=1, redop=[6, 1, 6]))
    df = rows.raw_to_frame(read_raw(w.write(tmp_path / "r.hvprof")), classify)
    assert df["kind"].astype(str).tolist() == ["control", "data", "control"]


def test_convert_writes_parquet_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "0")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("OMPI_MCA_btl", "self,vader")
    monkeypatch.setenv("UCX_TLS", "rc")
    monkeypatch.setenv("MPICH_ASYNC_PROGRESS", "1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("MY_HOROVOD_TOKEN", "do-not-leak")
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "launcher-internal")
    raw = rawgen.simple_rank(0, 1, n=7).write(tmp_path / "raw" / "rank-00000.hvprof")
    c = convert.convert_raw(raw, facts=rank_facts(str(raw)))
    assert c.parquet == tmp_path / "ranks" / "rank-00000.parquet"
    assert c.calls == 7 and c.rows == 7 and c.complete
    meta = orjson.loads(c.meta.read_bytes())
    assert meta["env"] == {"HOROVOD_FUSION_THRESHOLD": "0", "MPICH_ASYNC_PROGRESS": "1",
                           "NCCL_DEBUG": "INFO", "OMPI_MCA_btl": "self,vader", "UCX_TLS": "rc"}
    assert "do-not-leak" not in c.meta.read_text()
    assert meta["argv"] == sys.argv and meta["executable"] == sys.executable
    assert meta["comms"][0]["name"] == "MPI_COMM_WORLD" and meta["comms"][0]["id"] == 0x5EED
    assert meta["tracks"][0]["thread_kind"] == "main"
    assert meta["header"]["rank"] == 0 and meta["source"]["raw"] == "raw/rank-00000.hvprof"
    back = dataset.read_dataset([c.parquet])
    pd.testing.assert_frame_equal(back, rows.raw_to_frame(read_raw(raw), classify))
    assert convert.is_up_to_date(raw)
    # another process converting (profiler merge): no env, no argv
    c2 = convert.convert_raw(raw)
    meta2 = orjson.loads(c2.meta.read_bytes())
    assert meta2["env"] is None and meta2["argv"] is None


def test_up_to_date_tracks_the_raw_file(tmp_path: Path) -> None:
    raw = rawgen.simple_rank(0, 1, n=3).write(tmp_path / "raw" / "rank-00000.hvprof")
    assert not convert.is_up_to_date(raw)
    convert.convert_raw(raw)
    assert convert.is_up_to_date(raw)
    rawgen.simple_rank(0, 1, n=200).write(raw)  # the file grew
    assert not convert.is_up_to_date(raw)


def test_read_dataset_many_files_rank_filter(tmp_path: Path) -> None:
    files = []
    for r in range(3):
        w = rawgen.simple_rank(r, 3, n=4 + r, op_name=["allreduce", "bcast", "barrier"][r])
        raw = w.write(tmp_path / "raw" / f"rank-{r:05d}.hvprof")
        files.append(convert.convert_raw(raw).parquet)
    df = dataset.read_dataset(files)
    assert df.groupby("rank").size().tolist() == [4, 5, 6]
    assert isinstance(df["op"].dtype, pd.CategoricalDtype)
    assert sorted(df["op"].astype(str).unique()) == ["allreduce", "barrier", "bcast"]
    sub = dataset.read_dataset(files, ranks=[1, 2], columns=["rank", "op", "bytes"])
    assert list(sub.columns) == ["rank", "op", "bytes"] and len(sub) == 11
    assert dataset.read_dataset(files, ranks=[7]).empty
    with pytest.raises(NotFoundError):
        dataset.read_dataset([tmp_path / "ranks" / "rank-00009.parquet"])


def test_empty_frame_schema() -> None:
    df = rows.empty_frame()
    assert list(df.columns) == schema.COLUMNS and len(df) == 0


def test_schema_kinds_match_what_the_converter_writes(tmp_path: Path) -> None:
    # the column kinds every reader checks (ROW_KINDS) against the writer's frame and file
    import pyarrow.parquet as pq

    raw = rawgen.simple_rank(0, 1, n=5).write(tmp_path / "raw" / "rank-00000.hvprof")
    df = rows.raw_to_frame(read_raw(raw))
    kind_of = {"i": "int", "u": "int", "b": "bool", "f": "float"}
    for c in schema.COLUMNS:
        dt = df[c].dtype
        got = "str" if isinstance(dt, pd.CategoricalDtype) else kind_of[dt.kind]
        assert schema.ROW_KINDS[c] == got, c
    written = pq.read_schema(convert.convert_raw(raw).parquet)
    assert dataset.schema_columns(written) == schema.COLUMNS
    with pytest.raises(CorruptError, match="no t_start_ns column"):
        dataset.schema_columns(written.remove(written.get_field_index("t_start_ns")))
    with pytest.raises(CorruptError, match="appears twice"):
        dataset.schema_columns(written.append(written.field("rank")))


def test_clock_offset_interpolated_between_its_two_measurements(tmp_path: Path) -> None:
    # rank 1's clock runs 50 ppm fast against rank 0's: offset 1000 ns at its
    # CLOCK_MONOTONIC 1 s, 1000 + 50e-6 * 10 s = 501000 ns at 11 s
    raw = read_raw(rawgen.simple_rank(1, 2, n=3).write(tmp_path / "rank-00001.hvprof"))
    h = dict(raw.header)
    assert clock.clock_drift_ppm(h) is None  # measured once (an older file reads the same)
    h.update(offset_ns=1000, offset_at_ns=1_000_000_000, offset_end_ns=501_000,
             offset_end_at_ns=11_000_000_000, job_t0_ns=0)
    assert clock.clock_drift_ppm(h) == pytest.approx(50.0)
    t = np.array([1_000_000_000, 6_000_000_000, 11_000_000_000, 21_000_000_000])
    assert clock.ticks_to_job_ns(t, h).tolist() == [999_999_000, 5_999_749_000,
                                               10_999_499_000, 20_998_999_000]
    h["offset_end_ns"] = 1000 + 20_000_000  # 2000 ppm: a stepped clock, not drift
    assert clock.clock_drift_ppm(h) is None
    assert clock.ticks_to_job_ns(t, h).tolist() == (t - 1000).tolist()
