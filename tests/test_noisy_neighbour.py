"""A noisy neighbour: a process outside the job busy on the job's CPUs.

The library reads the host at MPI_Init and MPI_Finalize (hooks/cpu.c: each
CPU's busy, idle and steal ticks from /proc/stat, each thread's last CPU, the
processes of /proc with their CPU time), the merge turns every rank's
readings into one view per host (profiler.formats.cpu.host_view: trace.json's
``cpu_hosts``), and analysis.findings.contention names the CPU, its ranks and
the foreign processes (finding ``noisy_neighbour``); the late-rank finding
names the neighbour when the late rank's CPU has one.

Unit tests use hand-written sidecar blocks; the job tests run a 2-rank mpi4py
job under real mpirun, each rank bound to a CPU of its own, once with a busy
loop bound to rank 1's CPU and once without.  Each side of the job gets its
own autogroup at nice -15 (when allowed), so that other sessions' processes on
this shared machine take a few percent of the job's CPUs, not a third.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import PYTHON, mpirun, requires_mpi

from profiler.formats import cpu as cpu_format

TICK = 10_000_000  # ns per clock tick at clk_tck 100


# ---------------------------------------------------------------------------
# the host view: hand-written rank blocks
# ---------------------------------------------------------------------------
def _thread(tid: int, kind: str, cpu_ns: int, last_cpu: int) -> dict[str, Any]:
    return {"tid": tid, "name": "python", "kind": kind,
            "start": {"cpu_ns": 0, "wait_ns": 0, "last_cpu": last_cpu},
            "end": {"cpu_ns": cpu_ns, "wait_ns": 0, "last_cpu": last_cpu}}


def _reading(t_ns: int, cpus: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """cpus: cpu -> (busy, idle) ticks."""
    return {"t_ns": t_ns, "scan_ns": 2_000_000, "procs_seen": 9, "procs_unreadable": 0,
            "procs_omitted": 0,
            "cpus": [{"cpu": c, "busy": b, "idle": i, "steal": 0} for c, (b, i) in cpus.items()]}


def _proc(pid: int, ppid: int, name: str, cpu: int, start: int | None, end: int | None,
          own: bool = False) -> dict[str, Any]:
    return {"pid": pid, "ppid": ppid, "name": name, "cpu": cpu, "start": start, "end": end,
            "own": own}


def _rank(rank: int, pid: int, cpu: int, main_ns: int, procs: list[dict[str, Any]],
          end_busy: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """A rank bound to `cpu`, its main thread main_ns on it; a 1 s window
    (100 ticks per CPU) read by this rank."""
    return {"rank": rank, "host": "h", "pid": pid, "cpu": {
        "affinity": [cpu], "clk_tck": 100,
        "threads": [_thread(pid, "main", main_ns, cpu), _thread(pid + 1, "helper", 0, cpu)],
        "host": {"reason": "", "start": _reading(0, {0: (0, 0), 1: (0, 0)}),
                 "end": _reading(1_000_000_000, end_busy), "procs": procs}}}


def _two_ranks(busy_ticks: int = 50, busy_cpu: int = 1) -> list[dict[str, Any]]:
    """Rank 0 (pid 100) on CPU 0 and rank 1 (pid 200) on CPU 1, launched by
    mpirun (pid 50); each main thread runs 0.5 s of the 1 s window; rank 0
    forked a loader child (pid 300, 0.2 s on CPU 0); "stress" (pid 400)
    busy_ticks on busy_cpu; sshd (pid 500) idle."""
    procs = [_proc(100, 50, "python", 0, 5, 55, own=True), _proc(200, 50, "python", 1, 5, 55),
             _proc(50, 40, "mpirun", 0, 1, 2), _proc(300, 100, "loader", 0, 0, 20),
             _proc(400, 1, "stress", busy_cpu, 1000, 1000 + busy_ticks),
             _proc(500, 1, "sshd", 0, 7, 7)]
    cpu0 = 50 + 20 + 1 + (busy_ticks if busy_cpu == 0 else 0)
    cpu1 = 50 + (busy_ticks if busy_cpu == 1 else 0)
    end = {0: (cpu0, 100 - cpu0), 1: (cpu1, 100 - cpu1)}
    return [_rank(0, 100, 0, 500_000_000, procs, end),
            _rank(1, 200, 1, 500_000_000, procs, end)]


def test_host_view_splits_each_cpu_into_the_job_and_the_others() -> None:
    (h,) = cpu_format.host_view(_two_ranks())
    assert h["reason"] == "" and h["window_ns"] == 1_000_000_000 and h["clk_tck"] == 100
    by = {c["cpu"]: c for c in h["cpus"]}
    assert by[0]["ranks"] == [0] and by[1]["ranks"] == [1]
    # CPU 0: the rank (0.5 s), its child (0.2 s) and the launcher (0.01 s) are the job's
    assert by[0]["busy_share"] == pytest.approx(0.71)
    assert by[0]["foreign_share"] == pytest.approx(0.0, abs=1e-9)
    # CPU 1: rank 1's 0.5 s, and 0.5 s of "stress"
    assert by[1]["busy_share"] == pytest.approx(1.0)
    assert by[1]["job_share"] == pytest.approx(0.5)
    assert by[1]["foreign_share"] == pytest.approx(0.5)
    assert set(h["job_pids"]) == {50, 100, 200, 300}
    (f,) = [p for p in h["foreign"] if p["cpu_ns"] > 0]
    assert (f["pid"], f["name"], f["cpu"], f["share"]) == (400, "stress", 1, pytest.approx(0.5))
    assert {p["pid"] for p in h["foreign"]}.isdisjoint(h["job_pids"])


@pytest.mark.parametrize("same_kernel", [True, False])
def test_ranks_named_as_other_hosts_on_this_kernel_are_the_job(same_kernel: bool) -> None:
    """Rank 1 named as host "h1", on the kernel of rank 0's "h0" (the same
    boot id: simulated hosts, containers on one node): h0's view sees its
    process on CPU 1 and counts it as the job, with its launcher.  On
    another kernel, a process with its pid on h0 is another process: a
    neighbour."""
    ranks = _two_ranks(busy_ticks=0)
    ranks[0]["host"], ranks[1]["host"] = "h0", "h1"
    ranks[0]["cpu"]["affinity"] = [0, 1]  # unbound: CPU 1 is its too
    for r, boot in zip(ranks, ("b0", "b0" if same_kernel else "b1"), strict=True):
        r["cpu"]["host"]["boot_id"] = boot
    ranks[0]["cpu"]["host"]["procs"] = [p for p in ranks[0]["cpu"]["host"]["procs"]
                                        if p["pid"] != 50]  # rank 1's launcher: another
    ranks[0]["cpu"]["host"]["procs"].append(_proc(60, 1, "orted", 1, 0, 3))
    ranks[0]["cpu"]["host"]["procs"][1]["ppid"] = 60
    h0 = next(h for h in cpu_format.host_view(ranks) if h["host"] == "h0")
    foreign = {p["pid"] for p in h0["foreign"] if p["cpu_ns"] > 0}
    cpu1 = next(c for c in h0["cpus"] if c["cpu"] == 1)
    if same_kernel:  # and its CPU time is the job's
        assert {200, 60} <= set(h0["job_pids"]) and foreign == set()
        assert cpu1["foreign_share"] == pytest.approx(0.0, abs=1e-9)
    else:
        assert 200 not in h0["job_pids"] and foreign == {200, 60}
        assert cpu1["foreign_share"] == pytest.approx(0.5)


def test_host_view_without_end_readings_says_why() -> None:
    ranks = _two_ranks()
    for r in ranks:
        r["cpu"]["host"]["end"] = None
    (h,) = cpu_format.host_view(ranks)
    assert h["cpus"] == [] and h["foreign"] == [] and "at the end" in h["reason"]


def test_a_process_new_since_start_counts_whole_unless_the_start_scan_was_cut() -> None:
    ranks = _two_ranks(busy_ticks=0)
    for r in ranks:
        r["cpu"]["host"]["procs"].append(_proc(600, 1, "late", 1, None, 30))
    (h,) = cpu_format.host_view(ranks)
    assert [(p["pid"], p["cpu_ns"]) for p in h["foreign"]] == [(600, 30 * TICK)]
    for r in ranks:
        r["cpu"]["host"]["start"]["procs_omitted"] = 3  # its start may have been missed
    (h,) = cpu_format.host_view(ranks)
    assert h["foreign"] == []


def test_rank_doc_reads_the_host_and_trace_block_drops_its_lists(tmp_path: Path) -> None:
    import orjson

    raw = tmp_path / "raw"
    raw.mkdir()
    doc = {"version": 1, "state": "finalize", "pid": 100, "schedstat": True, "reason": "",
           "host_cpus": 2, "affinity": [0], "clk_tck": 100, "threads": [
               {"tid": 100, "name": "python",
                "start": {"cpu_ns": 1, "wait_ns": 0, "slices": 1, "nvcsw": 0, "nivcsw": 0,
                          "ticks": 5, "last_cpu": 0},
                "end": {"cpu_ns": 9, "wait_ns": 0, "slices": 2, "nvcsw": 0, "nivcsw": 0,
                        "ticks": 9, "last_cpu": -1}}],
           "host": {"reason": "", "procs_kept": 512,
                    "start": {"ticks": 5, "scan_ns": 1500000, "procs_seen": 3,
                              "procs_unreadable": 0, "procs_omitted": 0,
                              "cpus": [[0, 10, 90, 0], [1, 5, 95, 0], [2, -1, 0, 0]]},
                    "end": None,
                    "procs": [{"pid": 100, "ppid": 50, "name": "python", "cpu": 0,
                               "start": 3, "end": None, "own": True}, {"pid": "x"}]}}
    (raw / "rank-00000.cpu.json").write_bytes(orjson.dumps(doc))
    (raw / "rank-00000.hvprof").write_bytes(b"")
    header = {"pid": 100, "ticks_per_ns": 1.0, "offset_ns": 0, "job_t0_ns": 0}
    c = cpu_format.rank_doc(raw / "rank-00000.hvprof", header, [])
    assert c is not None and c["clk_tck"] == 100
    assert c["threads"][0]["start"]["last_cpu"] == 0
    assert c["threads"][0]["end"]["last_cpu"] is None
    host = c["host"]
    assert host["end"] is None and host["start"]["scan_ns"] == 1_500_000
    assert [x["cpu"] for x in host["start"]["cpus"]] == [0, 1]  # the malformed line left out
    assert host["procs"] == [_proc(100, 50, "python", 0, 3, None, own=True)]
    t = cpu_format.trace_block(c)
    assert t is not None and "cpus" not in t["host"]["start"] and "procs" not in t["host"]
    assert t["host"]["start"]["scan_ns"] == 1_500_000 and c["host"]["procs"]  # not mutated


# ---------------------------------------------------------------------------
# the finding, on hand-written metadata and CPU rows
# ---------------------------------------------------------------------------
def _meta(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    trace_ranks = [{"rank": r["rank"], "host": "h", "pid": r["pid"],
                    "cpu": cpu_format.trace_block(r["cpu"])} for r in ranks]
    return {"hosts": ["h"], "ranks": trace_ranks, "cpu_hosts": cpu_format.host_view(ranks)}


def _frame(steps: int = 8, wait_ms: dict[int, float] | None = None) -> pd.DataFrame:
    """Two ranks, 20 ms steps, each with its main thread's "cpu" row: wait_ms
    per rank of run-queue wait in each step (the rest on a CPU), and a step row."""
    wait_ms = wait_ms or {0: 0.1, 1: 8.0}
    rows = []
    for s in range(steps):
        t0 = s * 20_000_000
        for r in (0, 1):
            w = int((wait_ms[r] + (0.3 if s % 2 else 0.0)) * 1e6)
            rows.append({"rank": r, "backend": "app", "op": "step", "seq": s, "step": s,
                         "t_start_ns": t0, "t_end_ns": t0 + 20_000_000, "dur_ns": 20_000_000,
                         "bytes": 0, "count": 32, "thread_kind": "main", "tid": 100 * (r + 1)})
            rows.append({"rank": r, "backend": "app", "op": "cpu", "seq": s, "step": s,
                         "t_start_ns": t0, "t_end_ns": t0 + 20_000_000, "dur_ns": 20_000_000,
                         "bytes": 20_000_000 - w, "count": w, "thread_kind": "main",
                         "tid": 100 * (r + 1)})
    df = pd.DataFrame(rows)
    for c in ("op", "backend", "thread_kind"):
        df[c] = df[c].astype("category")
    return df


def _findings(df: pd.DataFrame, meta: dict[str, Any], key: str) -> list[Any]:
    from profiler.analysis.findings import advise_frame

    return [f for f in advise_frame(df, meta, only=["cpu_contention", "noisy_neighbour"]).findings
            if f.key == key]


def test_the_neighbour_is_named_with_its_cpu_rank_and_cost() -> None:
    from profiler.analysis.findings import contention

    meta = _meta(_two_ranks())
    (f,) = _findings(_frame(), meta, "noisy_neighbour")
    assert f.headline.startswith("CPU 1, where rank 1 runs, was busy 50% of the time with "
                                 "processes outside the job (pid 400 (stress) 50%)"), f.headline
    assert f.numbers["cpus"] == [1] and f.numbers["ranks"] == [1]
    assert f.numbers["processes"][0]["pid"] == 400
    # the rule: rank 1's wait x F / (busy less its main thread's run) = x 1.0, at most
    # the step's interval x 50%; averaged over the 2 ranks
    att, _ = contention.neighbour_wait(contention.Context(df=_frame(), meta=meta))
    assert att[0].eq(0).all()
    waited = [8.0 + (0.3 if s % 2 else 0.0) for s in att.index]  # the steady steps'
    assert att[1].tolist() == pytest.approx(waited, abs=1e-6)
    assert f.cost_ms == pytest.approx(sum(waited) / len(waited) / 2, abs=1e-6)
    assert f.significant and "pid 400 (stress)" in f.recommendation
    assert "rank 1 to free cores" in f.recommendation
    # cpu_contention keeps the job's own part, not the neighbour's
    (c,) = _findings(_frame(), meta, "cpu_contention")
    assert c.numbers["main_wait_ms_per_step"] < 0.2
    assert any("noisy_neighbour" in d for d in c.details)


def test_silent_on_free_cpus_and_on_the_job_crowding_itself() -> None:
    assert _findings(_frame(), _meta(_two_ranks(busy_ticks=0)), "noisy_neighbour") == []
    # two ranks on one CPU, both busy: the job's own contention, no neighbour
    procs = [_proc(100, 50, "python", 0, 0, 50, own=True), _proc(200, 50, "python", 0, 0, 50)]
    end = {0: (100, 0), 1: (0, 100)}
    ranks = [_rank(0, 100, 0, 500_000_000, procs, end), _rank(1, 200, 0, 500_000_000, procs, end)]
    meta = _meta(ranks)
    assert meta["cpu_hosts"][0]["cpus"][0]["foreign_share"] == pytest.approx(0.0, abs=1e-9)
    df = _frame(wait_ms={0: 9.0, 1: 9.0})
    assert _findings(df, meta, "noisy_neighbour") == []
    (c,) = _findings(df, meta, "cpu_contention")
    assert c.numbers["main_wait_ms_per_step"] > 9.0  # all of it the job's own
    # no metadata at all (a profile from before): silent
    assert _findings(_frame(), {}, "noisy_neighbour") == []
    # a neighbour that takes only the time rank 1 leaves idle: it hardly waits
    busy_but_harmless = _frame(wait_ms={0: 0.1, 1: 0.2})
    assert _findings(busy_but_harmless, _meta(_two_ranks()), "noisy_neighbour") == []


def test_without_cpu_rows_the_sidecar_weighs_the_wait_and_no_cost_is_claimed() -> None:
    ranks = _two_ranks()
    no_rows = _frame().loc[lambda d: d["op"] == "step"]
    assert _findings(no_rows, _meta(ranks), "noisy_neighbour") == []  # no wait in the sidecar
    ranks[1]["cpu"]["threads"][0]["end"]["wait_ns"] = 400_000_000  # 44% of its time
    (f,) = _findings(no_rows, _meta(ranks), "noisy_neighbour")
    assert f.cost_ms is None and not f.significant and f.numbers["ranks"] == [1]
    assert f.numbers["wait_share"] == pytest.approx(0.4 / 0.9)


def test_the_late_rank_names_its_neighbour() -> None:
    from profiler.analysis.findings import late_ranks
    from profiler.analysis.findings.base import Finding

    meta = _meta(_two_ranks())
    f = Finding(key="late_ranks", headline="Rank 1 arrives last", numbers={"rank": 1},
                recommendation="find what rank 1 does differently")
    late_ranks._name_the_neighbour(late_ranks.Context(df=_frame(), meta=meta), f)
    assert any("pid 400 (stress)" in d and "CPU 1, where rank 1 runs" in d for d in f.details)
    assert f.recommendation.startswith("move pid 400 (stress) off CPU 1")
    assert f.recommendation.endswith("find what rank 1 does differently")
    f0 = Finding(key="late_ranks", headline="Rank 0 arrives last", numbers={"rank": 0},
                 recommendation="x")
    late_ranks._name_the_neighbour(late_ranks.Context(df=_frame(), meta=meta), f0)
    assert f0.details == [] and f0.recommendation == "x"  # its CPU is free


# ---------------------------------------------------------------------------
# real jobs: two ranks bound a CPU each, a busy loop on rank 1's or none
# ---------------------------------------------------------------------------
JOB = """
import os
import numpy as np          # before MPI_Init: the run's window is the job's work
import profiler
from mpi4py import MPI

comm = MPI.COMM_WORLD
buf = np.ones(1024)
comm.Barrier()
for step in range(int(os.environ["STEPS"])):
    profiler.step()
    x = 0
    for k in range(200_000):  # the same work on each rank: a shared CPU makes it longer
        x += k
    comm.Allreduce(MPI.IN_PLACE, buf)
profiler.step()
"""

BUSY = """
import ctypes, os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
try:
    with open("/proc/self/autogroup", "w") as f:  # its session's group: as the job's
        f.write("-15")
except OSError:
    pass
ctypes.CDLL(None).prctl(15, b"nn-busyloop", 0, 0, 0)  # PR_SET_NAME: its comm
open(sys.argv[2], "w").close()
while True:
    pass
"""


def _cpus() -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("setsid") is None or shutil.which("taskset") is None:
        pytest.skip("needs 2 CPUs, setsid and taskset")
    return cpus[-2:]


def _run(tmp: Path, busy_cpu: int | None) -> tuple[Path, int | None]:
    """The job, rank r bound to the r-th of _cpus(), each rank in a session of
    its own at autogroup nice -15 (setsid -w keeps mpirun's child waiting);
    with a busy loop bound to busy_cpu for the whole run.  The profile and
    the loop's pid."""
    cpus = _cpus()
    prof = tmp / ("prof-busy" if busy_cpu is not None else "prof-clean")
    (tmp / "job.py").write_text(JOB)
    busy = None
    if busy_cpu is not None:
        ready = tmp / "busy-ready"
        busy = subprocess.Popen([PYTHON, "-c", BUSY, str(busy_cpu), str(ready)],
                                start_new_session=True)
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    rank_cmd = ("echo -15 > /proc/self/autogroup 2>/dev/null; "
                f"exec taskset -c $(( OMPI_COMM_WORLD_RANK ? {cpus[1]} : {cpus[0]} )) "
                f"{PYTHON} job.py")
    try:
        mpirun(2, ["--bind-to", "none", "setsid", "-w", "sh", "-c", rank_cmd], cwd=tmp,
               timeout=120, env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                                 "STEPS": "40"})
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    return prof, busy.pid if busy is not None else None


def _advise(prof: Path) -> Any:
    from profiler.analysis.findings import advise

    return advise(str(prof))


def _hosts(prof: Path) -> list[dict[str, Any]]:
    from profiler.formats.tracejson import read_trace_meta

    return read_trace_meta(prof / "trace.json")["cpu_hosts"]


@requires_mpi
@pytest.mark.mpi
def test_a_busy_loop_on_rank_1s_cpu_is_named(tmp_path: Path) -> None:
    cpus = _cpus()
    prof, pid = _run(tmp_path, cpus[1])
    advice = _advise(prof)
    found = [f for f in advice.findings if f.key == "noisy_neighbour"]
    print("\n".join(f"{f.headline}\n  " + "\n  ".join(f.details) + f"\n  try: {f.recommendation}"
                    for f in found))
    (h,) = _hosts(prof)
    assert pid not in h["job_pids"] and {r["pid"] for r in h["ranks"]} <= set(h["job_pids"])
    mine = [f for f in found if f.numbers["cpus"] == [cpus[1]]]
    assert len(mine) == 1, [f.headline for f in found]
    f = mine[0]
    assert f.numbers["ranks"] == [1]
    assert f.numbers["foreign_share"] > 0.25, f.numbers
    assert f.headline.startswith(f"CPU {cpus[1]}, where rank 1 runs, was busy ")
    assert f"pid {pid} (nn-busyloop)" in f.headline
    assert f.numbers["processes"][0]["pid"] == pid
    assert f.significant and f"pid {pid} (nn-busyloop)" in f.recommendation
    # the busy loop is named on rank 1's CPU only
    assert not any(f"pid {pid}" in g.headline for g in found if g is not f)
    # rank 1 is late, and the late-rank finding says why
    (late,) = [g for g in advice.findings if g.key == "late_ranks"]
    assert late.numbers["rank"] == 1
    assert any(f"pid {pid} (nn-busyloop)" in d for d in late.details), late.details
    # one wait, one cause: its lateness is the neighbour's wait, claimed once
    assert any("claimed by noisy_neighbour" in d for d in late.details), late.details
    assert late.cost_ms < late.numbers["cost_with_neighbour_ms"]
    claimed = [g for g in advice.findings if g.significant and g.cost_ms is not None]
    assert sum(g.cost_ms for g in claimed) <= advice.header["step_ms"] + 1e-9


@requires_mpi
@pytest.mark.mpi
def test_no_neighbour_no_finding(tmp_path: Path) -> None:
    prof, _ = _run(tmp_path, None)
    advice = _advise(prof)
    (h,) = _hosts(prof)
    print({c["cpu"]: round(c["foreign_share"], 3) for c in h["cpus"]}, h["foreign"][:3])
    assert {c["cpu"] for c in h["cpus"]} == set(_cpus())
    # the job's own processes are never foreign
    assert {p["pid"] for p in h["foreign"]}.isdisjoint(h["job_pids"])
    found = [f for f in advice.findings if f.key == "noisy_neighbour"]
    assert found == [], [f.headline for f in found]
    assert all("noisy_neighbour" not in d for f in advice.findings for d in f.details)


WAITS = [{0: 0.1, 1: 8.0 + (0.3 if s % 2 else 0.0)} for s in range(12)]


def _one_core_job(waits: list[dict[int, float]], horovod_wait_ms: float | None = None
                  ) -> pd.DataFrame:
    """A 2-rank job whose rank 1 arrives late by its compute thread's wait
    for a core (each step's "cpu" row); with `horovod_wait_ms`, its Horovod
    thread's row too, waiting that long in each step."""
    from test_breakdown import MS, _row, horovod_job

    df, _ = horovod_job([[10.0, 10.0 + w[1]] for w in waits])
    steps = df.loc[df["op"] == "step"]
    cpu = []
    for _, st in steps.iterrows():
        rank, step, dur = int(st["rank"]), int(st["step"]), int(st["dur_ns"])
        wait = int(waits[step][rank] * MS)
        at = {"rank": rank, "op": "cpu", "seq": int(st["seq"]), "step": step,
              "t_start_ns": int(st["t_start_ns"]), "t_end_ns": int(st["t_end_ns"])}
        cpu.append(_row(**at, count=wait, bytes=dur - wait))
        if horovod_wait_ms is not None and rank == 1:
            hw = int(horovod_wait_ms * MS)
            cpu.append(_row(**at, count=hw, bytes=2 * MS, thread_kind="horovod", tid=101))
    df = pd.concat([df, pd.DataFrame(cpu)], ignore_index=True).sort_values(
        ["rank", "t_start_ns"], kind="stable").reset_index(drop=True)
    for c in ("op", "backend", "thread_kind", "kind"):
        df[c] = df[c].astype("category")
    return df


def test_a_neighbour_slowing_horovods_thread_costs_its_share_of_negotiation_and_transfer(
        ) -> None:
    """After the last arrival the step waits for Horovod's threads (the
    breakdown's "horovod" and "transfer" parts).  Rank 1's waits 30 ms of
    each step for a core; the share of the step the neighbour explains of
    that wait is the share of that phase the step would save: the cost is the compute thread's
    counterfactual plus that, and says so."""
    from profiler.analysis.breakdown import rank_breakdown
    from profiler.analysis.findings.base import Context
    from profiler.analysis.findings.contention import _explained_share, neighbours

    meta = _meta(_two_ranks())
    base = _findings(_one_core_job(WAITS), meta, "noisy_neighbour")[0]
    df = _one_core_job(WAITS, horovod_wait_ms=30.0)
    (f,) = _findings(df, meta, "noisy_neighbour")
    ctx = Context(df=df, meta=meta, path="")
    (n,) = neighbours(meta)
    share = _explained_share(ctx, n, "horovod")
    bd = rank_breakdown(df)
    post = bd.groupby("step")[["horovod_ms", "transfer_ms"]].mean().sum(axis=1)
    steady = sorted(set(ctx.steady["step"]))
    extra = float((post.reindex(steady) * share.reindex(steady)).mean())
    assert 0.0 < share.max() < 1.0 and extra > 0.0
    assert f.cost_ms == pytest.approx(base.cost_ms + extra, abs=0.01)
    assert f.cost_ms < float(bd.groupby("step")["wall_ms"].mean().mean())
    assert any("negotiation and transfer" in d for d in f.details)


def test_a_neighbour_on_one_ranks_core_costs_the_step_the_lead_it_gives_that_rank() -> None:
    """Rank 1's compute thread waits ~8 ms a step for its core, held by the
    neighbour, and arrives that much after rank 0.  The step would end ~8 ms
    sooner without it (the counterfactual: rank 1's arrivals moved earlier
    by its wait, the last arrival recomputed), not the wait averaged over
    the ranks (4 ms); rank 0 waits meanwhile and costs nothing more."""
    df = _one_core_job(WAITS)
    (f,) = _findings(df, _meta(_two_ranks()), "noisy_neighbour")
    steady = [w[1] for w in WAITS[1:]]  # the steady steps: from the second on
    assert f.cost_ms == pytest.approx(sum(steady) / len(steady), abs=0.01)
    assert f.significant and any("would end" in d for d in f.details)
    # Horovod's background thread there, never kept from a core: nothing more
    (g,) = _findings(_one_core_job(WAITS, horovod_wait_ms=0.0), _meta(_two_ranks()),
                     "noisy_neighbour")
    assert g.cost_ms == pytest.approx(f.cost_ms, abs=1e-9)
    # the same wait on both ranks' cores: every arrival moves, the step by the wait
    both = _findings(_frame(wait_ms={0: 0.1, 1: 8.0}), _meta(_two_ranks()), "noisy_neighbour")
    assert [x.numbers["ranks"] for x in both] == [[1]]


def test_a_neighbour_holding_up_only_horovods_thread_is_named() -> None:
    """The claim's rule is cpu_contention's: the compute thread or Horovod's
    background thread waits for a core because of the neighbour.  Rank 1's
    compute thread waits 0.4 ms of each step (under the claim's share), its
    Horovod thread half its step: named, and its cost is that thread's share
    of negotiation and transfer.  A Horovod thread that waits 0.2 ms: not."""
    small = [{0: 0.1, 1: 0.4} for _ in range(12)]
    meta = _meta(_two_ranks())
    assert _findings(_one_core_job(small, horovod_wait_ms=0.2), meta, "noisy_neighbour") == []
    assert _findings(_one_core_job(small), meta, "noisy_neighbour") == []
    (f,) = _findings(_one_core_job(small, horovod_wait_ms=8.0), meta, "noisy_neighbour")
    assert f.numbers["wait_share"] < 0.10 <= f.numbers["horovod_share"] < 1.0, f.numbers
    assert f.significant and f.cost_ms > 0.4
    assert any("Horovod's background thread" in d for d in f.details), f.details
