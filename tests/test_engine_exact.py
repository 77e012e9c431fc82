"""The DuckDB engine's cheap per-row forms are exact (analysis.engine):

* the size bucket (the next power of two) from a floating-point guess corrected
  by integer compares, against Python's integers at every power of two and its
  neighbours up to 2**61;
* the straggler ranking's packed (arrival, rank) key: ties go to the highest
  rank, arrivals before the job's zero (negative times) order as numbers do,
  and the ranking equals imbalance.stragglers in memory;
* the overview kept for the next question (the ranks with calls) is the one of
  these very files: a file rewritten is scanned again.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from profiler.analysis import engine
from profiler.analysis.imbalance import stragglers
from profiler.formats.trace_dataset import Dataset


def next_pow2(x: int) -> int:
    return 0 if x <= 0 else 1 << (x - 1).bit_length()


def test_the_size_bucket_is_exact_around_every_power_of_two() -> None:
    values = [-3, 0, 1, 2, 3]
    for k in range(1, 62):
        values += [(1 << k) - 1, 1 << k, (1 << k) + 1]
    sql = (f"SELECT x, {engine._next_pow2_sql('x')} AS b FROM (SELECT x, "
           f"{engine._pow2_guess_sql('x')} FROM (SELECT unnest($v)::BIGINT AS x))")
    got = dict(duckdb.execute(sql, {"v": values}).fetchall())
    assert len(got) == len(set(values))
    wrong = {x: b for x, b in got.items() if b != next_pow2(x)}
    assert wrong == {}


def write_rank(path: Path, rank: int, rows: list[tuple[int, int, int]]) -> None:
    """rows: (comm, seq, t_start_ns) of data allreduces on communicators of 3."""
    n = len(rows)
    table = pa.table({
        "rank": pa.array([rank] * n, pa.int32()),
        "backend": pa.array(["mpi"] * n).dictionary_encode(),
        "op": pa.array(["allreduce"] * n).dictionary_encode(),
        "t_start_ns": pa.array([r[2] for r in rows], pa.int64()),
        "t_end_ns": pa.array([r[2] + 1000 for r in rows], pa.int64()),
        "dur_ns": pa.array([1000] * n, pa.int64()),
        "bytes": pa.array([64] * n, pa.int64()),
        "device": pa.array([False] * n, pa.bool_()),
        "comm": pa.array([r[0] for r in rows], pa.uint64()),
        "comm_size": pa.array([3] * n, pa.int32()),
        "seq": pa.array([r[1] for r in rows], pa.int64()),
        "kind": pa.array(["data"] * n).dictionary_encode(),
    })
    pq.write_table(table, path)


@pytest.fixture()
def tied(tmp_path: Path) -> Dataset:
    """Three ranks, three calls: call 0 ties ranks 1 and 2 last (before zero),
    call 1 has rank 0 last, call 2 ties all three (no spread: nobody's)."""
    arrivals = {0: [-900, 50, 7], 1: [-400, 10, 7], 2: [-400, 20, 7]}
    files = []
    for r, ts in arrivals.items():
        f = tmp_path / f"rank-{r:05d}.parquet"
        write_rank(f, r, [(11, s, t) for s, t in enumerate(ts)])
        files.append(f)
    return Dataset(tmp_path, files)


def test_stragglers_in_place_break_ties_as_in_memory(tied: Dataset) -> None:
    got = engine.stragglers_dataset(tied)
    frame = pd.concat([pq.read_table(f).to_pandas() for f in tied.files], ignore_index=True)
    for c in ("backend", "op", "kind"):
        frame[c] = frame[c].astype(str)
    want = stragglers(frame)
    assert got["rank"].tolist() == want["rank"].tolist() == [2, 0, 1]
    assert got["last_count"].tolist() == want["last_count"].tolist() == [1, 1, 0]
    np.testing.assert_allclose(got["caused_wait_s"], want["caused_wait_s"], rtol=1e-12)
    np.testing.assert_allclose(got["gain_s"], want["gain_s"], rtol=1e-12, atol=1e-15)
    # call 0: rank 2 (tied with rank 1) 500 ns after rank 0; call 2, all three at
    # once, has no spread and counts for nobody
    assert got.loc[got["rank"] == 2, "mean_lateness_us"].item() == pytest.approx(0.5)
    assert got.loc[got["rank"] == 2, "caused_wait_s"].item() == pytest.approx(500e-9)


def test_the_kept_overview_is_of_these_files(tied: Dataset) -> None:
    engine._MEMO.clear()
    engine.overview(tied)
    assert engine.stragglers_dataset(tied)["rank"].tolist() == [2, 0, 1]
    # rank 1's file rewritten with no call at all: a fresh scan, rank 1 gone
    write_rank(tied.files[1], 1, [])
    got = engine.stragglers_dataset(tied)
    assert sorted(got["rank"].tolist()) == [0, 2]
