"""Multi-host runs on simulated hosts (profiler.bench.simcluster: network, UTS and time
namespaces; Open MPI over TCP between them; mpi4py under HOROVOD_PROFILE=1).

The clock truth is the time-namespace offset each host was given: rank r's
offset to rank 0 is (S[host(r)] - S[host(0)]) seconds exactly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, profiler_cli, requires_mpi
from simcluster_fixture import ClusterFactory, sim_cluster  # noqa: F401 (fixture)

pytestmark = [requires_mpi, pytest.mark.mpi]

JOB = Path(__file__).with_name("cluster_job.py")
OFFSETS = [0, 777, 2501]  # seconds: thousands of seconds apart
N = 20


def profiled(prof: Path, **extra: str) -> dict[str, str]:
    return {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
            "HOROVOD_PROFILE_MERGE_TIMEOUT": "20", **extra}


def run_job(cluster: Any, prof: Path, *args: str, np_: int = 6, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    p = cluster.mpirun(np_, [PYTHON, str(JOB), *args], env=profiled(prof), timeout=timeout,
                       cwd=prof.parent)
    if check and p.returncode != 0:
        raise AssertionError(f"mpirun failed ({p.returncode})\nstdout:\n{p.stdout[-3000:]}\n"
                             f"stderr:\n{p.stderr[-3000:]}")
    return p


def trace_meta(prof: Path) -> dict[str, Any]:
    return json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]


def truth_ns(cluster: Any, rank: int) -> int:
    return (cluster.host_of_rank(rank).offset_s - cluster.host_of_rank(0).offset_s) * 10**9


def clock_figures(cluster: Any, meta: dict[str, Any]) -> list[tuple[int, int, int, Any]]:
    """(rank, |offset error| ns, bound ns, drift ppm) for every rank not on rank 0's host."""
    out = []
    for r in meta["ranks"]:
        if cluster.host_of_rank(r["rank"]).name == cluster.host_of_rank(0).name:
            continue
        errs = [abs(r["offset_ns"] - truth_ns(cluster, r["rank"]))]
        bounds = [r["offset_err_ns"]]
        if r.get("offset_end_ns") is not None:
            errs.append(abs(r["offset_end_ns"] - truth_ns(cluster, r["rank"])))
            bounds.append(r["offset_end_err_ns"])
        for e, b in zip(errs, bounds):
            assert e <= b, f"rank {r['rank']}: offset off by {e} ns, bound {b} ns"
        out.append((r["rank"], max(errs), max(bounds), r.get("clock_drift_ppm")))
    return out


def test_ranks_on_hosts_merge_counts_and_clocks(sim_cluster: ClusterFactory,  # noqa: F811
                                                tmp_path: Path) -> None:
    """3 hosts x 2 ranks, clocks +0 / +777 / +2501 s: hostnames, hosts in the
    metadata, one clock measurement per host (its leader's), offsets within
    their bounds of the truth, no drift, exact call counts, and `profiler
    merge` / `summarize` on the shared directory the hosts wrote into."""
    from profiler.analysis import load

    c = sim_cluster(hosts=3, offsets=OFFSETS)
    prof = tmp_path / "prof"
    p = run_job(c, prof, str(N))
    # (mpirun may join two ranks' lines: match the names, not the line ends)
    seen = dict(re.findall(r"RANK (\d+) HOST (h\d+)", p.stdout))
    assert {int(k): v for k, v in seen.items()} == {r: c.host_of_rank(r).name for r in range(6)}
    assert p.stdout.count("RESULT OK") == 6, p.stdout + p.stderr

    meta = trace_meta(prof)
    assert meta["hosts"] == ["h0", "h1", "h2"]
    assert meta["world_size"] == 6 and meta["missing_ranks"] == [] == meta["partial_ranks"]
    by_rank = {r["rank"]: r for r in meta["ranks"]}
    for rank, r in by_rank.items():
        assert r["host"] == c.host_of_rank(rank).name
        assert r["local_rank"] == rank % 2
        assert r["offset_method"] == 1  # per host
    # one measurement per host: the leader's, shared by the ranks there
    for lead in (0, 2, 4):
        for k in ("offset_ns", "offset_err_ns", "offset_end_ns", "offset_end_err_ns"):
            assert by_rank[lead][k] == by_rank[lead + 1][k], (lead, k)
    assert by_rank[0]["offset_ns"] == 0 and by_rank[0]["offset_err_ns"] == 0
    figs = clock_figures(c, meta)
    print("\nCLOCK quiet (rank, |error| ns, bound ns, drift ppm):", figs)
    for _, _, bound, drift in figs:
        assert bound <= 50_000, figs  # a quiet machine: <= 50 us
        assert drift == 0.0, figs  # the namespaces' clocks do not drift

    df = load(prof)
    for rank in range(6):
        mine = df[df["rank"] == rank]
        assert int(((mine["op"] == "allreduce") & (mine["bytes"] == 4096)).sum()) == N
        assert int(((mine["op"] == "bcast") & (mine["bytes"] == 1000)).sum()) == N
        assert int((mine["op"] == "barrier").sum()) == 1
    # times on one axis (clocks 777 and 2501 s apart): an allreduce ends on no
    # rank before it has started on every rank (each result needs every input)
    g = df[df["op"] == "allreduce"].groupby(["comm", "seq"])
    assert (g["t_end_ns"].min() >= g["t_start_ns"].max()).all()
    assert (g["rank"].count() == 6).all()

    (prof / "trace.json").unlink()
    m = profiler_cli("merge", str(prof))
    assert m.returncode == 0, m.stderr
    assert trace_meta(prof)["hosts"] == ["h0", "h1", "h2"]
    s = profiler_cli("summarize", str(prof))
    assert s.returncode == 0, s.stderr
    assert re.search(r"clock offsets: 5 rank\(s\) aligned to rank 0 within [0-9.]+ us, "
                     r"no drift beyond the bounds", s.stdout), s.stdout


@contextmanager
def busy(cluster: Any, n: int = 2) -> Iterator[None]:
    """n CPU-bound processes (`yes > /dev/null`) on the cluster's hosts beside the job."""
    procs = [cluster.exec_on(i % len(cluster.hosts), ["sh", "-c", "exec yes > /dev/null"])
             for i in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.full  # offsets and bounds: test_ranks_on_hosts_merge_counts_and_clocks
def test_clock_offsets_on_a_busy_machine(sim_cluster: ClusterFactory,  # noqa: F811
                                         tmp_path: Path) -> None:
    """Both cores busy with `yes` beside the job: the offsets stay within their
    bounds of the truth, the bounds <= 100 us, no drift reported."""
    c = sim_cluster(hosts=3, offsets=OFFSETS)
    # Every offset is within its bound of the truth in every run (clock_figures
    # asserts it).  The bound's target is met by the method, not by every
    # scheduling draw: once in two full suites a host's leader found no fast
    # round trip within its budget (bound 2.0 ms, error 78 us), so a second run
    # is allowed; two runs over the target fail.
    for attempt in (1, 2):
        prof = tmp_path / f"prof{attempt}"
        with busy(c, 2):
            run_job(c, prof, "5", "--sleep", "0.5")
        figs = clock_figures(c, trace_meta(prof))
        print(f"\nCLOCK busy, run {attempt} (rank, |error| ns, bound ns, drift ppm):", figs)
        assert all(drift == 0.0 for *_, drift in figs), figs
        if all(bound <= 100_000 for _, _, bound, _ in figs):
            break
    else:
        raise AssertionError(f"clock bound over 100 us in two runs: {figs}")


def test_a_host_whose_ranks_all_died(sim_cluster: ClusterFactory,  # noqa: F811
                                     tmp_path: Path) -> None:
    """Host h2's ranks SIGKILL themselves after the common work: the merge keeps
    the other hosts' complete records and reports h2's ranks as killed
    (partial: records up to the kill); with h2's files lost as well (its node
    gone with them), as missing ranks, and the other hosts still merge."""
    from profiler.analysis import load

    c = sim_cluster(hosts=3, offsets=OFFSETS)
    prof = tmp_path / "prof"
    p = run_job(c, prof, "10", "--kill-host", "h2", check=False, timeout=90)
    assert p.returncode != 0  # mpirun reports the dead processes
    assert p.stdout.count("RESULT OK") == 6, p.stdout + p.stderr
    m = profiler_cli("merge", str(prof))
    assert m.returncode == 0, m.stderr
    assert "partial ranks (killed): " in m.stdout, m.stdout + m.stderr
    # h2's ranks died; mpirun then ended the job, so the others stop in
    # MPI_Finalize, where the profiler's last exchange waits for h2
    assert {4, 5} <= set(trace_meta(prof)["partial_ranks"])
    df = load(prof)
    for rank in range(4):
        mine = df[df["rank"] == rank]
        assert int(((mine["op"] == "allreduce") & (mine["bytes"] == 4096)).sum()) == 10
        assert int(((mine["op"] == "allreduce") & (mine["bytes"] == 64)).sum()) == 10
    for rank in (4, 5):
        mine = df[df["rank"] == rank]
        assert int(((mine["op"] == "allreduce") & (mine["bytes"] == 4096)).sum()) == 10

    # the dead node's files never reached the shared directory
    for rank in (4, 5):
        for f in list(prof.glob(f"raw/rank-{rank:05d}.*")) + list(
                prof.glob(f"ranks/rank-{rank:05d}.*")):
            f.unlink()
    (prof / "trace.json").unlink(missing_ok=True)
    m = profiler_cli("merge", str(prof))
    assert m.returncode == 0, m.stderr
    assert "missing ranks: 4-5" in m.stdout + m.stderr, m.stdout + m.stderr
    meta = trace_meta(prof)
    assert meta["missing_ranks"] == [4, 5]
    assert meta["hosts"] == ["h0", "h1"]
    df = load(prof)
    assert sorted(df["rank"].unique()) == [0, 1, 2, 3]


def test_stale_cluster_of_a_killed_run_is_removed() -> None:
    """A process that made a cluster and was SIGKILLed leaves namespaces behind;
    the next start-up removes them (and their /etc/netns entries)."""
    from profiler.bench import simcluster

    ok, why = simcluster.available()
    if not ok:
        print(f"SKIP simulated cluster: {why}")
        pytest.skip(f"simulated cluster unavailable: {why}")
    code = ("import os, signal, sys; from profiler.bench import simcluster as s; "
            "c = s.SimCluster(hosts=2).__enter__(); print(c.st.name, flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    p = subprocess.run([PYTHON, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    name = p.stdout.split()[0]
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{name}-h0" in ns  # left behind by the killed run
    assert (simcluster.NETNS_ETC / f"{name}-h1").is_dir()
    removed = simcluster.sweep_stale()
    del removed  # (another test worker may have swept it first)
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in ns
    assert not (simcluster.NETNS_ETC / f"{name}-h1").exists()
    assert not (simcluster.STATE_DIR / f"{name}.json").exists()


def test_cli_up_run_down(tmp_path: Path) -> None:
    """The user's command: up, run across the hosts, down."""
    from profiler.bench import simcluster

    ok, why = simcluster.available(rate=True)
    if not ok:
        print(f"SKIP simulated cluster: {why}")
        pytest.skip(f"simulated cluster unavailable: {why}")
    script = Path(__file__).resolve().parent.parent / "scripts" / "simcluster.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_PROFILE")}
    up = subprocess.run([sys.executable, str(script), "up", "--hosts", "2", "--offsets",
                         "0,100", "--rate", "1gbit"], capture_output=True, text=True, env=env,
                        timeout=60)
    assert up.returncode == 0, up.stderr
    name = up.stdout.split()[0]
    try:
        run = subprocess.run([sys.executable, str(script), "run", "--name", name, "--np", "2",
                              "--per-host", "1", "--", "sh", "-c", "echo $(hostname)"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert run.returncode == 0, run.stderr
        assert sorted(run.stdout.split()) == ["h0", "h1"]
    finally:
        down = subprocess.run([sys.executable, str(script), "down", "--name", name],
                              capture_output=True, text=True, env=env, timeout=60)
    assert down.returncode == 0, down.stderr
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout


def test_unavailable_namespaces_are_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `ip` (or root) the harness says why; the fixture skips with that reason."""
    from profiler.bench import simcluster

    monkeypatch.setattr(simcluster.shutil, "which", lambda tool: None)
    assert simcluster.available() == (False, "simulated hosts need `ip` (not found)")
    monkeypatch.setattr(simcluster.os, "geteuid", lambda: 1000)
    ok, why = simcluster.available()
    assert not ok and "root" in why
    with pytest.raises(simcluster.SimClusterError, match="root"):
        simcluster.create(hosts=2)


@pytest.mark.full  # test_clock_offsets_on_a_busy_machine covers the clocks' path
@pytest.mark.horovod
def test_horovod_across_hosts_on_a_busy_machine(sim_cluster: ClusterFactory,  # noqa: F811
                                                tmp_path: Path) -> None:
    """Issue 15's case: Horovod on 2 hosts, clocks 5000 s apart, both cores busy:
    the offset lies within its bound (<= 100 us) of the truth at MPI_Init and
    at MPI_Finalize, and no drift is reported or applied."""
    import importlib.util

    if importlib.util.find_spec("horovod") is None:
        pytest.skip("Horovod not installed")
    c = sim_cluster(hosts=2, offsets=[0, 5000])
    prof = tmp_path / "prof"
    with busy(c, 2):
        p = c.mpirun(4, [PYTHON, str(Path(__file__).with_name("hvd_ops_job.py"))],
                     env=profiled(prof), timeout=240, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    meta = trace_meta(prof)
    assert meta["hosts"] == ["h0", "h1"]
    figs = clock_figures(c, meta)
    print("\nCLOCK horovod busy (rank, |error| ns, bound ns, drift ppm):", figs)
    assert [f[0] for f in figs] == [2, 3]
    for _, _, bound, drift in figs:
        assert bound <= 100_000 and drift == 0.0, figs
