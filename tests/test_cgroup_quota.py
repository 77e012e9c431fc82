"""CPU limits in the operating system's terms (hooks/cpu_cgroup.c,
profiler.formats.cpu, analysis.findings.contention: cpu_quota, cpuset):
the sidecar's cgroup block on synthetic documents, and real cgroups (cgroup
v1's cpu and cpuset controllers, as root; benchmarks/scenarios/cgroups.py
makes them and removes them, also after a failure): a 2-rank job whose rank 1
runs under a CPU quota is named with the quota and the time throttled per
step, and its twin without the quota claims none; a rank whose cpuset holds
one CPU for its three busy threads is named as such, its twin not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import PYTHON, mpirun, requires_mpi

from profiler.analysis.findings import advise
from profiler.analysis.findings.contention import cgroup_steps
from profiler.formats.cpu import _cgroup, cpu_list

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "scenario_cgroups", ROOT / "benchmarks" / "scenarios" / "cgroups.py")
assert _spec is not None and _spec.loader is not None
cgroups = importlib.util.module_from_spec(_spec)
sys.modules["scenario_cgroups"] = cgroups
_spec.loader.exec_module(cgroups)

JOB = ROOT / "benchmarks" / "scenarios" / "job.py"

#: 20 ms of CPU a step on the main thread, then an allreduce: under a quota of
#: 0.2 CPU (20 ms every 100 ms) the rank can run one step a period at most
BUSY = """
import time
import numpy as np
from mpi4py import MPI
import profiler

comm = MPI.COMM_WORLD
x = np.ones(1 << 14, dtype=np.float32)
for i in range(30):
    profiler.step()
    t = time.thread_time()
    while time.thread_time() - t < 0.02:
        pass
    comm.Allreduce(MPI.IN_PLACE, x)
"""


def test_cgroup_block_and_its_steps() -> None:
    """The sidecar's cgroup block: quota over period, the cpuset's CPUs, the
    marks' running totals as per-step figures (a gap spread over the steps it
    covers); no quota: None; a malformed list: None."""
    header = {"ticks_per_ns": 1.0, "cal0_ticks": 0, "cal0_mono_ns": 0, "offset_ns": 0,
              "job_t0_ns": 0}
    cg = _cgroup({"version": 1, "path": "/a/b", "limit_path": "/a", "quota_us": 25000,
                  "period_us": 100000, "cpuset": "0-2,5", "reason": "",
                  "start": {"nr_periods": 1, "nr_throttled": 0, "throttled_ns": 0, "ticks": 5},
                  "end": None,
                  "steps": [[3, 10, 10, 2, 4_000_000], [4, 20, 12, 4, 10_000_000],
                            [8, 30, 20, 12, 26_000_000], [9, "x", 1, 1, 1]]}, header)
    assert cg is not None
    assert cg["quota_cpus"] == 0.25 and cg["limit_path"] == "/a"
    assert cg["cpuset_cpus"] == [0, 1, 2, 5]
    assert cg["end"] is None and cg["start"]["nr_periods"] == 1
    assert [m[0] for m in cg["steps"]] == [3, 4, 8]  # the malformed mark left out
    t = cgroup_steps(cg)
    assert t.index.tolist() == [4, 5, 6, 7, 8]
    assert t.loc[4].tolist() == [6.0, 2.0, 2.0]
    assert t.loc[6].tolist() == [4.0, 2.0, 2.0]  # 16 ms, 8 throttled, 8 periods over 4 steps
    none = _cgroup({"version": 1, "path": "/", "quota_us": -1, "period_us": -1,
                    "cpuset": "", "steps": []}, header)
    assert none is not None and none["quota_cpus"] is None and none["cpuset_cpus"] is None
    assert _cgroup("x", header) is None
    assert cpu_list("0-3,8") == [0, 1, 2, 3, 8] and cpu_list("3-1") is None
    assert cpu_list("a") is None


def _findings(prof: Path) -> dict[str, Any]:
    a = advise(prof / "trace.json")
    return {f.key: f for f in a.findings}


def _quota_ok() -> None:
    ok, why = cgroups.available("quota")
    if not ok:
        pytest.skip(why)


@requires_mpi
@pytest.mark.mpi
def test_a_quota_is_named_with_the_quota_and_the_twin_claims_none(tmp_path: Path) -> None:
    """Rank 1 under a 0.2-CPU quota: its sidecar names the cgroup and the
    quota and counts throttled periods at the steps; cpu_quota is significant,
    names rank 1 with 0.2 CPU and the time throttled per step, and is priced;
    cpu_contention says it left that wait out.  The twin without the quota:
    no quota in the sidecar, no cpu_quota finding."""
    _quota_ok()
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_CPU": "1"}
    with cgroups.quota_cgroup(0.2) as cg:
        prof = tmp_path / "quota"
        mpirun(2, cg.wrap([PYTHON, "-c", BUSY], rank=1), cwd=tmp_path, timeout=240,
               env={**env, "HOROVOD_PROFILE_DIR": str(prof)})
        name = "/" + cg.path.name
    assert not cg.path.exists()  # removed
    twin = tmp_path / "twin"
    mpirun(2, [PYTHON, "-c", BUSY], cwd=tmp_path, timeout=240,
           env={**env, "HOROVOD_PROFILE_DIR": str(twin)})

    import orjson

    meta = orjson.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    blocks = {r["rank"]: r["cpu"]["cgroup"] for r in meta["ranks"]}
    assert blocks[1]["path"] == name and blocks[1]["limit_path"] == name
    assert blocks[1]["quota_us"] == 20000 and blocks[1]["period_us"] == 100000
    assert blocks[1]["end"]["nr_throttled"] > blocks[1]["start"]["nr_throttled"]
    assert len(blocks[1]["steps"]) >= 25  # every step read (HOROVOD_PROFILE_CPU=1)
    assert blocks[0]["quota_us"] is None and blocks[0]["steps"] == []

    f = _findings(prof)
    q = f["cpu_quota"]
    assert q.significant, (q.headline, q.details, q.cost_interval_ms)
    assert q.numbers["ranks"] == [1] and q.numbers["quota_cpus"] == pytest.approx(0.2)
    assert q.headline.startswith("Rank 1 is throttled by its cgroup's CPU quota, 0.2 CPU "
                                 f"(20 ms every 100 ms, {name}")
    assert q.numbers["throttled_ms_per_step"] > 10.0
    assert q.cost_ms is not None and q.cost_ms > 10.0 and q.part == "compute"
    if "cpu_contention" in f and f["cpu_contention"].cost_ms:
        assert any("(cpu_quota), left out here" in d for d in f["cpu_contention"].details)
    late = f.get("late_ranks")
    if late is not None and late.significant and late.numbers.get("rank") == 1:
        assert "cost_with_cpu_quota_ms" in late.numbers

    t = orjson.loads((twin / "trace.json").read_bytes())["horovod_profiler"]
    assert all(r["cpu"]["cgroup"]["quota_us"] is None for r in t["ranks"])
    assert "cpu_quota" not in _findings(twin)


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
def test_a_narrow_cpuset_is_named_and_the_twin_claims_none(tmp_path: Path) -> None:
    """Rank 1 of a Horovod job (the compute thread and Horovod's background
    thread busy, 3 intra-op threads) in a cpuset of one CPU: cpuset names rank
    1, its cgroup, its CPU and its busy threads.  The twin on every CPU: no
    cpuset finding."""
    pytest.importorskip("horovod.torch")
    ok, why = cgroups.available("cpuset")
    if not ok:
        pytest.skip(why)
    job = [PYTHON, str(JOB), "--model", "wide", "--steps", "14", "--threads", "3"]
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_CPU": "1",
           "HOROVOD_PROFILE_BATCH_SIZE": "64"}
    with cgroups.cpuset_cgroup("0") as cg:
        prof = tmp_path / "cpuset"
        mpirun(2, cg.wrap(job, rank=1), cwd=tmp_path, timeout=300,
               env={**env, "HOROVOD_PROFILE_DIR": str(prof)})
        name = "/" + cg.path.name
    twin = tmp_path / "twin"
    mpirun(2, job, cwd=tmp_path, timeout=300, env={**env, "HOROVOD_PROFILE_DIR": str(twin)})
    f = _findings(prof)
    c = f["cpuset"]
    assert c.numbers["ranks"] == [1] and c.numbers["cpusets"] == {1: "0"}
    assert c.numbers["busy_threads"][1] >= 2
    assert c.headline.startswith("Rank 1's cpuset holds fewer CPUs than its busy threads: "
                                 "1 CPU (0) for ")
    assert f"cgroup {name} allows CPU 0 (1 of the host's" in c.details[0]
    assert c.significant, (c.details, c.cost_interval_ms)
    assert "cpuset" not in _findings(twin)


def test_quota_steps_frame_is_empty_without_marks() -> None:
    assert cgroup_steps({"steps": []}).empty
    assert isinstance(cgroup_steps({"steps": [[1, 0, 1, 1, 1]]}), pd.DataFrame)
