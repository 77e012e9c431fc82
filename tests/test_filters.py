"""One row filter, three renderings (pandas mask, pyarrow expression, DuckDB SQL):
every filter keeps the same rows in each, including when the kind or step column
is absent (profiler.formats.filters documents the meaning)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow.dataset as pads
import pytest

from profiler.errors import UsageError
from profiler.formats.filters import RowFilter

N = 240


def _rows(with_kind: bool, with_step: bool) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    df = pd.DataFrame({
        "rank": np.arange(N, dtype=np.int32) % 4,
        "seq": np.arange(N, dtype=np.int64),
        "op": pd.Categorical(rng.choice(["allreduce", "bcast", "gatherv"], N)),
        "t_start_ns": np.arange(N, dtype=np.int64) * 1000,
    })
    if with_kind:
        df["kind"] = pd.Categorical(rng.choice(["data", "control", "app"], N))
    if with_step:
        df["step"] = (np.arange(N, dtype=np.int32) // 20) - 1
    return df


FILTERS = [
    RowFilter(),
    RowFilter.of(ranks=[1, 3]),
    RowFilter.of(ranks=[]),
    RowFilter.of(ops=["bcast"]),
    RowFilter.of(ops=[]),
    RowFilter.of(kinds=["data"]),
    RowFilter.of(kinds=["control"]),
    RowFilter.of(kinds=["data", "control"]),
    RowFilter.of(kinds=[]),
    RowFilter.of(t_start_ns=[10_000, 50_000]),
    RowFilter.of(steps=[2, 4]),
    RowFilter.of(ranks=[0, 2], ops=["allreduce", "gatherv"], kinds=["control"],
                 t_start_ns=[0, 200_000]),
]


def _keys(df: pd.DataFrame) -> list[int]:
    return sorted(int(s) for s in df["seq"])


@pytest.mark.parametrize("with_kind", [True, False], ids=["kind", "no-kind"])
@pytest.mark.parametrize("with_step", [True, False], ids=["step", "no-step"])
def test_every_rendering_keeps_the_same_rows(tmp_path: Path, with_kind: bool,
                                             with_step: bool) -> None:
    df = _rows(with_kind, with_step)
    path = tmp_path / "rows.parquet"
    df.to_parquet(path)
    cols = list(df.columns)
    con = duckdb.connect()
    checked = 0
    for flt in FILTERS:
        if flt.steps is not None and not with_step:
            with pytest.raises(UsageError, match="no step column"):
                flt.mask(df)
            with pytest.raises(UsageError, match="no step column"):
                flt.expression(cols)
            with pytest.raises(UsageError, match="no step column"):
                flt.sql(cols)
            continue
        by_pandas = _keys(flt.apply(df))
        expr = flt.expression(cols)
        by_arrow = _keys(pads.dataset(path).to_table(filter=expr).to_pandas())
        where = " AND ".join(flt.sql(cols)) or "TRUE"
        by_sql = _keys(con.execute(f"SELECT seq FROM read_parquet('{path}') WHERE {where}").df())
        assert by_pandas == by_arrow == by_sql, (flt, with_kind)
        checked += 1
        # the meaning, not only the agreement
        if flt.kinds is not None and not with_kind:
            assert by_pandas == (_keys(df) if "data" in flt.kinds else []), flt
        if flt.ranks == ():
            assert by_pandas == []
    assert checked == len(FILTERS) - (0 if with_step else 1)


@pytest.mark.processes
@pytest.mark.parametrize("drop", [None, "kind"], ids=["as-written", "no-kind-column"])
def test_every_engine_gives_the_same_summary(tmp_path: Path, drop: str | None) -> None:
    """pandas in memory, DuckDB in place and Dask: the same table for the same
    filters, on the golden fused trace's rank files (and on them without a kind
    column, as another tool might write them)."""
    import pyarrow.parquet as pq

    from profiler.analysis import TraceAnalysis

    src = Path(__file__).parent / "data" / "analysis" / "fused" / "ranks"
    d = tmp_path / "prof" / "ranks"
    d.mkdir(parents=True)
    for f in sorted(src.glob("rank-*.parquet")):
        table = pq.read_table(f)
        if drop is not None:
            table = table.drop_columns([drop]).replace_schema_metadata(None)
        pq.write_table(table, d / f.name)
    engines = {e: TraceAnalysis.open(d.parent, engine=e) for e in ("pandas", "duckdb", "dask")}
    assert [ta.engine for ta in engines.values()] == ["pandas", "duckdb", "dask"]
    cases = [dict(), dict(kinds=["data"]), dict(kinds=["control"]), dict(ranks=[1]),
             dict(ops=["allreduce"], kinds=["data", "control"])]
    for case in cases:
        tables = {e: ta.summary(["op", "bucket"], **case) for e, ta in engines.items()}
        base = tables["pandas"]
        if drop == "kind" and case.get("kinds") == ["control"]:
            assert base.empty, "no kind column: every call is data"
        else:
            assert len(base) and int(base["calls"].sum()) > 0, case
        for e, t in tables.items():
            assert list(t["op"]) == list(base["op"]), (e, case)
            assert list(t["bucket"]) == list(base["bucket"]), (e, case)
            assert list(t["calls"]) == list(base["calls"]), (e, case)
            assert np.allclose(t["total_us"], base["total_us"]), (e, case)
            assert np.allclose(t["p95_us"], base["p95_us"]), (e, case)
