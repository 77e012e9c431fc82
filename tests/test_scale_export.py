"""`profiler export`: a window of ranks and steps (and ops, kinds, times) of a generated
16-rank dataset; exactly the asked rows, a Perfetto-loadable trace, read back by
load() and summarize (from the dataset, or from its own events when the dataset
is out of reach), one-line errors for bad input."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import orjson
import pandas as pd
import pytest
from conftest import ROOT, profiler_cli

from profiler.analysis import load, load_meta, summarize
from profiler.synth import SynthConfig, synthesize

SOURCE = ROOT / "tests" / "data" / "analysis" / "fused" / "trace.json"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("export") / "job16"
    synthesize(SOURCE, d, SynthConfig(ranks=16, calls_per_rank=1500, stragglers=1, seed=2))
    return d


def window_of(df: pd.DataFrame, ranks: list[int], steps: tuple[int, int]) -> pd.DataFrame:
    keep = df["rank"].isin(ranks) & (df["step"] >= steps[0]) & (df["step"] <= steps[1])
    return df.loc[keep].reset_index(drop=True)


def export(job: Path, out: Path, *args: str) -> dict:
    p = profiler_cli("export", str(job), "-o", str(out), *args, cwd=out.parent)
    assert p.returncode == 0, p.stderr
    assert p.stderr.startswith(f"profiler: window written to {out}")
    return load_meta(out)


def test_export_selects_exactly_the_ranks_and_steps(job: Path, tmp_path: Path) -> None:
    full = load(job)
    ranks, steps = [0, 1, 2, 3, 4, 5, 6, 7], (10, 20)
    want = window_of(full, ranks, steps)
    assert len(want) > 8 * 11  # every asked rank has calls in every asked step
    out = tmp_path / "window.json"
    meta = export(job, out, "--ranks", "0-7", "--steps", "10-20")
    assert meta["window"]["ranks"] == ranks and meta["window"]["steps"] == [10, 20]
    assert meta["window"]["calls"] == len(want)
    assert meta["events"]["included"] == len(want) == meta["events"]["total"]
    assert meta["events"]["selection"] == "export: ranks 0-7, steps 10-20"
    assert meta["world_size"] == 16  # the job's metadata travels with the window
    doc = json.loads(out.read_text())  # plain JSON, the Chrome trace object form
    assert doc["displayTimeUnit"] == "ns"
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(want)
    assert {e["pid"] for e in xs} == set(ranks)
    assert {e["args"]["step"] for e in xs} == set(range(10, 21))
    names = {e["pid"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == set(ranks)
    # per rank and op, the same calls as the in-memory selection
    got = pd.DataFrame({"rank": [e["pid"] for e in xs], "op": [e["name"] for e in xs],
                        "seq": [e["args"]["seq"] for e in xs]})
    key = ["rank", "op", "seq"]
    assert (got.sort_values(key).values.tolist()
            == want.assign(op=want["op"].astype(str))[key].sort_values(key).values.tolist())


def test_export_loads_back(job: Path, tmp_path: Path) -> None:
    full = load(job)
    want = window_of(full, [3, 9, 15], (4, 6))
    assert len(want) > 0
    out = tmp_path / "sub" / "w.json"
    out.parent.mkdir()
    export(job, out, "--ranks", "3,9,15", "--steps", "4-6")
    back = load(out)  # from the dataset, with the window's filters: every column
    assert len(back) == len(want) and list(back.columns) == list(full.columns)
    key = ["rank", "t_start_ns", "seq"]
    pd.testing.assert_frame_equal(back.sort_values(key).reset_index(drop=True)
                                  .astype({c: str for c in ("op", "kind", "backend")}),
                                  want.sort_values(key).reset_index(drop=True)
                                  .astype({c: str for c in ("op", "kind", "backend")}),
                                  check_categorical=False)
    # summarize of the window == summarize of the selection in memory
    p = profiler_cli("summarize", str(out), "--format", "json", "--by", "rank,op",
                     cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = orjson.loads(p.stdout)
    s = summarize(want, by=["rank", "op"])
    assert [(r["rank"], r["op"], r["calls"]) for r in rows] == \
        [(int(a), str(b), int(c)) for a, b, c in s[["rank", "op", "calls"]].values]
    # away from the dataset: the window's own events, no warning
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(out, alone / "w.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ev = load(alone / "w.json")
    assert len(ev) == len(want)
    assert sorted(ev["rank"].unique().tolist()) == [3, 9, 15]
    assert ev["dur_ns"].sum() == pytest.approx(want["dur_ns"].sum(), rel=1e-6)


def test_export_ops_kinds_and_time(job: Path, tmp_path: Path) -> None:
    full = load(job)
    t0 = int(full["t_start_ns"].quantile(0.4))
    t1 = int(full["t_start_ns"].quantile(0.5))
    lo_ms, hi_ms = t0 / 1e6, t1 / 1e6
    out = tmp_path / "ops.json"
    meta = export(job, out, "--ops", "allreduce,bcast", "--kinds", "control",
                  "--time-ms", f"{lo_ms}:{hi_ms}")
    lo, hi = meta["window"]["t_start_ns"]
    want = full.loc[full["op"].astype(str).isin(["allreduce", "bcast"])
                    & (full["kind"].astype(str) == "control")
                    & (full["t_start_ns"] >= lo) & (full["t_start_ns"] < hi)]
    assert 0 < meta["events"]["included"] == len(want)
    assert len(load(out)) == len(want)


def test_export_bad_input(job: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "w.json")
    for args, fragment in [
        (["--ranks", "x"], "--ranks"),
        (["--ranks", "5-2"], "bad range"),
        (["--steps", "1-2-3"], "--steps"),
        (["--time-ms", "5:1"], "--time-ms"),
        (["--ranks", "100-101"], "none of the asked ranks"),
        (["--limit", "10"], "over the limit of 10"),
    ]:
        p = profiler_cli("export", str(job), "-o", out, *args, cwd=tmp_path)
        assert p.returncode == 2, (args, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("profiler: error:"), p.stderr
        assert fragment in lines[0], lines[0]
    (tmp_path / "empty" / "raw").mkdir(parents=True)
    p = profiler_cli("export", str(tmp_path / "empty"), "-o", out, cwd=tmp_path)
    assert p.returncode == 2 and "no parquet dataset" in p.stderr
    p = profiler_cli("export", str(job), "-o", str(tmp_path / "w.txt"), cwd=tmp_path)
    assert p.returncode == 2 and "*.json" in p.stderr


def test_compare_bounded_by_max_rows(job: Path, tmp_path: Path) -> None:
    """compare loads a window of big traces (--max-rows) and says so; --ranks and
    --steps are pushed down."""
    p = profiler_cli("compare", str(job), str(job), "--labels", "a,b", "--max-rows", "8000",
                     cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "compared on a window of" in p.stdout and "--max-rows" in p.stdout
    q = profiler_cli("compare", str(job), str(job), "--labels", "a,b", "--ranks", "0-3",
                     "--steps", "5-30", "--format", "json", cwd=tmp_path)
    assert q.returncode == 0, q.stderr
    rows = orjson.loads(q.stdout)
    steps = [r for r in rows if r["metric"] == "step_ms"]
    assert steps and all(r["diff"] == pytest.approx(0.0) for r in steps)
    assert "window" not in q.stderr
    bad = profiler_cli("compare", str(job), str(job), "--ranks", "x", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("profiler: error: --ranks")
