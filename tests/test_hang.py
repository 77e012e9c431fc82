"""Jobs that really hang, ended by SIGKILL of the whole job after a timeout, and
diagnosed from the profile directory alone (`profiler hang`): the flight
recorder in each raw file, the watchdog's snapshot, and the cross-rank view."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import base_env, requires_mpi

pytestmark = [pytest.mark.mpi, requires_mpi]

PRELUDE = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    buf = np.ones(4)
    out = np.empty(4)
""")


def run_until_killed(tmp: Path, body: str, *, np_: int = 2, after_s: float = 6.0,
                     env: dict[str, str] | None = None,
                     until: Callable[[Path], bool] | None = None) -> tuple[Path, str]:
    """Run the job; SIGKILL the whole job (mpirun and its ranks) after `after_s`,
    or a second after `until(profile dir)` holds (what the test waits for is
    there: a loaded machine may take longer than a fixed time to get there)."""
    job = tmp / "job.py"
    job.write_text(PRELUDE + textwrap.dedent(body))
    prof = tmp / "prof"
    full = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof), **(env or {}))
    proc = subprocess.Popen(["mpirun", "-n", str(np_), sys.executable, str(job)], cwd=tmp,
                            env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + after_s
    while True:
        try:
            out, _ = proc.communicate(timeout=0.5 if until is not None else after_s)
            return prof, out
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                break
            if until is not None and until(prof):
                time.sleep(1.0)  # what it writes alongside is written too
                break
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    return prof, out


def hang_cli(prof: Path) -> tuple[int, str, dict]:
    cmd = [sys.executable, "-P", "-m", "profiler.cli", "hang", str(prof)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    j = subprocess.run([*cmd, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.stderr == "" and j.stderr == "", p.stderr + j.stderr
    return p.returncode, p.stdout, json.loads(j.stdout)


def test_rank_that_skips_an_allreduce_is_named(tmp_path: Path) -> None:
    prof, out = run_until_killed(tmp_path, """
        for i in range(5):
            if r == 1 and i == 4:
                break  # rank 1 skips the last allreduce ...
            comm.Allreduce(buf, out)
        time.sleep(600)  # ... and waits elsewhere: both block
    """, env={"HOROVOD_PROFILE_HANG_S": "2"})
    # the watchdog's one line came before the kill
    assert "MPI_ALLREDUCE (a collective) has been in flight for" in out, out
    assert "profiler hang" in out, out
    rc, text, doc = hang_cli(prof)
    assert rc == 1, text
    (c,) = [c for c in doc["comms"] if c["never"]]
    assert c["name"] == "MPI_COMM_WORLD" and c["never"] == [1]
    assert list(c["entered"]) == ["0"] and c["entered"]["0"].startswith("allreduce (in flight")
    ranks = {r["rank"]: r for r in doc["ranks"]}
    assert [f["op"] for f in ranks[0]["in_flight"]] == ["allreduce"]
    assert ranks[0]["in_flight"][0]["seq"] == c["seq"]
    assert ranks[1]["in_flight"] == [] and ranks[1]["last"]["op"] == "allreduce"
    assert ranks[1]["last"]["seq"] == c["seq"] - 1
    # rank 1's Python stack from the snapshot: where it waits instead
    assert ranks[1]["stack"] and "job.py" in ranks[1]["stack"]
    assert "NEVER entered by rank(s) 1" in text and "rank 1 instead: no collective" in text


def test_different_collectives_at_one_sequence_are_a_mismatch(tmp_path: Path) -> None:
    prof, _ = run_until_killed(tmp_path, """
        comm.Allreduce(buf, out)
        if r == 0:
            comm.Bcast(buf, root=0)
        else:
            comm.Allreduce(buf, out)
        time.sleep(600)
    """, after_s=5.0, env={"HOROVOD_PROFILE_HANG_S": "0"})
    rc, text, doc = hang_cli(prof)
    assert rc == 1, text
    (c,) = [c for c in doc["comms"] if c["mismatch"]]
    assert c["mismatch"] == {"bcast": [0], "allreduce": [1]}
    assert "MISMATCH" in text and "bcast" in text and "allreduce" in text


def test_a_rank_that_died_is_reported_dead(tmp_path: Path) -> None:
    prof, _ = run_until_killed(tmp_path, """
        comm.Allreduce(buf, out)
        if r == 1:
            time.sleep(1.0)
            os.kill(os.getpid(), 9)
        comm.Allreduce(buf, out)
        time.sleep(600)
    """, after_s=8.0, env={"HOROVOD_PROFILE_HANG_S": "0"})
    rc, text, doc = hang_cli(prof)
    assert rc == 1
    ranks = {r["rank"]: r for r in doc["ranks"]}
    assert ranks[1]["state"] == "dead" and ranks[1]["in_flight"] == []
    assert "rank 1 DIED" in text
    (c,) = [c for c in doc["comms"] if c["never"]]
    assert c["never"] == [1]


def test_a_clean_job_reports_nothing(tmp_path: Path) -> None:
    prof, out = run_until_killed(tmp_path, """
        for i in range(3):
            comm.Allreduce(buf, out)
        comm.Barrier()
    """, after_s=60.0)
    rc, text, doc = hang_cli(prof)
    assert rc == 0, text
    assert doc["comms"] == [] and not doc["stuck"] and "nothing is stuck" in text
    assert all(r["in_flight"] == [] for r in doc["ranks"])
    p = subprocess.run([sys.executable, "-P", "-m", "profiler.cli", "check", str(prof)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_hang_bad_input_is_one_line(tmp_path: Path) -> None:
    for arg in (tmp_path / "none", tmp_path):
        p = subprocess.run([sys.executable, "-P", "-m", "profiler.cli", "hang", str(arg)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


HVD_JOB = """
    import horovod.torch as hvd
    import torch
    hvd.init()
    x = torch.ones(4)
    for i in range(4):
        if hvd.rank() == 1 and i == SKIP:
            hvd.allreduce(torch.ones(8), name="other")  # a tensor rank 0 never submits
        else:
            hvd.allreduce(x, name="grad.x")
    print("done", flush=True)
"""


@pytest.mark.horovod
@pytest.mark.parametrize("skip", [2, -1], ids=["rank1-skips", "clean"])
def test_horovod_tensor_one_rank_never_submits(tmp_path: Path, skip: int) -> None:
    """Horovod's own hang: rank 1 hands Horovod a different tensor at step 2.
    Every MPI call completes (the response-cache allreduce goes on each cycle),
    so no collective is in flight; the tensor records name what is missing."""
    pytest.importorskip("horovod.torch")
    def snapshots(prof: Path) -> bool:
        return all((prof / "hang" / f"rank-0000{r}.stacks.txt").is_file() for r in (0, 1))

    prof, out = run_until_killed(tmp_path, HVD_JOB.replace("SKIP", str(skip)), after_s=40.0,
                                 env={"HOROVOD_CYCLE_TIME": "5", "HOROVOD_PROFILE_HANG_S": "2"},
                                 until=snapshots)
    rc, text, doc = hang_cli(prof)
    if skip < 0:
        assert out.count("done") == 2, out
        assert rc == 0 and doc["tensors"] == [], text
        return
    assert "done" not in out, out
    # the watchdog fired although no collective was in flight
    assert "allreduce.grad.x has waited in Horovod for" in out or \
        "allreduce.other has waited in Horovod for" in out, out
    assert (prof / "hang" / "rank-00000.stacks.txt").is_file(), out
    assert (prof / "hang" / "rank-00001.stacks.txt").is_file(), out
    assert rc == 1, text
    gaps = {(g["tensor"], g["occurrence"]): g for g in doc["tensors"]}
    assert set(gaps) == {("allreduce.grad.x", 2), ("allreduce.other", 0)}, gaps
    g = gaps[("allreduce.grad.x", 2)]
    assert g["missing"] == [1] and list(g["submitted"]) == ["0"]
    assert "allreduce.other #0" in g["missing_last"]["1"]
    assert gaps[("allreduce.other", 0)]["missing"] == [0]
    assert "tensor allreduce.grad.x (submission #2): handed to Horovod by rank 0" in text
    assert "NEVER by rank(s) 1" in text
    # the report of the killed job (merged after the fact) opens with the hang
    from conftest import profiler_cli

    assert profiler_cli("merge", str(prof), timeout=300).returncode == 0
    html_path = tmp_path / "report.html"
    p = profiler_cli("report", str(prof / "trace.json"), "-o", str(html_path), timeout=300)
    assert p.returncode == 0, p.stderr
    html = html_path.read_text()
    assert html.index('id="hang"') < html.index('id="findings"')
    assert "NEVER by rank(s) 1" in html


def test_the_watchdog_reads_past_a_module_still_being_imported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog thread polls while the main thread may still be importing
    profiler.collect.tensors: the module is in sys.modules without its
    functions yet.  Seen in CI: the watchdog stopped on the AttributeError and
    that rank left no snapshot.  Such a module has handed nothing to Horovod."""
    import types

    from profiler.collect import watchdog

    half = types.ModuleType("profiler.collect.tensors")  # no oldest_pending yet
    monkeypatch.setitem(sys.modules, "profiler.collect.tensors", half)
    monkeypatch.delitem(sys.modules, "profiler.collect.tf_kernels", raising=False)
    assert watchdog._oldest_tensor() is None
    half.oldest_pending = lambda: (3.0, "allreduce.grad.x")  # type: ignore[attr-defined]
    assert watchdog._oldest_tensor() == (3.0, "allreduce.grad.x")
