"""`profiler watch` on real jobs: a 2-rank Horovod run watched while it trains
(its counts equal the final trace's, and the guide's pasted frame has the
shape of its view), a hung job (the call in flight, its age growing; a
killed rank stopped), ranks on two simulated hosts writing into one
directory, watched by one process, and a real Prometheus server scraping
the exporter.  The reader, the aggregates and the view on synthetic ranks:
test_watch.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import textwrap
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, ROOT, base_env, profiler_cli, requires_mpi
from simcluster_fixture import ClusterFactory, sim_cluster  # noqa: F401 (fixture)
from test_watch import snapshot_counts

from profiler.analysis.live import Watcher


def watch_json(prof: Path, *extra: str) -> dict[str, Any]:
    p = profiler_cli("watch", str(prof), "--once", "--format", "json", *extra, timeout=60)
    assert p.returncode in (0, 1) and p.stderr == "", p.stderr
    doc: dict[str, Any] = json.loads(p.stdout)
    return doc


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def trace_counts(trace: Path) -> dict[int, dict[str, int]]:
    doc = json.loads(trace.read_bytes())
    assert doc["horovod_profiler"]["events"]["selection"] == "all"
    out: dict[int, Counter[str]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            out.setdefault(int(e["pid"]), Counter())[e["name"]] += 1
    return {r: dict(c) for r, c in out.items()}


def assert_the_guides_frame_has_the_shape_of(snap: dict[str, Any]) -> None:
    """The frame pasted in docs/guide/watch.md, line by line (the rank rows
    aside: their hosts differ), has the shape of the view of a live job's
    snapshot: the same words and figures in the same places."""
    from docshape import doc_block, mask

    from profiler.cli.watch import render

    frame = doc_block(ROOT / "docs" / "guide" / "watch.md", "profiler watch  ")
    view = render(snap)
    firsts = ("ranks", "steps", "slowest", "rank", "where", "top", "dropped", "compute",
              "waiting", "transfer", "profiler")
    flying = False  # the calls in flight: none in a healthy job's view
    for line in frame:
        word = line.split()[0] if line.split() else ""
        flying = line.startswith("in flight") or (flying and bool(word))
        if word not in firsts or flying:
            continue
        same = [v for v in view if v.split()[:1] == [word]]
        part = next((p for p in (snap["breakdown"] or {}).get("parts", [])
                     if line.strip().startswith(p["label"] + "  ")), None)
        if part is not None:  # a part of the breakdown: its own line
            same = [v for v in view if v.strip().startswith(part["label"] + "  ")]
            if not same and part["part"] != "compute":
                # a part that took no time in the window has no line (the
                # view's rule), as transfer over shared memory in some windows
                assert part["ms"] <= 0.0005 * snap["breakdown"]["step_ms"], (line, part, view)
                continue
        assert same, (line, view)
        assert mask(line) in {mask(v) for v in same}, (line, same)


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_watch_a_training_job(tmp_path: Path) -> None:
    """A real 2-rank Horovod job for ~20 s: snapshots at its first steps and 4 s later grow,
    a live exporter answers, and after the job the counts equal trace.json's."""
    prof = tmp_path / "prof"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof))
    bench = ["--model", "resnet8", "--batch-size", "16", "--image-size", "32",
             "--num-warmup-batches", "3", "--num-batches-per-iter", "10", "--num-iters", "18",
             "--quiet"]
    job = subprocess.Popen(["mpirun", "-n", "2", PYTHON, "-m", "profiler.workloads.train_bench",
                            *bench], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        raw = prof / "raw"
        wait_for(lambda: len(list(raw.glob("rank-*.hvprof"))) == 2, 120, "2 raw files")
        # paced by the job, not the clock: the job runs 12-25 s here by the
        # machine's load, so a snapshot at a fixed time may come after its end
        snaps: list[dict[str, Any]] = []
        wait_for(lambda: snaps.append(watch_json(prof)) or snaps[-1]["job"]["steps"] > 0,
                 120, "the first steps in a snapshot")
        a = snaps[-1]
        time.sleep(1.0)
        # the second snapshot once every rank has moved on, while the job runs
        later: list[dict[str, Any]] = []
        wait_for(lambda: job.poll() is not None or (
            later.append(watch_json(prof)) or all(
                ra["steps"] < rb["steps"] for ra, rb in zip(a["ranks"], later[-1]["ranks"]))),
            120, "a later snapshot with more steps on every rank")
        assert job.poll() is None and later, "the job ended before the second snapshot"
        b = later[-1]
        for s in (a, b):
            assert s["world_size"] == 2 and s["ranks_seen"] == 2 and not s["finished"]
            assert {r["status"] for r in s["ranks"]} == {"running"}, s["ranks"]
            assert s["job"]["stopped_ranks"] == []
        assert 0 < a["job"]["steps"] < b["job"]["steps"]
        assert 0 < a["job"]["calls"] < b["job"]["calls"]
        for ra, rb in zip(a["ranks"], b["ranks"]):
            assert ra["ops"]["allreduce"] < rb["ops"]["allreduce"]
            assert ra["steps"] < rb["steps"]
        assert b["job"]["images_per_sec_recent"] > 0
        assert b["collectives"] and b["collectives"][0]["busbw_gbps"] > 0
        assert b["ranks"][0]["cost"]["helper_cpu_s"] > 0
        out, _ = job.communicate(timeout=600)
        assert job.returncode == 0, out[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate(timeout=30)
    assert_the_guides_frame_has_the_shape_of(b)
    wait_for(lambda: (prof / "trace.json").is_file(), 180, "trace.json")
    final = watch_json(prof)
    assert final["finished"] and {r["status"] for r in final["ranks"]} == {"closed"}
    assert snapshot_counts(final) == trace_counts(prof / "trace.json")
    # where a step goes, live: advise's rules on the window's steps, equal to
    # the final trace's breakdown of those steps
    live = b["breakdown"]
    assert live is not None and live["source"] == "sync" and live["steps"] > 0, live
    assert sum(p["ms"] for p in live["parts"]) == pytest.approx(live["step_ms"], rel=1e-9)
    bd = final["breakdown"]
    assert bd is not None and bd["ranks"] == 2 and bd["steps"] >= 2, bd
    from profiler.analysis.breakdown import rank_breakdown
    from profiler.analysis.load import load

    tb = rank_breakdown(load(prof / "trace.json"))
    tb = tb.loc[tb["step"].isin(bd["step_numbers"])]
    assert tb["step"].nunique() == bd["steps"] == len(bd["step_numbers"])
    want = tb.groupby("step")[[f"{p['part']}_ms" for p in bd["parts"]]].mean().mean()
    for p in bd["parts"]:
        assert p["ms"] == pytest.approx(want[f"{p['part']}_ms"], rel=1e-6, abs=1e-6), p


HANG = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    buf = np.ones(4)
    out = np.empty(4)
    for i in range(200):
        comm.Allreduce(buf, out)
    open(f"ready-{r}", "w").close()
    if r == 1:
        time.sleep(600)  # rank 1 never enters the next allreduce
    comm.Allreduce(buf, out)
""")


@requires_mpi
@pytest.mark.mpi
def test_watch_a_hung_job_and_a_killed_rank(tmp_path: Path) -> None:
    """Rank 0 blocks in an allreduce rank 1 never enters: watch shows the call
    in flight, stuck, its age growing; rank 1 killed shows as stopped (dead)."""
    (tmp_path / "job.py").write_text(HANG)
    prof = tmp_path / "prof"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof),
                   HOROVOD_PROFILE_HANG_S="0")
    job = subprocess.Popen(["mpirun", "-n", "2", PYTHON, str(tmp_path / "job.py")],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: (tmp_path / "ready-0").exists() and (tmp_path / "ready-1").exists(),
                 120, "both ranks past their first allreduces")
        time.sleep(1.5)
        a = watch_json(prof)
        time.sleep(2.0)
        b = watch_json(prof)
        fa = [f for f in a["in_flight"] if f["rank"] == 0]
        fb = [f for f in b["in_flight"] if f["rank"] == 0]
        assert [f["op"] for f in fa] == [f["op"] for f in fb] == ["allreduce"], a["in_flight"]
        assert fb[0]["comm"] == "MPI_COMM_WORLD" and fb[0]["stuck"]
        assert fb[0]["age_s"] >= fa[0]["age_s"] + 1.5
        assert fb[0]["usual_s"] is not None and fb[0]["usual_s"] < 0.1
        assert b["job"]["stuck_calls"] == 1 and b["job"]["stopped_ranks"] == []
        text = profiler_cli("watch", str(prof), "--once")
        assert text.returncode == 1 and "STUCK" in text.stdout, text.stdout
        pid1 = next(r["pid"] for r in b["ranks"] if r["rank"] == 1)
        os.kill(pid1, signal.SIGKILL)

        def rank1_dead() -> bool:
            s = watch_json(prof)
            return any(r["rank"] == 1 and r["stopped"] for r in s["ranks"])
        wait_for(rank1_dead, 30, "rank 1 shown as stopped")
        c = watch_json(prof)
        r1 = next(r for r in c["ranks"] if r["rank"] == 1)
        assert r1["status"] == "dead" and 1 in c["job"]["stopped_ranks"]
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate(timeout=30)


SHARED_DIR_JOB = textwrap.dedent("""
    import os, socket, time
    import numpy as np
    from mpi4py import MPI
    import profiler
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    print(f"RANK {r} HOST {socket.gethostname()}", flush=True)
    x, y = np.full(1024, r, dtype=np.float32), np.empty(1024, dtype=np.float32)
    stop = np.zeros(1, dtype=np.int32)
    t0 = time.monotonic()
    while True:  # until the test says stop (rank 0 decides for all: equal counts)
        comm.Allreduce(x, y)
        profiler.step(images=8)
        if r == 0:
            stop[0] = os.path.exists("stop") or time.monotonic() - t0 > 90
        comm.Bcast(stop, root=0)
        if stop[0]:
            break
        time.sleep(0.01)
    comm.Barrier()
    print(f"RESULT OK {r}", flush=True)
""")


@requires_mpi
@pytest.mark.mpi
def test_one_watcher_for_ranks_on_two_hosts(sim_cluster: ClusterFactory,  # noqa: F811
                                            tmp_path: Path) -> None:
    """2 simulated hosts x 2 ranks (h1's CLOCK_MONOTONIC 3000 s behind h0's)
    write into one shared directory.  One `watch --once --format json`,
    run on h0, sees every rank with the host it reports, all running: h0's
    by their pids, h1's by their heartbeat alone (a pid there cannot be
    checked, its clock is not h0's); so does a watcher on neither host.  An
    h1 rank stopped (SIGSTOP) shows as stalled, the others running.  After
    the job every rank is closed and the counts equal trace.json's."""
    from profiler.bench import simcluster

    c = sim_cluster(hosts=2, offsets=[3000, 0])
    (tmp_path / "job.py").write_text(SHARED_DIR_JOB)
    prof = tmp_path / "prof"
    env = {k: v for k, v in simcluster.run_env(None).items()
           if not k.startswith("HOROVOD_PROFILE")}
    env.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof),
               HOROVOD_PROFILE_MERGE_TIMEOUT="20")
    cmd = simcluster.mpirun_cmd(c.st, 4, [PYTHON, str(tmp_path / "job.py")],
                                env_names=simcluster.forwarded_env_names(env), per_host=2,
                                extra=["--mca", "mpi_yield_when_idle", "1"])
    want_hosts = {r: c.host_of_rank(r, per_host=2).name for r in range(4)}
    assert sorted(set(want_hosts.values())) == ["h0", "h1"]

    def watch_on_h0(*extra: str) -> dict[str, Any]:
        p = c.exec_on(0, [PYTHON, "-P", "-m", "profiler.cli", "watch", str(prof), "--once",
                          "--format", "json", *extra],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env(),
                      cwd=tmp_path)
        out, err = p.communicate(timeout=60)
        assert p.returncode in (0, 1) and err == b"", err.decode()
        doc: dict[str, Any] = json.loads(out)
        return doc

    def states(s: dict[str, Any]) -> dict[int, str]:
        return {r["rank"]: r["status"] for r in s["ranks"]}

    job = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    far: Watcher | None = None
    paused: int | None = None
    try:
        wait_for(lambda: len(list((prof / "raw").glob("rank-*.hvprof"))) == 4
                 or job.poll() is not None, 60, "4 raw files")
        assert job.poll() is None, job.communicate()[0][-3000:]
        # a watcher on this machine (neither h0 nor h1): every rank by its heartbeat
        far = Watcher(prof)

        def recording() -> bool:
            assert far is not None
            far.refresh()
            s = far.snapshot()
            return s["ranks_seen"] == 4 and all(r.get("steps", 0) >= 2 for r in s["ranks"])
        wait_for(recording, 60, "4 ranks making steps")
        assert states(far.snapshot()) == dict.fromkeys(range(4), "running")

        a = watch_on_h0()
        assert job.poll() is None, "the job ended before the snapshot"
        assert a["world_size"] == 4 and a["ranks_seen"] == 4 and not a["finished"]
        assert a["missing_ranks"] == [] and a["job"]["stopped_ranks"] == []
        assert states(a) == dict.fromkeys(range(4), "running"), a["ranks"]
        assert {r["rank"]: r["host"] for r in a["ranks"]} == want_hosts
        for r in a["ranks"]:
            assert r["heartbeat_age_s"] is not None and r["heartbeat_age_s"] < 5.0, r
            assert r["steps"] >= 2 and r["ops"]["allreduce"] >= 2

        # rank 3 (h1) frozen: its heartbeat stops, seen from h0 through the file alone
        paused = next(r["pid"] for r in a["ranks"] if r["rank"] == 3)
        os.kill(paused, signal.SIGSTOP)
        time.sleep(3.0)
        b = watch_on_h0("--stale", "2.5")
        os.kill(paused, signal.SIGCONT)
        paused = None
        assert states(b) == {0: "running", 1: "running", 2: "running", 3: "stalled"}, b["ranks"]
        assert b["job"]["stopped_ranks"] == [3]
        assert next(r for r in b["ranks"] if r["rank"] == 3)["heartbeat_age_s"] > 2.5

        (tmp_path / "stop").touch()
        out, _ = job.communicate(timeout=120)
        assert job.returncode == 0, out[-3000:]
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate(timeout=30)
        if far is not None:
            far.close()
    # the host each rank reported (mpirun may join two ranks' lines: match the names)
    seen = {int(k): v for k, v in re.findall(r"RANK (\d+) HOST (h\d+)", out)}
    assert seen == want_hosts and out.count("RESULT OK") == 4, out[-3000:]
    wait_for(lambda: (prof / "trace.json").is_file(), 60, "trace.json")
    final = watch_on_h0()
    assert final["finished"] and states(final) == dict.fromkeys(range(4), "closed")
    assert {r["rank"]: r["host"] for r in final["ranks"]} == want_hosts
    assert snapshot_counts(final) == trace_counts(prof / "trace.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@requires_mpi
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="Debian's prometheus not installed (scripts/setup.sh installs it)")
def test_a_prometheus_server_scrapes_the_exporter(tmp_path: Path) -> None:
    """A real Prometheus server (loopback, data in a temporary folder) scrapes
    `watch --prometheus` during an mpi4py job; at the end its series hold the
    counts of the final trace."""
    prof = tmp_path / "prof"
    (tmp_path / "job.py").write_text(textwrap.dedent("""
        import time
        import numpy as np
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        buf, out = np.ones(1024), np.empty(1024)
        for i in range(3000):  # a count, equal on both ranks: about 8 s
            comm.Allreduce(buf, out)
            time.sleep(0.002)
    """))
    exp_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(textwrap.dedent(f"""
        global:
          scrape_interval: 1s
        scrape_configs:
          - job_name: hvprof
            static_configs:
              - targets: ["127.0.0.1:{exp_port}"]
    """))
    server = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof))
    watcher = None
    job = subprocess.Popen(["mpirun", "-n", "2", PYTHON, str(tmp_path / "job.py")],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: len(list((prof / "raw").glob("rank-*.hvprof"))) == 2, 120,
                 "2 raw files")
        watcher = subprocess.Popen(
            [PYTHON, "-P", "-m", "profiler.cli", "watch", str(prof), "--format", "json",
             "--interval", "0.5", "--follow", "--prometheus", f"127.0.0.1:{exp_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        def query(q: str) -> list[dict[str, Any]]:
            url = (f"http://127.0.0.1:{prom_port}/api/v1/query?"
                   + urllib.parse.urlencode({"query": q}))
            with urllib.request.urlopen(url, timeout=5) as resp:
                doc = json.loads(resp.read())
            assert doc["status"] == "success", doc
            return list(doc["data"]["result"])

        def scraped() -> bool:
            try:
                return bool(query('hvprof_calls_total{op="allreduce"}'))
            except OSError:
                return False
        wait_for(scraped, 60, "Prometheus to scrape the exporter")
        assert job.poll() is None, "the job ended before the first scrape"
        out, _ = job.communicate(timeout=300)
        assert job.returncode == 0, out[-3000:]
        wait_for(lambda: (prof / "trace.json").is_file(), 180, "trace.json")
        want = trace_counts(prof / "trace.json")

        def final() -> bool:
            got = {int(s["metric"]["rank"]): float(s["value"][1])
                   for s in query('sum by (rank) (hvprof_calls_total{op="allreduce"})')}
            return got == {r: float(c["allreduce"]) for r, c in want.items()}
        wait_for(final, 30, "the scraped counts to equal the trace's")
        assert query("hvprof_call_duration_seconds_bucket")
        assert query("hvprof_profiler_cpu_seconds_total")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        for p in (job, watcher, server):
            if p is not None:
                if p.poll() is None:
                    p.kill()
                p.communicate(timeout=30)
