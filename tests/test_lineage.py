"""Fusion lineage: Horovod's timeline joined with rank 0's MPI data records.

End to end with real Horovod 0.28.1 at np=2 (tests/hvd_model_job.py: 6
float32 parameter tensors, 484 elements), plus unit tests of the alignment on
the real timeline fixtures with synthetic records.
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import mpirun, requires_mpi

from profiler.analysis import lineage as LQ
from profiler.formats import lineage as LF
from profiler.formats import timeline as T
from profiler.postjob import lineage as L

DATA = Path(__file__).parent / "data"
JOB = Path(__file__).parent / "hvd_model_job.py"
STEPS = 6

try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except Exception:  # pragma: no cover
    HAVE_HOROVOD = False

requires_horovod = pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod not installed")


def run_job(tmp: Path, **env: str) -> tuple[Path, dict[str, Any]]:
    prof = tmp / "prof"
    # Horovod's timeline is opt-in: these tests are about the timeline's join
    full = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof), "STEPS": str(STEPS),
            "HOROVOD_PROFILE_TIMELINE": "1", **env}
    proc = mpirun(2, [sys.executable, str(JOB)], env=full, cwd=tmp, timeout=240)
    info = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    ensure_datasets(prof, 2, proc.stderr)
    return prof, info


def ensure_datasets(prof: Path, np_: int, stderr: str) -> None:
    """If the at-exit conversion failed, build the datasets with `profiler merge`
    (the after-the-fact path) and say so: this file tests what comes after."""
    if all((prof / "ranks" / f"rank-{r:05d}.parquet").is_file() for r in range(np_)):
        return
    from conftest import profiler_cli
    merged = profiler_cli("merge", str(prof), timeout=300)
    assert merged.returncode == 0, merged.stderr
    warnings.warn("at-exit conversion did not write every rank's dataset "
                  f"({stderr.strip().splitlines()[-1:]}); built with `profiler merge`",
                  stacklevel=2)


@pytest.fixture(scope="module")
def unfused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    # Cache off: per-rank readiness in every negotiation; rank 1 late in step 3.
    return run_job(tmp_path_factory.mktemp("lin_unfused"), HOROVOD_FUSION_THRESHOLD="0",
                   HOROVOD_CACHE_CAPACITY="0", SLOW_STEP="3")


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return run_job(tmp_path_factory.mktemp("lin_fused"), HOROVOD_CYCLE_TIME="20",
                   HOROVOD_FUSION_THRESHOLD=str(1 << 20))


def env_recorded(prof: Path) -> bool:
    """Whether a rank's own process recorded its environment (not so when the
    datasets were built after the fact by `profiler merge`)."""
    return any(isinstance(json.loads(p.read_text()).get("env"), dict)
               for p in (prof / "ranks").glob("rank-*.json"))


def lineage_of(prof: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    meta: dict[str, Any] = {}
    path = L.build(prof, metadata=meta)
    assert path == prof / "lineage.parquet", meta
    return LF.load(path), meta["lineage"]


def check_every_parameter_once_per_step(lin: pd.DataFrame, params: dict[str, int]) -> None:
    ar = lin[lin["op"] == "ALLREDUCE"]
    assert ar["matched"].all()
    expected = sorted(f"allreduce.{p}" for p in params)
    # Every step the profiler recorded, plus the first (step -1: opened, not closed).
    assert sorted(ar["step"].unique()) == list(range(-1, STEPS - 1))
    for _step, part in ar.groupby("step"):
        assert sorted(part["tensor"]) == expected
    for name, n in params.items():
        sel = ar[ar["tensor"] == f"allreduce.{name}"]
        assert (sel["tensor_bytes"] == 4 * n).all()


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_unfused_lineage_one_tensor_per_call(unfused: tuple[Path, dict[str, Any]]) -> None:
    prof, info = unfused
    params: dict[str, int] = info["params"]
    assert (prof / "timeline.json").is_file()  # HOROVOD_PROFILE_TIMELINE=1
    lin, meta = lineage_of(prof)
    assert meta["status"] == "ok" and meta["timeline"]["anchor"] is True
    assert meta["fusion_threshold"] == (0 if env_recorded(prof) else None)
    check_every_parameter_once_per_step(lin, params)
    ar = lin[lin["op"] == "ALLREDUCE"]
    assert (ar["n_tensors"] == 1).all() and ar["bytes_agree"].all()
    assert (ar["call_bytes"] == ar["tensor_bytes"]).all()
    assert ar["fill_ratio"].isna().all()  # fusion off: no threshold to fill
    # One call per tensor, each a distinct (comm, seq).
    calls = LQ.calls(lin)
    car = calls[calls["call_op"] == "allreduce"]
    assert len(car) == STEPS * len(params)
    assert car[["call_comm", "call_seq"]].drop_duplicates().shape[0] == len(car)
    # The join agrees with the timeline clock to well under a millisecond.
    fam = meta["timeline"]["families"]["MPI_ALLREDUCE"]
    assert fam["matched"] == fam["instances"] == fam["records"] == STEPS * len(params)
    assert fam["residual_p50_ns"] < 200_000
    # Broadcasts: matched, sized from the call.
    bc = lin[lin["op"] == "BROADCAST"]
    assert len(bc) == len(params) and bc["matched"].all()
    assert sorted(bc["tensor_bytes"].tolist()) == sorted(4 * n for n in params.values())


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_stragglers_from_readiness(unfused: tuple[Path, dict[str, Any]]) -> None:
    prof, info = unfused
    lin, _ = lineage_of(prof)
    ar = lin[lin["op"] == "ALLREDUCE"]
    # Cache off: every negotiation carries both ranks' readiness.
    assert (ar["ready_ranks"] == 2).all()
    st = LQ.stragglers(lin[lin["op"] == "ALLREDUCE"]).set_index("step")
    # Rank 1 slept 50 ms before its backward pass in the 4th iteration (step 2:
    # the first iteration is step -1).
    # (Thresholds leave room for a loaded 2-core machine: rank 0's own
    # backward pass may be descheduled too.)
    assert st.loc[2, "straggler_rank"] == 1
    assert st.loc[2, "wait_ns"] > 25e6
    assert st.loc[2, "wait_ns"] > st.drop(index=2)["wait_ns"].median()
    assert (lin.loc[(lin["step"] == 2) & (lin["op"] == "ALLREDUCE"),
                    "negotiation_ns"] > 25e6).all()


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_fused_lineage(fused: tuple[Path, dict[str, Any]]) -> None:
    prof, info = fused
    params: dict[str, int] = info["params"]
    total = 4 * sum(params.values())
    lin, meta = lineage_of(prof)
    threshold = (1 << 20) if env_recorded(prof) else None
    assert meta["fusion_threshold"] == threshold
    check_every_parameter_once_per_step(lin, params)
    calls = LQ.calls(lin)
    car = calls[calls["call_op"] == "allreduce"]
    # Fused calls: usually one per step carrying every gradient (a Horovod
    # cycle boundary inside a backward pass splits a step in two).
    assert STEPS <= len(car) < STEPS * len(params)
    # Every gradient once per step is checked above, per tensor.  Per call, a
    # split fused batch may have its second call counted in the next step's
    # window under load, so the calls' totals are checked over the run.
    assert int(car["n_tensors"].sum()) == STEPS * len(params)
    assert int(car["call_bytes"].sum()) == STEPS * total
    assert (car["call_bytes"] == car["tensor_bytes"]).all()
    if threshold:
        assert np.allclose(car["fill_ratio"], car["call_bytes"] / threshold)
    else:
        assert car["fill_ratio"].isna().all()
    full = car[car["n_tensors"] == len(params)]
    assert len(full) >= 1
    assert sorted(full["tensors"].iloc[0]) == sorted(f"allreduce.{p}" for p in params)
    ar = lin[lin["op"] == "ALLREDUCE"]
    assert ar["bytes_agree"].all()
    assert (ar["wait_for_data_ns"] == 0).all()  # CPU tensors: no WAIT_FOR_DATA
    assert (ar["negotiation_ns"] >= 0).all()
    # Per-call columns for every rank's rows, keyed by (comm, seq).
    cc = LQ.call_columns(lin)
    df1 = pd.read_parquet(prof / "ranks" / "rank-00001.parquet")
    joined = df1.merge(cc, on=["comm", "seq"], how="inner")
    assert len(joined) == len(calls)
    # rank 1's rows carry the calls' tensors: every gradient once per step,
    # whether a step's batch went in one call or was split by a cycle
    # boundary (as checked for the calls above)
    jar = joined[joined["op"] == "allreduce"]
    assert int(jar["n_tensors"].sum()) == STEPS * len(params)
    assert (jar["n_tensors"] >= 1).all()


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_lineage_without_timeline(fused: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    prof, info = fused
    bare = tmp_path / "bare"
    shutil.copytree(prof / "ranks", bare / "ranks")
    meta: dict[str, Any] = {}
    # The profiler's own records give the lineage without the timeline.
    assert L.build(bare, metadata=meta) == bare / "lineage.parquet"
    assert meta["lineage"]["status"] == "ok" and meta["lineage"]["source"] == "records"
    check_every_parameter_once_per_step(LF.load(bare), info["params"])
    (bare / "lineage.parquet").unlink()
    # The timeline alone: absent, with the reason.
    out = L.build_lineage(bare, sources=("timeline",))
    assert out.path is None and "no Horovod timeline" in out.reason
    assert not (bare / "lineage.parquet").exists()
    # A broken timeline: absent, with the parser's reason.
    (bare / "timeline.json").write_text("{not json")
    out = L.build_lineage(bare, sources=("timeline",))
    assert out.path is None and "unusable" in out.reason
    # ... and beside the records: the records' lineage, the reason kept in the info
    assert L.build(bare, metadata=meta) is not None
    # No rank-0 dataset.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert L.build(empty, metadata=meta) is None
    assert "rank-0" in meta["lineage"]["reason"]


# ---------------------------------------------------------------------------
# Alignment on the real fixture timelines with synthetic rank-0 records
# ---------------------------------------------------------------------------

def synthetic_records(tl: T.Timeline, offset_ns: float, *, drop_first: int = 0,
                      jitter_ns: float = 0.0, extra_every: int = 0) -> pd.DataFrame:
    """Rank-0 data records at the timeline's collective instants shifted by offset."""
    inst = T.fused_ops(tl)
    rng = np.random.default_rng(0)
    rows = []
    seq = 100
    for i, r in inst.iterrows():
        op = {"MPI_ALLREDUCE": "allreduce", "MPI_BCAST": "bcast"}[r["comm_activity"]]
        t = r["t_start_us"] * 1000 + offset_ns + rng.normal(0, jitter_ns)
        nbytes = int(r["tensor_bytes"]) if np.isfinite(r["tensor_bytes"]) else 64
        if extra_every and i % extra_every == 0:  # an unrelated control call
            rows.append({"op": "allreduce", "redop": "band", "dtype": "MPI_LONG_LONG_INT",
                         "t_start_ns": int(t) - 500, "bytes": 8, "seq": seq})
            seq += 1
        rows.append({"op": op, "redop": "sum" if op == "allreduce" else "none",
                     "dtype": "MPI_FLOAT", "t_start_ns": int(t), "bytes": nbytes, "seq": seq})
        seq += 1
    df = pd.DataFrame(rows).iloc[drop_first:].reset_index(drop=True)
    df["t_end_ns"] = df["t_start_ns"] + 1000
    df["dur_ns"] = 1000
    df["backend"] = "mpi"
    df["track"] = 0
    df["thread_kind"] = "horovod"
    df["comm"] = np.uint64(42)
    df["step"] = -1
    df["count"] = df["bytes"] // 4
    df["root"] = -1
    return df


@pytest.mark.parametrize("fixture", ["horovod_timeline_fused.json",
                                     "horovod_timeline_nocache_unfused.json"])
def test_alignment_by_anchor_and_by_order(fixture: str) -> None:
    tl = T.parse(DATA / fixture)
    assert tl.start_epoch_us is not None
    offset = 5_123_456_789.0
    recs = synthetic_records(tl, offset, jitter_ns=300, extra_every=3)
    n_inst = len(T.fused_ops(tl))
    # 1. Anchors: a header whose clocks put the timeline exactly at `offset`.
    header = {"cal0_realtime_ns": tl.start_epoch_us * 1000 - offset + 10**9,
              "cal0_mono_ns": 10**9, "job_t0_ns": 0, "offset_ns": 0}
    lin, info = L.join(tl, recs, header=header, env={"HOROVOD_FUSION_THRESHOLD": "0"})
    assert info["matched_calls"] == n_inst
    assert {f["method"] for f in info["families"].values()} == {"wall-clock anchor"}
    assert abs(info["offset_ns"] - offset) < 2_000
    assert lin["matched"].all()
    # 2. No anchors: call order finds the same pairs.
    lin2, info2 = L.join(tl, recs, header=None)
    assert info2["matched_calls"] == n_inst
    assert {f["method"] for f in info2["families"].values()} == {"call order"}
    assert (lin2["call_seq"].to_numpy() == lin["call_seq"].to_numpy()).all()
    # 3. Anchors off by 1 s (a clock step): order still recovers the join.
    bad = dict(header, cal0_realtime_ns=header["cal0_realtime_ns"] + 10**9)
    _, info3 = L.join(tl, recs, header=bad)
    assert info3["matched_calls"] == n_inst


def test_alignment_when_records_start_later() -> None:
    # The profile began after the first collectives (records missing at the start).
    tl = T.parse(DATA / "horovod_timeline_nocache_unfused.json")
    recs = synthetic_records(tl, 7e9, drop_first=5)
    lin, info = L.join(tl, recs, header=None)
    assert info["matched_calls"] == len(T.fused_ops(tl)) - 5
    assert (~lin["matched"]).sum() == 5
    m = lin[lin["matched"] & (lin["op"] == "ALLREDUCE")]
    assert (m["call_bytes"] == m["tensor_bytes"]).all()


def test_no_data_records_means_nothing_matched() -> None:
    tl = T.parse(DATA / "horovod_timeline_fused.json")
    recs = synthetic_records(tl, 0).iloc[:0]
    lin, info = L.join(tl, recs, header=None)
    assert len(lin) == len(T.tensor_ops(tl)) and not lin["matched"].any()
    assert info["matched_calls"] == 0
    assert LQ.calls(lin).empty
    # readiness comes from the timeline alone: the same stragglers as with every
    # record present (no step records here: step -1; rank 1 was ready last)
    st = LQ.stragglers(lin)
    assert st[["step", "straggler_rank", "tensors"]].to_dict("records") == [
        {"step": -1, "straggler_rank": 1, "tensors": 8}]
    assert (st["wait_ns"] > 0).all()
    full, _ = L.join(tl, synthetic_records(tl, 0), header=None)
    pd.testing.assert_frame_equal(st, LQ.stragglers(full))


def test_fusion_threshold_parsing() -> None:
    assert LF.fusion_threshold(None) is None  # environment not recorded
    assert LF.fusion_threshold({}) == 128 * 1024 * 1024
    assert LF.fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "0"}) == 0
    assert LF.fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "67108864"}) == 64 << 20
    # as Horovod reads it (strtol): no number is 0, fusion off; not the default
    assert LF.fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "lots"}) == 0
    assert LF.fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "64MB"}) == 64
    assert LF.fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "-5"}) == 0


def test_load_errors(tmp_path: Path) -> None:
    from profiler.errors import NotFoundError
    with pytest.raises(NotFoundError):
        LF.load(tmp_path)
    with pytest.raises(NotFoundError):
        LF.load(tmp_path / "trace.json")
    (tmp_path / "lineage.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(NotFoundError, match="cannot read lineage"):
        LF.load(tmp_path)


# ---------------------------------------------------------------------------
# `profiler tensors`
# ---------------------------------------------------------------------------

def tensors_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from profiler.cli import Parser
    from profiler.cli import tensors as cli

    parser = Parser(prog="profiler")
    cli.add_parser(parser.add_subparsers(dest="command", parser_class=Parser))
    args = parser.parse_args(["tensors", *argv])
    capsys.readouterr()
    assert cli.run(args) == 0
    return capsys.readouterr().out


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_tensors_command(fused: tuple[Path, dict[str, Any]], tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    prof, info = fused
    params: dict[str, int] = info["params"]
    # Without lineage.parquet the analysis builds nothing (building it is the
    # post-job stage's, and the error says so); `profiler tensors`, a command
    # that builds, makes it with the post-job stage without writing it, the
    # same table `profiler merge` writes.
    from profiler.analysis import TraceAnalysis
    from profiler.cli import tensors as cli
    from profiler.errors import NotFoundError
    from profiler.postjob.merge import merge

    work = tmp_path / "copy"
    shutil.copytree(prof, work, ignore=shutil.ignore_patterns("lineage.parquet"))
    with pytest.raises(NotFoundError, match="profiler merge"):
        TraceAnalysis.open(work / "trace.json").lineage()
    built = cli.load_lineage(str(work / "trace.json"))
    assert not (work / "lineage.parquet").exists()
    merge(work)
    assert (work / "lineage.parquet").is_file()
    stored = cli.load_lineage(str(work / "trace.json"))
    assert len(built) == len(stored) and list(built.columns) == list(stored.columns)
    rows = json.loads(tensors_cli(capsys, str(work / "trace.json"), "--format", "json"))
    ar = {r["tensor"]: r for r in rows if r["op"] == "ALLREDUCE"}
    assert sorted(ar) == sorted(f"allreduce.{p}" for p in params)
    for name, n in params.items():
        r = ar[f"allreduce.{name}"]
        assert r["calls"] == STEPS and r["calls_matched"] == STEPS
        assert r["bytes"] == 4 * n and r["total_bytes"] == 4 * n * STEPS
        assert 0 < r["fused_with_mean"] <= len(params) - 1
        assert r["negotiation_mean_us"] >= 0 and r["wait_mean_us"] == 0
    bc = [r for r in rows if r["op"] == "BROADCAST"]
    assert len(bc) == len(params) and all(r["fused_with_mean"] == 0 for r in bc)
    # Sorting, filtering, table and csv.
    top = json.loads(tensors_cli(capsys, str(work), "--format", "json", "--op", "allreduce",
                                 "--sort", "bytes", "--top", "2"))
    biggest = sorted(params.values(), reverse=True)[:2]
    assert [r["bytes"] for r in top] == [4 * n for n in biggest]
    text = tensors_cli(capsys, str(work / "trace.json"))
    assert "allreduce.0.weight" in text and "fused with" in text
    csv = tensors_cli(capsys, str(work), "--format", "csv")
    assert csv.splitlines()[0].startswith("tensor,op,calls,bytes")
    assert len(csv.splitlines()) == 1 + 2 * len(params)


def test_tensors_command_bad_input(tmp_path: Path) -> None:
    from profiler.cli import tensors as cli
    from profiler.errors import NotFoundError, UsageError

    with pytest.raises(NotFoundError):
        cli.load_lineage(str(tmp_path / "missing.json"))
    empty = tmp_path / "prof"
    empty.mkdir()
    with pytest.raises(NotFoundError, match="no fusion lineage"):
        cli.load_lineage(str(empty))
    bad = tmp_path / "trace.json"
    bad.write_text("[1, 2]")
    with pytest.raises(Exception) as exc:
        cli.load_lineage(str(bad))
    assert "profiler" in type(exc.value).__module__
    args = type("A", (), {"trace": str(empty), "top": 0})()
    with pytest.raises(UsageError):
        cli.run(args)  # type: ignore[arg-type]


def test_tensors_cli_one_line_errors(tmp_path: Path) -> None:
    from conftest import profiler_cli

    from profiler.cli import COMMANDS
    assert COMMANDS["tensors"] == "profiler.cli.tensors"
    proc = profiler_cli("tensors", str(tmp_path / "nope.json"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("profiler: error: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_user_timeline_is_respected(tmp_path: Path) -> None:
    """HOROVOD_TIMELINE set by the user: the hooks leave it alone, lineage finds it."""
    mine = tmp_path / "my_timeline.json"
    prof, info = run_job(tmp_path, HOROVOD_TIMELINE=str(mine), HOROVOD_CYCLE_TIME="20")
    assert mine.is_file() and not (prof / "timeline.json").exists()
    meta: dict[str, Any] = {}
    path = L.build(prof, metadata=meta)
    assert path is not None, meta
    if not env_recorded(prof):  # datasets rebuilt after the fact: no env, no user path
        assert meta["lineage"]["source"] == "records"
        return
    assert meta["lineage"]["source"] == "records+timeline"
    assert meta["lineage"]["timeline"]["timeline_file"] == str(mine)
    check_every_parameter_once_per_step(LF.load(path), info["params"])


def test_alignment_takes_the_nearest_record() -> None:
    # An extra same-size data record 1 ms before the first allreduce (e.g. a
    # call the timeline did not see): the anchor match must not take it.
    tl = T.parse(DATA / "horovod_timeline_fused.json")
    offset = 3e9
    recs = synthetic_records(tl, offset)
    first = recs[recs["op"] == "allreduce"].iloc[0]
    extra = first.copy()
    extra["t_start_ns"] = first["t_start_ns"] - 1_000_000
    extra["seq"] = 99
    recs = pd.concat([recs, extra.to_frame().T.astype(recs.dtypes.to_dict())],
                     ignore_index=True).sort_values("t_start_ns").reset_index(drop=True)
    assert tl.start_epoch_us is not None
    header = {"cal0_realtime_ns": tl.start_epoch_us * 1000 - offset + 10**9,
              "cal0_mono_ns": 10**9, "job_t0_ns": 0, "offset_ns": 0}
    lin, info = L.join(tl, recs, header=header)
    assert info["matched_calls"] == len(T.fused_ops(tl))
    assert 99 not in set(lin["call_seq"])
    assert lin["matched"].all()
