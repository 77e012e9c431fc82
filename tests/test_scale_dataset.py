"""Cluster scale (issue 7) on a 64-rank dataset generated from a real 2-rank Horovod
trace (tests/data/analysis/fused) by `profiler synth`:

* the generator: exact calls per rank, the template's message-size mix, (comm, seq)
  matching on all 64 ranks, determinism, stragglers recorded;
* summarize over the dataset queried in place (DuckDB) equals the summary computed
  in memory (pandas) from the same records, with and without filters, from the
  API and from the CLI;
* the injected stragglers are the ones the analysis finds;
* the Dask path (LocalCluster) gives the same summary as the local engine;
* trace.json of a large job: a bounded window (first ranks + likely stragglers,
  middle steps), written without reading the other ranks' records.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, profiler_cli

from profiler.analysis import load, load_meta, stragglers, summarize
from profiler.analysis.engine import overview, summarize_dataset
from profiler.errors import ProfilerError, UsageError
from profiler.postjob.merge import merge

SOURCE = ROOT / "tests" / "data" / "analysis" / "fused"
RANKS = 64
CALLS = 1500
STRAGGLERS = 3
SEED = 11
SUMMARY_COLUMNS = ["rank", "backend", "op", "bytes", "dur_ns", "comm_size", "kind", "device",
                   "t_start_ns", "t_end_ns", "comm", "comm_name", "thread_kind", "dtype",
                   "step", "track", "seq"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("scale") / "job64"
    p = profiler_cli("synth", str(SOURCE / "trace.json"), "-o", str(d), "--ranks", str(RANKS),
                     "--calls-per-rank", str(CALLS), "--stragglers", str(STRAGGLERS),
                     "--seed", str(SEED), "-q")
    assert p.returncode == 0, p.stderr
    assert "synthetic dataset written to" in p.stdout
    return d


@pytest.fixture(scope="module")
def frame(job: Path) -> pd.DataFrame:
    return load(job, columns=SUMMARY_COLUMNS)


def same_table(got: pd.DataFrame, want: pd.DataFrame, keys: list[str]) -> None:
    """Equal tables: keys, counts and bytes exactly, floats to 1e-9 (DuckDB and numpy
    interpolate and sum floats in different orders)."""
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want)
    if keys:
        got = got.sort_values(keys, kind="stable").reset_index(drop=True)
        want = want.sort_values(keys, kind="stable").reset_index(drop=True)
    for c in got.columns:
        a, b = got[c].to_numpy(), want[c].to_numpy()
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=1e-9,
                                       equal_nan=True, err_msg=c)
        else:
            assert a.tolist() == b.tolist(), c


# ---------------------------------------------------------------------------
# the generator
# ---------------------------------------------------------------------------
def test_generated_dataset_shape(job: Path, frame: pd.DataFrame) -> None:
    meta = load_meta(job)
    assert meta["world_size"] == RANKS and len(meta["ranks"]) == RANKS
    assert meta["dataset"]["calls"] == RANKS * CALLS
    files = sorted((job / "ranks").glob("rank-*.parquet"))
    assert len(files) == RANKS and len(list((job / "ranks").glob("rank-*.json"))) == RANKS
    syn = meta["synthetic"]
    assert syn["ranks"] == RANKS and syn["seed"] == SEED
    assert len(syn["stragglers"]) == STRAGGLERS
    calls = frame.loc[frame["backend"].astype(str) != "app"]
    per_rank = calls.groupby("rank").size()
    assert per_rank.index.tolist() == list(range(RANKS))
    assert (per_rank == CALLS).all()  # exactly --calls-per-rank calls on every rank
    assert int(frame["dur_ns"].min()) >= 0
    assert (frame["t_end_ns"] - frame["t_start_ns"] == frame["dur_ns"]).all()
    # every world communicator spans the 64 ranks; rows sorted by start on each rank
    coll = calls.loc[calls["seq"] >= 0]
    assert set(coll["comm_size"].unique().tolist()) == {RANKS}
    assert (frame.groupby("rank")["t_start_ns"].diff().fillna(0) >= 0).all()
    for r in (0, syn["stragglers"][0]):
        m = orjson.loads((job / "ranks" / f"rank-{r:05d}.json").read_bytes())
        assert m["rank"] == r and m["calls"] == CALLS and m["header"]["world_size"] == RANKS
        assert m["synthetic"]["straggler"] is (r in syn["stragglers"])
        assert m["totals"]["comm_ns"] > 0


def test_message_size_mix_is_the_templates(frame: pd.DataFrame) -> None:
    tmpl = pd.read_parquet(SOURCE / "ranks" / "rank-00000.parquet")
    tmpl = tmpl.loc[tmpl["backend"].astype(str) != "app"]
    mine = frame.loc[(frame["rank"] == 5) & (frame["backend"].astype(str) != "app")]
    key = ["op", "bytes", "dtype", "kind"]

    def mix(df: pd.DataFrame) -> set[tuple[str, int, str, str]]:
        return {(str(a), int(b), str(c), str(d)) for a, b, c, d in
                df[key].drop_duplicates().itertuples(index=False)}

    assert mix(mine) == mix(tmpl)
    # each step of the repeated body makes the same calls as the template's steps
    steps = frame.loc[frame["op"].astype(str) == "step"]
    assert steps.groupby("rank").size().nunique() == 1
    assert (steps["step"] == steps["seq"]).all()


def test_every_collective_matches_on_all_ranks(frame: pd.DataFrame) -> None:
    from profiler.analysis import match_calls

    m = match_calls(frame, kinds=None)
    assert len(m) == CALLS - 2  # every call but MPI_Init and MPI_Finalize
    assert (m["n_ranks"] == RANKS).all() and m["complete"].all()


def test_generator_is_deterministic(tmp_path: Path) -> None:
    from profiler.synth import SynthConfig, synthesize

    cfg = SynthConfig(ranks=4, calls_per_rank=300, stragglers=1, seed=3)
    a = synthesize(SOURCE, tmp_path / "a", cfg)
    b = synthesize(SOURCE, tmp_path / "b", cfg)
    assert a.stragglers == b.stragglers
    for r in range(4):
        ta = pq.read_table(tmp_path / "a" / "ranks" / f"rank-{r:05d}.parquet")
        tb = pq.read_table(tmp_path / "b" / "ranks" / f"rank-{r:05d}.parquet")
        assert ta.equals(tb)
    synthesize(SOURCE, tmp_path / "c", SynthConfig(ranks=4, calls_per_rank=300, seed=4))
    tc = pq.read_table(tmp_path / "c" / "ranks" / "rank-00001.parquet")
    assert not tc.equals(pq.read_table(tmp_path / "a" / "ranks" / "rank-00001.parquet"))
    with pytest.raises(UsageError, match="not empty"):
        synthesize(SOURCE, tmp_path / "a", cfg)
    with pytest.raises(UsageError, match="--ranks"):
        synthesize(SOURCE, tmp_path / "d", SynthConfig(ranks=0))


def test_synth_cli_bad_input(tmp_path: Path) -> None:
    for args, fragment in [
        (["synth", str(tmp_path / "nope"), "-o", str(tmp_path / "o"), "--ranks", "4"],
         "no such file"),
        (["synth", str(SOURCE), "-o", str(tmp_path / "o"), "--ranks", "0"], "--ranks"),
        (["synth", str(SOURCE), "-o", str(tmp_path / "o"), "--ranks", "2", "--stragglers",
          "3"], "--stragglers"),
        (["synth", str(SOURCE), "-o", str(tmp_path / "o")], "required"),
    ]:
        p = profiler_cli(*args, cwd=tmp_path)
        assert p.returncode == 2, (args, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("profiler: error:"), p.stderr
        assert fragment in lines[0]


# ---------------------------------------------------------------------------
# summarize: in place == in memory
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("by", [["op", "bucket"], ["rank", "op"], ["comm", "kind"],
                                ["thread", "dtype", "step"], []])
def test_summarize_dataset_equals_in_memory(job: Path, frame: pd.DataFrame,
                                            by: list[str]) -> None:
    same_table(summarize_dataset(job, by=by), summarize(frame, by=by), by)


def test_filters_pushed_down_equal_in_memory(job: Path, frame: pd.DataFrame) -> None:
    ranks = [0, 1, 2, 17, 40, 63]
    steps = (30, 60)
    sel = frame.loc[(frame["step"] >= steps[0]) & (frame["step"] <= steps[1])
                    & frame["op"].astype(str).isin(["allreduce"])]
    want = summarize(sel, by=["op", "bucket"], rank=ranks, kinds=["data"])
    got = summarize_dataset(job, by=["op", "bucket"], ranks=ranks, steps=steps,
                            ops=["allreduce"], kinds=["data"])
    same_table(got, want, ["op", "bucket"])
    assert int(got["calls"].sum()) == int(want["calls"].sum()) > 0
    # the same filters through load(): pushed down to the parquet scan
    loaded = load(job, ranks=ranks, steps=steps, ops=["allreduce"], columns=SUMMARY_COLUMNS)
    assert sorted(loaded["rank"].unique().tolist()) == ranks
    assert len(loaded) == int(sel["rank"].isin(ranks).sum())


def test_cli_summarize_json_equals_in_memory(job: Path, frame: pd.DataFrame,
                                             tmp_path: Path) -> None:
    p = profiler_cli("summarize", str(job), "--format", "json", "--by", "op,bucket",
                     cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = pd.DataFrame(orjson.loads(p.stdout))
    want = summarize(frame, by=["op", "bucket"])
    same_table(got[list(want.columns)], want, ["op", "bucket"])
    # pandas engine: the same numbers
    q = profiler_cli("summarize", str(job), "--format", "json", "--by", "op,bucket",
                     "--engine", "pandas", cwd=tmp_path)
    assert q.returncode == 0, q.stderr
    same_table(pd.DataFrame(orjson.loads(q.stdout)), got, ["op", "bucket"])


def test_cli_summarize_table_and_filters(job: Path, frame: pd.DataFrame,
                                         tmp_path: Path) -> None:
    p = profiler_cli("summarize", str(job / "trace.json"), "--ranks", "0-3,9", "--steps",
                     "10-20", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"5 rank(s) of {RANKS}" in p.stdout and "data traffic" in p.stdout
    sel = frame.loc[frame["rank"].isin([0, 1, 2, 3, 9]) & (frame["step"] >= 10)
                    & (frame["step"] <= 20)]
    ctrl = summarize(sel, by=[], kinds=["control"])
    line = next(x for x in p.stdout.splitlines() if x.startswith("control traffic"))
    assert line.startswith(f"control traffic: {int(ctrl['calls'].iloc[0])} calls (")
    assert "per-rank communication time: slowest rank" in p.stdout
    bad = profiler_cli("summarize", str(job), "--ranks", "70-71", cwd=tmp_path)
    assert bad.returncode == 2 and "rank 70 is not in this trace (ranks: 0-63)" in bad.stderr
    bad = profiler_cli("summarize", str(job), "--steps", "x", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("profiler: error: --steps")


def test_overview_matches_in_memory(job: Path, frame: pd.DataFrame) -> None:
    ov = overview(job)
    comm = frame.loc[(frame["backend"].astype(str) != "app")
                     & ~frame["op"].astype(str).isin(["init", "finalize"])]
    assert ov.ranks() == list(range(RANKS))
    assert ov.count() == len(comm)
    assert ov.count("control") == int((comm["kind"].astype(str) == "control").sum())
    per = comm.groupby("rank")["dur_ns"].sum()
    assert ov.per_rank_ns().astype(np.int64).tolist() == per.tolist()
    assert ov.span_ns() == float(comm["t_end_ns"].max() - comm["t_start_ns"].min())


def test_bad_dataset_is_a_profiler_error(job: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown --by key"):
        summarize_dataset(job, by=["colour"])
    with pytest.raises(ProfilerError, match="no such file"):
        summarize_dataset(tmp_path / "nope")
    (tmp_path / "only-raw" / "raw").mkdir(parents=True)
    with pytest.raises(ProfilerError, match="no parquet dataset"):
        summarize_dataset(tmp_path / "only-raw")


# ---------------------------------------------------------------------------
# stragglers
# ---------------------------------------------------------------------------
def test_injected_stragglers_are_found(job: Path, frame: pd.DataFrame) -> None:
    injected = sorted(load_meta(job)["synthetic"]["stragglers"])
    ranking = stragglers(frame, kinds=None)
    assert sorted(ranking["rank"].head(STRAGGLERS).tolist()) == injected
    top = ranking.head(STRAGGLERS)
    rest = ranking.iloc[STRAGGLERS:]
    # each caused more waiting than every other rank put together would suggest
    assert top["caused_wait_s"].min() > 10 * rest["caused_wait_s"].max()
    assert (top["mean_lateness_us"] > 20).all()
    # cheap hint trace.json uses: stragglers spend the least time in collectives
    per = overview(job).per_rank_ns().sort_values()
    assert sorted(per.index[:STRAGGLERS].tolist()) == injected


# ---------------------------------------------------------------------------
# Dask
# ---------------------------------------------------------------------------
@pytest.mark.full
@pytest.mark.filterwarnings("ignore:The inplace keyword")
def test_dask_local_cluster_equals_local_engine(job: Path) -> None:
    from dask.distributed import Client, LocalCluster

    from profiler.analysis import summarize_dask

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for by, kw in [(["op", "bucket"], {}),
                       (["rank", "op"], {"ranks": [0, 5, 33, 63], "kinds": ["data"]}),
                       (["comm", "kind"], {"steps": (5, 50)})]:
            local = summarize_dataset(job, by=by, **kw)
            dist = summarize_dask(job, by=by, client=client, **kw)
            same_table(dist, local, by)
            assert int(dist["calls"].sum()) > 0


# ---------------------------------------------------------------------------
# trace.json of a large job
# ---------------------------------------------------------------------------
def test_trace_window_for_large_jobs(job: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(job, d)
    injected = set(load_meta(job)["synthetic"]["stragglers"])
    # a rank trace.json does not show: its records are never read (garbage is fine)
    (d / "ranks" / "rank-00040.parquet").write_bytes(b"garbage")
    monkeypatch.setenv("HOROVOD_PROFILE_TRACE_STEPS", "4")
    res = merge(d, limit=20_000)
    assert res.world_size == RANKS and res.calls == RANKS * CALLS
    meta = load_meta(d)
    ev = meta["events"]
    assert ev["total"] == sum(m["rows"] for m in
                              (orjson.loads(p.read_bytes()) for p in
                               (d / "ranks").glob("rank-*.json")))
    assert 0 < ev["included"] <= 20_000
    shown = ev["ranks"]
    assert shown[:8] == list(range(8)) and len(shown) == 10
    assert set(shown[8:]) <= injected  # the least communication time: stragglers
    a, b = ev["steps"]
    assert b - a + 1 == 4
    assert ev["selection"].startswith(f"window: the {ev['included']} calls of steps {a}-{b}")
    doc = orjson.loads((d / "trace.json").read_bytes())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == ev["included"]
    assert {e["pid"] for e in xs} == set(shown)
    lo, hi = ev["t_window_ns"]
    assert all(lo <= round(e["ts"] * 1e3) < hi for e in xs)
    stepped = [e["args"]["step"] for e in xs if e["args"]["step"] >= 0]
    assert min(stepped) == a and max(stepped) == b
    procs = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert procs == set(shown)


def test_stragglers_in_place_equal_in_memory(job: Path, frame: pd.DataFrame) -> None:
    from profiler.analysis import stragglers_dataset

    want = stragglers(frame)  # every kind, as the report ranks them
    got = stragglers_dataset(job)
    assert list(got.columns) == list(want.columns)
    assert got["rank"].tolist() == want["rank"].tolist()
    assert got["last_count"].tolist() == want["last_count"].tolist()
    for c in ("last_share", "caused_wait_s", "mean_lateness_us"):
        np.testing.assert_allclose(got[c].to_numpy(float), want[c].to_numpy(float),
                                   rtol=1e-9, err_msg=c)
    injected = sorted(load_meta(job)["synthetic"]["stragglers"])
    assert sorted(got["rank"].head(STRAGGLERS)) == injected
    data = stragglers_dataset(job, kinds=["data"], min_spread_ns=1000)
    want = stragglers(frame, kinds=["data"], min_spread_ns=1000)
    assert data["rank"].tolist() == want["rank"].tolist()
    assert data["last_count"].tolist() == want["last_count"].tolist()


def test_load_max_rows_gives_a_bounded_window(job: Path) -> None:
    full_rows = load_meta(job)["dataset"]["rows"]
    df = load(job, columns=SUMMARY_COLUMNS, max_rows=20_000)
    sel = df.attrs["selection"][""]
    assert sel["rows_total"] == full_rows and sel["rows"] == len(df) <= 20_000
    assert sorted(df["rank"].unique().tolist()) == sel["ranks"]
    # beside the first 16: the injected stragglers, found by one pass over every rank
    injected = sorted(load_meta(job)["synthetic"]["stragglers"])
    assert sel["ranks"] == list(range(16)) + injected
    assert [r["rank"] for r in sel["stragglers"][:STRAGGLERS]] == [39, 63, 46]
    assert "the ranks the others wait for most, over every call of the job" in sel["description"]
    lo, hi = sel["t_start_ns"]
    assert df["t_start_ns"].min() >= lo and df["t_start_ns"].max() < hi
    small = load(job, columns=SUMMARY_COLUMNS, max_rows=10**9)
    assert "selection" not in small.attrs and len(small) == full_rows


def test_exact_percentiles_through_sub_buckets(job: Path, frame: pd.DataFrame,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Buckets over the list budget are split before their calls are collected: the
    percentiles stay exact."""
    from profiler.analysis import engine

    monkeypatch.setattr(engine, "LIST_BUDGET", 50)
    for by in (["op", "bucket"], []):
        same_table(summarize_dataset(job, by=by), summarize(frame, by=by), by)


def test_advise_on_a_window_names_the_whole_job(job: Path) -> None:
    """advise over a bounded window: the header counts the job's ranks and says
    how many the window holds; the window itself is a stated limit."""
    from profiler.analysis.findings import advise
    from profiler.cli.advise import header_line

    a = advise(job, max_rows=20_000)
    assert a.header["ranks"] == RANKS and a.header["ranks_analysed"] == 16 + STRAGGLERS
    assert f"{RANKS} rank(s) on " in header_line(a)
    assert f"{16 + STRAGGLERS} of them in the window analysed" in header_line(a)
    (w,) = [f for f in a.findings if f.key == "window"]
    assert w.kind == "limit" and "window" in w.headline + " ".join(w.details)


def test_advise_on_a_window_ranks_stragglers_over_every_call(job: Path) -> None:
    """The late-rank finding of a windowed advise also ranks the whole job out
    of core: the same ranking as engine.stragglers_dataset, the injected
    stragglers first."""
    from profiler.analysis import stragglers_dataset
    from profiler.analysis.findings import advise

    (f,) = [f for f in advise(job, max_rows=20_000).findings if f.key == "late_ranks"]
    whole = f.numbers["whole_job"]
    want = stragglers_dataset(job, kinds=["data"])
    assert whole["rank"] == int(want["rank"].iloc[0]) and whole["ranks"] == RANKS
    injected = set(load_meta(job)["synthetic"]["stragglers"])
    assert set(whole["top"][:STRAGGLERS]) == injected
    assert any("over every matched call of the job (64 ranks" in d for d in f.details)
    # the whole trace loaded: no second ranking
    (g,) = [g for g in advise(job, max_rows=10**9).findings if g.key == "late_ranks"]
    assert "whole_job" not in g.numbers
