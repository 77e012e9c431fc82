"""Uneven data with hvd.join (issue 25): the time a rank waits in hvd.join is
recorded ("join" rows, APP_JOIN) and shown as such (findings.join,
``uneven_data``), not as a late rank in the steps the ranks share.

Real Horovod at np=2 (the corpus ``join`` workload: the last rank has
``--extra`` more batches, every rank calls hvd.join after its last): one
uneven run and one even control (``--extra 0``), one mpirun each.  Then the
finding and the breakdown on synthetic jobs whose times are known.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import PYTHON, base_env, mpirun, profiler_cli, requires_mpi
from test_breakdown import MS, horovod_job

from profiler.analysis.breakdown import last_ranks, rank_breakdown
from profiler.analysis.facade import trace_meta
from profiler.analysis.findings import advise, advise_frame
from profiler.analysis.findings.base import Context
from profiler.analysis.findings.join import join_rows
from profiler.analysis.load import load
from profiler.units import fmt_ms

try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except Exception:  # pragma: no cover
    HAVE_HOROVOD = False

STEPS, EXTRA = 12, 10  # optimizer steps of rank 0; rank 1's more
HOROVOD_JOB = [requires_mpi, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.timeout(300),
               pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod not installed")]


def horovod_job_test(fn: Any) -> Any:
    """The marks of a test that runs the real job (mpirun, Horovod)."""
    for mark in HOROVOD_JOB:
        fn = mark(fn)
    return fn


def _run(tmp: Path, extra: int) -> tuple[Path, dict[str, Any]]:
    prof = tmp / "prof"
    proc = mpirun(2, [PYTHON, "-m", "profiler.workloads.corpus", "join", "--steps", str(STEPS),
                      "--extra", str(extra)],
                  env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)}, cwd=tmp,
                  timeout=240)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return prof / "trace.json", json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return _run(tmp_path_factory.mktemp("uneven"), EXTRA)


@pytest.fixture(scope="module")
def even(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return _run(tmp_path_factory.mktemp("even"), 0)


def _uneven_findings(trace: Path) -> list[Any]:
    return [f for f in advise(trace).findings if f.key == "uneven_data"]


@horovod_job_test
def test_join_recorded_once_per_rank(uneven: tuple[Path, dict[str, Any]]) -> None:
    trace, res = uneven
    assert res["expected"]["join"]["last_rank"] == 1  # what hvd.join returned
    df = load(trace)
    j = df.loc[df["op"].astype(str) == "join"]
    # once on each rank, an app row with no step, in trace.json and in each parquet
    assert sorted(j["rank"].tolist()) == [0, 1]
    assert (j["backend"].astype(str) == "app").all() and (j["kind"].astype(str) == "app").all()
    assert (j["count"] == 1).all() and (j["step"] == -1).all()
    for r in (0, 1):
        p = pd.read_parquet(trace.parent / "ranks" / f"rank-{r:05d}.parquet")
        assert (p["op"].astype(str) == "join").sum() == 1
    st = df.loc[df["op"].astype(str) == "step"]
    n = st.groupby("rank").size()
    assert n[1] - n[0] == EXTRA  # the hook's step records: one fewer than optimizer steps
    # seq: the step records written before join
    assert j.set_index("rank")["seq"].to_dict() == {0: n[0], 1: n[1]}
    # rank 0 waits in join while rank 1 runs its extra steps
    r0 = j.loc[j["rank"] == 0].iloc[0]
    solo = st.loc[(st["rank"] == 1) & (st["step"] >= n[0])]
    assert len(solo) == EXTRA
    t0, t1 = int(solo["t_start_ns"].min()), int(solo["t_end_ns"].max())
    inside = min(t1, int(r0["t_end_ns"])) - max(t0, int(r0["t_start_ns"]))
    assert inside >= 0.8 * (t1 - t0), (inside, t1 - t0)
    r1 = j.loc[j["rank"] == 1].iloc[0]
    assert r1["dur_ns"] < 0.5 * r0["dur_ns"]  # the last rank waits for no one



@horovod_job_test
def test_uneven_data_named_not_a_late_rank(uneven: tuple[Path, dict[str, Any]]) -> None:
    trace, _ = uneven
    (f,) = _uneven_findings(trace)
    assert f.significant, f.headline
    assert f.numbers["last_rank"] == 1 and f.numbers["waiting_ranks"] == [0]
    assert f.numbers["waits"][0]["extra_steps"] == EXTRA
    assert f.headline.startswith("Uneven data: rank 0 waited ")
    assert f"for rank 1's {EXTRA} extra steps" in f.headline
    assert f.cost_ms is not None and f.cost_ms > 0 and f.recommendation
    # the late-rank test and the waiting between ranks: only the steps both ran
    ctx = Context(df=load(trace), meta=trace_meta(trace) or {})
    st = ctx.rank_steps
    shared = set(st.loc[st["rank"] == 0, "step"]) & set(st.loc[st["rank"] == 1, "step"])
    lr = last_ranks(ctx.breakdown)
    assert len(lr) and set(lr["step"]) <= shared
    # rank 1's steps alone: nobody waits in them, and their synchronize is split
    solo = ctx.breakdown.loc[~ctx.breakdown["step"].isin(shared)]
    assert len(solo) >= EXTRA - 1 and (solo["rank"] == 1).all()
    assert (solo["wait_ranks_ms"] == 0).all()
    assert solo["unexplained_ms"].sum() < 0.5 * (solo["wall_ms"] - solo["compute_ms"]).sum()
    # what a user sees
    out = profiler_cli("advise", str(trace))
    assert out.returncode == 0, out.stderr
    assert "Uneven data: rank 0 waited" in out.stdout
    assert "try: balance the data" in out.stdout


@horovod_job_test
def test_even_join_claims_nothing(even: tuple[Path, dict[str, Any]]) -> None:
    trace, res = even
    df = load(trace)
    j = df.loc[df["op"].astype(str) == "join"]
    assert sorted(j["rank"].tolist()) == [0, 1]  # both joined, after the same steps
    assert res["expected"]["join"]["last_rank"] in (0, 1)
    found = _uneven_findings(trace)
    assert all(not f.significant for f in found), [f.headline for f in found]
    out = profiler_cli("advise", "--format", "json", str(trace))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert not [f for f in doc["findings"] if f["key"] == "uneven_data" and f["significant"]]


def test_join_hook_passes_result_and_errors_through() -> None:
    """The wrapper returns join's value and raises its exception unchanged (no
    library loaded here: nothing is recorded); install() after `import
    horovod.torch` wraps both bindings of hvd.join, uninstall() restores them."""
    from profiler.collect.steps import wrap_join

    w = wrap_join(lambda device=-1: 7 + device)
    assert w() == 6 and w(device=3) == 10
    # TensorFlow's: only eager calls are timed; a traced one passes through too
    assert wrap_join(lambda: 5, when=lambda: False)() == 5

    def boom(device: int = -1) -> int:
        raise RuntimeError("join failed")

    with pytest.raises(RuntimeError, match="join failed"):
        wrap_join(boom)()
    script = (
        "import horovod.torch as hvd, horovod.torch.mpi_ops as m\n"
        "from profiler.collect import horovod_hooks as hh\n"
        "orig = m.join\n"
        "hh.install()\n"
        "assert m.join is hvd.join and m.join.__hvprof_wrapped__ is orig\n"
        "hh.install()\n"
        "assert m.join.__hvprof_wrapped__ is orig  # once\n"
        "hh.uninstall()\n"
        "assert m.join is orig and hvd.join is orig\n"
        "print('OK')\n")
    env = base_env()
    env.pop("HOROVOD_PROFILE", None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-3000:]


# ---------------------------------------------------------------------------
# synthetic jobs: 2 ranks share `shared` steps; rank 1 then runs `extra` alone
# ---------------------------------------------------------------------------

def join_job(shared: int, extra: int, *, late_join_ms: float = 0.0,
             own_ms: float = 0.5) -> pd.DataFrame:
    """horovod_job's 2-rank steps (rank 1 10 ms after rank 0), then `extra`
    steps of rank 1 alone (rank 0's Horovod thread adds zeros to their
    allreduce); each rank enters hvd.join 0.1 ms after its last step (rank 1
    `late_join_ms` later), and both leave it `own_ms` after rank 1 entered."""
    df, _ = horovod_job([[50.0, 60.0]] * shared)
    end = df.loc[df["op"] == "step"].groupby("rank")["t_end_ns"].max()
    parts = [df]
    last_end = int(end[1])
    if extra:
        solo, _ = horovod_job([[50.0]] * extra)
        mpi = solo["backend"] == "mpi"
        solo["t_start_ns"] += int(end[1])
        solo["t_end_ns"] += int(end[1])
        solo.loc[mpi, "seq"] += 2 * shared
        solo.loc[solo["op"].isin(["step", "sync"]), "seq"] += shared
        solo.loc[solo["step"] >= 0, "step"] += shared
        zeros = solo.loc[mpi].assign(rank=0)
        parts += [solo.assign(rank=1), zeros]
        last_end = int(solo["t_end_ns"].max())
    j1 = last_end + int(0.1 * MS) + int(late_join_ms * MS)
    out = j1 + int(own_ms * MS)
    joins = pd.DataFrame([
        {"rank": 0, "t_start_ns": int(end[0]) + int(0.1 * MS), "seq": shared},
        {"rank": 1, "t_start_ns": j1, "seq": shared + extra}]).assign(
        t_end_ns=out, op="join", backend="app", kind="app", count=1, step=-1, bytes=0,
        comm=0, comm_size=-1, thread_kind="main", tid=100, device=False, flags=0)
    joins["dur_ns"] = joins["t_end_ns"] - joins["t_start_ns"]
    return (pd.concat([*parts, joins], ignore_index=True)
            .sort_values(["rank", "t_start_ns"], kind="stable").reset_index(drop=True))


def _finding(df: pd.DataFrame) -> Any:
    found = [f for f in advise_frame(df).findings if f.key == "uneven_data"]
    assert len(found) == 1, [f.headline for f in found]
    return found[0]


def test_finding_on_known_times() -> None:
    df = join_job(8, 5)
    j = join_rows(df).set_index("rank")
    assert j.loc[1, "wait_ms"] == pytest.approx(0.5)
    f = _finding(df)
    assert f.significant and f.numbers["waiting_ranks"] == [0]
    (w,) = f.numbers["waits"]
    assert w["extra_steps"] == 5 and w["covered_steps"] == 5
    # rank 0 waits from 0.1 ms after its last step to 0.5 ms after rank 1 joined
    # (0.1 ms after its last step): rank 1's five steps and 0.5 ms
    solo = df.loc[(df["op"] == "step") & (df["rank"] == 1) & (df["step"] >= 8)]
    span = (solo["t_end_ns"].max() - solo["t_start_ns"].min()) / 1e6
    assert w["wait_ms"] == pytest.approx(span + 0.5)
    assert w["covered_ms"] == pytest.approx(span - 0.1)
    assert f.headline.startswith(f"Uneven data: rank 0 waited {fmt_ms(w['wait_ms'])} in hvd.join")
    assert "for rank 1's 5 extra steps" in f.headline
    # cost: the idle time beyond the join's own, over 2 ranks and the steady steps
    steps = advise_frame(df).header["steps"]
    assert f.cost_ms == pytest.approx((w["wait_ms"] - 0.5) / 2 / steps)


def test_breakdown_leaves_the_solo_steps_out_of_the_waiting() -> None:
    df = join_job(8, 5)
    bd = rank_breakdown(df)
    lr = last_ranks(bd)
    assert sorted(lr["step"]) == list(range(8)) and (lr["last_rank"] == 1).all()
    solo = bd.loc[bd["step"] >= 8]
    assert len(solo) == 5 and (solo["rank"] == 1).all()
    # nobody to wait for; the synchronize is split like any other step's
    assert (solo["wait_ranks_ms"] == 0).all()
    assert solo["transfer_ms"].to_numpy() == pytest.approx(np.full(5, 3.0))
    assert solo["unexplained_ms"].to_numpy() == pytest.approx(np.zeros(5), abs=1e-9)
    shared = bd.loc[bd["step"] < 8]
    assert shared.loc[shared["rank"] == 0, "wait_ranks_ms"].to_numpy() == pytest.approx(
        np.full(8, 9.5))


@pytest.mark.parametrize("late_ms", [0.0, 0.3])
def test_ranks_joining_together_are_not_claimed(late_ms: float) -> None:
    f = _finding(join_job(8, 0, late_join_ms=late_ms))
    assert not f.significant and not f.numbers["waiting_ranks"]
    assert f.headline.startswith("Ranks joined together")


def test_a_late_join_after_no_extra_step_is_not_claimed() -> None:
    # rank 1 works 40 ms after its last step before joining: a wait, no extra batch
    f = _finding(join_job(8, 0, late_join_ms=40.0))
    assert not f.significant and f.not_claimed.startswith("rank 1 ran no step more")


def test_no_join_no_finding() -> None:
    df, _ = horovod_job([[50.0, 60.0]] * 8)
    assert not [f for f in advise_frame(df).findings if f.key == "uneven_data"]
