"""The diagnosis scenarios' fast subset (benchmarks/scenarios/suite.py): real
2-rank Horovod jobs with one known cause, or none, and what `profiler advise`
must conclude.  The whole suite, with three runs of each scenario and the
costs against their truths, is a benchmark (docs/validation.md, "Diagnoses
against known causes")."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import textwrap
import time
import warnings
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "scenario_suite", ROOT / "benchmarks" / "scenarios" / "suite.py")
assert _spec is not None and _spec.loader is not None
suite = importlib.util.module_from_spec(_spec)
sys.modules["scenario_suite"] = suite
_spec.loader.exec_module(suite)

pytestmark = [pytest.mark.mpi, pytest.mark.horovod]


@pytest.fixture(scope="module", autouse=True)
def _horovod() -> None:
    pytest.importorskip("horovod.torch")


#: The scenarios' jobs take 5-20 s here.  One that runs past this limit is
#: reported as a warning with the profiler's own hang diagnosis (its watchdog's
#: snapshot, `profiler hang`) and run once more: the suite judges diagnoses,
#: and a job hung in the MPI library's forced algorithm (the cliff's 64-byte
#: segments: thousands of messages per call) is no diagnosis to judge.  Twice
#: is a failure.
suite.JOB_TIMEOUT_S = 90.0


def _run(name: str, tmp_path: Path) -> object:
    try:
        r = suite.evaluate(suite.BY_NAME[name], 1, tmp_path, twin=False)
    except suite.JobHung as e:
        warnings.warn(f"{name}: {e}", stacklevel=1)
        r = suite.evaluate(suite.BY_NAME[name], 2, tmp_path, twin=False)
    print(name, r.first, r.cost_ms, r.truth_ms, r.false, r.job, r.findings)
    return r


def test_the_jobs_own_clocks_decide_lateness_and_contention() -> None:
    def job(arrivals: list[list[int]], rq: float, others: float) -> dict:
        return {"ranks": [{"rank": i, "outside_ms": 10.0, "run_queue_ms": rq,
                           "arrivals_ns": a,
                           "other_threads": [{"name": "t", "wait_share": others}]}
                          for i, a in enumerate(arrivals)]}

    steps = range(40)
    t = suite.job_truths(job([[10 * s for s in steps], [10 * s + 1 for s in steps]],
                             0.1, 0.0))
    assert t["late_rank"] == 1 and not t["contended"]  # 1% of the time waiting
    alternate = [[10 * s + s % 2 for s in steps], [10 * s + 1 - s % 2 for s in steps]]
    t = suite.job_truths(job(alternate, 0.1, 0.04))
    assert t["late_rank"] is None and t["contended"]  # a busy thread waited 4%
    assert t["contended_share"] == pytest.approx(0.04)


def test_the_jobs_own_step_clock_decides_whether_steps_wait_whole_cycles() -> None:
    rng = __import__("random").Random(4)
    # half the steps a whole 1 ms cycle above the fast ones, as Horovod's cycle
    # splits them; then one spread of the same width: no second peak
    split = [3.0 + rng.uniform(-0.1, 0.1) + (1.0 if i % 2 else 0.0) for i in range(60)]
    spread = [3.0 + rng.uniform(0.0, 1.2) for _ in range(60)]
    for iters, cycles in ((split, True), (spread, False)):
        t = suite.job_truths({"ranks": [{"rank": 0, "iter_ms": [50.0, 9.0, *iters]},
                                        {"rank": 1, "iter_ms": [50.0, 9.0, *iters]}]})
        assert t["cycles"] is cycles, t
    # at a 2 ms cycle the same split is half a cycle: the trough, not the peak
    t = suite.job_truths({"ranks": [{"rank": 0, "iter_ms": [50.0, 9.0, *split]}]}, 2.0)
    assert t["cycles"] is False


def test_a_cause_with_no_measurable_effect_is_a_null_left_out_of_recall() -> None:
    m, (lo, hi) = suite._paired([10.0, 12.0, 11.0], [10.5, 11.0, 11.5])
    assert m == pytest.approx(0.0) and lo < 0 < hi
    m, (lo, hi) = suite._paired([20.0, 21.0, 22.5], [10.0, 10.5, 11.0])
    assert m == pytest.approx(32 / 3) and 0 < lo < m < hi
    R = suite.Result
    found = R("late", 1, "late_ranks", "late_ranks", 20.0, 20.0, [], 1, 1, 0.0, True)
    absent = R("fusion-off", 1, "fusion", "cpu_contention", 5.0, 1.0, [], 1, 1, 0.0, True,
               truth_interval=(-3.0, 5.0), no_effect=True)
    out = suite.table([found, absent])
    assert "recall: 1/1 " in out and "left out of recall: 1 runs" in out
    assert "fusion (no effect)" in out and "1.00 [-3.0, 5.0]" in out


def test_clean_job_blames_nothing(tmp_path: Path) -> None:
    r = _run("clean", tmp_path)
    # nothing is claimed that the job's own measurements do not bear out, and no
    # rank, size or setting is named unless the job's clocks single it out
    assert r.ok and r.false == [], (r.findings, r.job)
    assert r.sum_error < 0.02  # the breakdown adds up to the job's own step time


def test_symmetric_jitter_is_waiting_that_blames_no_rank(tmp_path: Path) -> None:
    r = _run("jitter", tmp_path)
    assert r.false == [], (r.findings, r.job)
    if r.job["late_rank"] is not None:
        # the machine made one rank last more often than chance in this run, by
        # the job's own clocks: naming it is true (false == [] checked the rank)
        assert r.first in ("late_ranks", "rank_waiting"), (r.findings, r.job)
        return
    assert r.first == "rank_waiting", (r.findings, r.job)
    # uniform(0, 60 ms) per rank: 10 ms of waiting per rank on average; the
    # machine's own variation only adds to it
    assert 0.75 * r.truth_ms <= r.cost_ms <= 1.6 * r.truth_ms


def _late_by(r: object) -> object:
    return next(f["late_by"] for f in r.findings if f["key"] == "late_ranks")  # type: ignore[attr-defined]


def test_a_late_rank_is_named_with_the_waiting_it_causes(tmp_path: Path) -> None:
    """Rank 1 sleeps 40 ms a step: named, priced, and its lateness is time
    blocked (neither on a CPU nor waiting for one), not work or contention."""
    r = _run("late", tmp_path)
    assert r.first == "late_ranks" and r.false == [], (r.findings, r.job)
    assert r.job["late_rank"] == 1
    assert r.cost_ms == pytest.approx(r.truth_ms, rel=suite.TOLERANCE)
    assert r.sum_error < 0.02
    assert _late_by(r) == "blocked", r.findings


def test_a_late_rank_that_computes_more_is_told_from_one_that_sleeps(tmp_path: Path) -> None:
    """The same job, rank 1 busy for 40 ms of its own CPU time a step instead
    of asleep: the late rank is named as before, and its lateness is more CPU
    time for the step (more work or a slower core), not time blocked."""
    base = suite.BY_NAME["late"]
    sc = dataclasses.replace(base, name="late-spin", job=[*base.job, "--late-kind", "spin"])
    r = suite.evaluate(sc, 1, tmp_path, twin=False)
    print(r.first, r.job, r.findings)
    assert r.first == "late_ranks" and r.job["late_rank"] == 1, (r.findings, r.job)
    assert _late_by(r) == "run", r.findings


def test_a_cliff_made_by_the_mpi_library_is_confirmed_by_replay(tmp_path: Path) -> None:
    r = _run("cliff", tmp_path)
    assert r.false == [], (r.findings, r.job)
    keys = [f["key"] for f in r.findings if f["significant"]]
    assert "latency_cliffs" in keys, (r.findings, r.job)
    # first, but for CPU contention where the job's own clocks show it: a cause
    # of its own in this job, ranked by cost beside the cliff (the cliff costs
    # 2-15 ms a step from run to run here, the contention 2-3.5 ms)
    ahead = set(keys[:keys.index("latency_cliffs")])
    assert ahead <= ({"cpu_contention"} if r.job["contended"] else set()), (r.findings, r.job)
    # its twin without the rules file: the sizes may look slow in the run, the
    # replay dismisses them, and nothing names a size
    t = _run("cliff-twin", tmp_path)
    assert not any(f["key"] == "latency_cliffs" and f["significant"] for f in t.findings)


def test_a_job_past_its_limit_is_stopped_whole_and_reported(tmp_path: Path) -> None:
    # a "job" that starts a child in a session of its own (as Open MPI's ranks
    # have process groups of their own) and never ends: after the limit both
    # are gone (no process left on a core for the tests after it)
    pid_file = tmp_path / "child.pid"
    job = [sys.executable, "-c",
           "import subprocess, sys, time\n"
           "c = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
           f"open({str(pid_file)!r}, 'w').write(str(c.pid))\n"
           "print('started', flush=True)\n"
           "time.sleep(60)\n"]
    with pytest.raises(suite.JobHung, match=r"ran past 2 s[\s\S]*started"):
        suite._mpirun_bounded(job, dict(os.environ), 2.0, None, grace=1.0)
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break  # killed, not yet reaped by its new parent
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the job's child {child} outlived the job's limit")


@pytest.mark.full  # the single-host limit test and test_watch_jobs' two hosts cover it
def test_a_multihost_job_past_its_limit_is_diagnosed(tmp_path: Path, monkeypatch) -> None:
    # the same limit on the simulated cluster (2 hosts): the job is stopped,
    # no rank is left in the hosts, and the error carries the watchdog's
    # diagnosis of the cause (rank 1 never enters the last allreduce)
    from simcluster_fixture import cluster_available

    ok, why = cluster_available()
    if not ok:
        pytest.skip(f"simulated cluster unavailable: {why}")
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import time
        import numpy as np
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        buf, out = np.ones(4), np.empty(4)
        for i in range(3):
            if comm.Get_rank() == 1 and i == 2:
                break
            comm.Allreduce(buf, out)
        print("entered", flush=True)
        time.sleep(600)
    """))
    monkeypatch.setattr(suite, "JOB", job)
    sc = dataclasses.replace(suite.BY_NAME["late"], name="hung", hosts=2, np=2, job=[],
                             env={}, pin=None, competitors=0, host_rates=None)
    prof = tmp_path / "prof"
    t0 = time.monotonic()
    with pytest.raises(suite.JobHung) as e:
        suite.run_job(sc, prof, timeout=20.0)  # the watchdog's snapshot comes at 10 s
    msg = str(e.value)
    assert time.monotonic() - t0 < 60, msg
    assert "ran past 20 s" in msg and "entered" in msg, msg
    assert f"profiler hang {prof}" in msg and "NEVER entered by rank(s) 1" in msg, msg
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"])
            if str(job) in " ".join(p.info["cmdline"] or [])]
    assert left == [], left
