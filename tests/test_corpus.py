"""The corpus of real models and Horovod features, profiled end to end at
np=2 (issue 25; benchmarks/corpus.py does the runs and the checks).

Per workload, three runs: profiled at Horovod's defaults with its timeline
beside (the lineage's oracle), profiled with fusion off (the twin for
`profiler compare`), not profiled.  Asserted: data calls and bytes per step
of every Horovod operation from the model's own parameter list (bytes exact,
calls exact with fusion off), a lineage covering every tensor (certain or
ambiguous) that the timeline never contradicts, every command exiting 0
without a traceback, the same losses in the three runs.

The fast workloads run by default (about 25-40 s each on 2 cores, a third
of it each mpirun's start-up): the Horovod operations beyond a plain
optimizer (`ops`: grouped allreduce, uneven allgather, alltoall,
reducescatter) and an embedding's sparse gradient (`lstm-sparse`: two
allgathers beside ten allreduces).  The others (fp16 compression,
ResNet-50, a 12-layer encoder, the dense and sparse_as_dense LSTM,
accumulation, process sets, join, Adasum) run with HVPROF_CORPUS=all or
`python benchmarks/corpus.py` (docs/validation.md: the figures); the suite's time on 2
cores keeps them out of the default run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import FULL, ROOT, requires_mpi

sys.path.insert(0, str(ROOT / "benchmarks"))
import corpus as C  # noqa: E402

try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except Exception:  # pragma: no cover
    HAVE_HOROVOD = False

FAST = ["ops", "lstm-sparse"]
SLOW = [w for w in C.RUNS if w not in FAST]
ALL = os.environ.get("HVPROF_CORPUS") == "all"
#: in the full tier (HVPROF_FULL=1): "ops" runs the same collectives' path
FULL_TIER = {"lstm-sparse"}


@pytest.mark.parametrize("workload", FAST + SLOW)
@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.timeout(1800)
@requires_mpi
@pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod not installed")
def test_workload_end_to_end(workload: str, tmp_path: Path) -> None:
    if workload in SLOW and not ALL:
        pytest.skip("slow: HVPROF_CORPUS=all, or python benchmarks/corpus.py")
    if workload in FULL_TIER and not (ALL or FULL):
        pytest.skip("full tier: HVPROF_FULL=1 bash scripts/test.sh")
    r = C.check(workload, tmp_path / workload)
    assert C.problems(r) == [], C.problems(r)
    print("\n  " + C.line(r))
    lin = r["lineage"]["fused"]
    # every gradient of the model's own parameter list is in the lineage
    assert lin["status"] == "ok"
    dense = {f"allreduce.{n}" for n, _, _ in r["params"]
             if not (workload == "lstm-sparse" and n == "embed.weight")}
    assert dense <= set(lin["names"]), sorted(dense - set(lin["names"]))[:5]
    if workload == "fp16":  # bytes on the wire halve: 2 per element
        assert r["expected"]["allreduce"]["bytes"] == 2 * r["parameters"]
    if workload == "lstm-sparse":  # the embedding's gradient by allgather, the rest dense
        assert r["expected"]["allreduce"]["tensors"] == r["tensors"] - 1
        assert r["unfused"]["allgather"]["calls_per_step"] == 2.0
    if workload == "ops":
        assert set(r["fused"]) == {"grouped_allreduce", "allgather", "alltoall",
                                   "reducescatter"}
        assert r["unfused"]["grouped_allreduce"]["calls_per_step"] == 3.0


def test_busy_loop_spins_the_time_asked() -> None:
    """The workloads' --busy-us (job_rate.py --busy): the main thread's work
    before each optimizer step lasts at least what was asked, not much more."""
    import time

    from profiler.workloads import corpus

    assert corpus.parse_args(["mlp6", "--busy-us", "30"]).busy_us == 30.0
    assert corpus.parse_args(["mlp6"]).busy_us == 0.0
    took = []
    for _ in range(20):
        t0 = time.perf_counter_ns()
        corpus._busy(200)
        took.append(time.perf_counter_ns() - t0)
    assert min(took) >= 200_000
    assert sorted(took)[len(took) // 2] < 2_000_000  # a median under 10x: it stops


def test_loop_clock_splits_each_timed_step_in_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """RESULT's timing (job_rate.py's phases): the steps from WARM_STEPS on,
    each split at the optimizer's step; wall and CPU apart."""
    from profiler.workloads import corpus

    now = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(corpus.time, "perf_counter", lambda: now["wall"])
    monkeypatch.setattr(corpus.time, "thread_time", lambda: now["cpu"])
    clock = corpus._LoopClock()
    steps = corpus.WARM_STEPS + 5
    for step in range(steps):
        clock.tick(step)
        now["wall"] += 1.0 + step  # the backward passes
        now["cpu"] += 0.5
        clock.phase(step)
        now["wall"] += 10.0  # the optimizer's step
        now["cpu"] += 0.25
    clock.tick(steps)
    t = clock.result()
    timed = range(corpus.WARM_STEPS, steps)
    assert t["steps"] == 5 and t["first_step"] == corpus.WARM_STEPS
    assert t["compute_s"] == sum(1.0 + s for s in timed)
    assert t["step_s"] == 50.0 and t["compute_cpu_s"] == 2.5 and t["step_cpu_s"] == 1.25
    assert t["compute_s"] + t["step_s"] == t["wall_s"]
    # quantiles over the timed steps only: compute 11-15 s, the step 10 s each
    assert t["compute_us_q"] == [11e6, 13e6, 15e6, 15e6]
    assert t["step_us_q"] == [10e6] * 4
    assert t["slow_share"] == 0.0  # 21-25 s steps: none reaches 1.5 x 21 s
    assert corpus._slow_share([1.0, 1.0, 1.0, 2.0]) == 0.25
    # most steps slow (the median one too): still counted against the fast ones
    assert corpus._slow_share([1.0] * 3 + [2.1] * 7) == 0.7
    assert corpus._slow_share([]) is None


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod not installed")
def test_within_run_switch_turns_every_part_off_and_back(tmp_path: Path) -> None:
    """benchmarks/overhead/ab_corpus.py's in-job switch: in its "off" blocks
    no MPI call or step is recorded (rank 0's raw records, against the
    profiler's clock read as each block began and ended); in the warm-up
    and the "on" blocks every tensor of every step is."""
    import json

    import pandas as pd
    from conftest import PYTHON, mpirun

    from profiler.formats import record as F
    from profiler.formats.raw import read_raw

    prof = tmp_path / "prof"
    warm, block, groups = 10, 20, 2
    p = mpirun(2, [PYTHON, str(ROOT / "benchmarks" / "overhead" / "ab_corpus.py"), "--inner",
                   "--workload", "mlp6", "--block", str(block), "--groups", str(groups),
                   "--warm", str(warm), "--arms", "off,on", "--seed", "5"],
               cwd=tmp_path, timeout=300,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    ab = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("AB "))[3:])
    assert ab["order"] == ["off", "on", "off", "on"]  # seed 5
    assert len(ab["wall_s"]) == len(ab["cpu_s"]) == len(ab["ticks"]) == 2 * groups
    df = pd.concat([pd.read_parquet(f) for f in sorted((prof / "ranks").glob("*.parquet"))])
    for r in (0, 1):
        ops = df.loc[df["rank"] == r, "op"].astype(str)
        # mlp6: 12 gradients a step, hooked in the warm-up and the on blocks
        # only, and its 12 parameters broadcast at the start
        assert int((ops == "tensor").sum()) == 12 * (warm + groups * block) + 12
    recs = read_raw(prof / "raw" / "rank-00000.hvprof").records
    kind = [F.op_backend(int(o)) for o in recs["op"]]
    mpi = recs["t_start"][[k == "mpi" for k in kind]]
    steps = recs["t_start"][recs["op"] == F.OP_APP_STEP]
    for arm, (begin, end) in zip(ab["order"], ab["ticks"]):
        n_mpi = int(((mpi >= begin) & (mpi <= end)).sum())
        n_steps = int(((steps >= begin) & (steps <= end)).sum())
        if arm == "off":
            assert n_mpi == 0 and n_steps == 0, (n_mpi, n_steps)
        else:  # each step's allreduces at least once (fused), every step but one
            assert n_mpi >= block and n_steps >= block - 1, (n_mpi, n_steps)
