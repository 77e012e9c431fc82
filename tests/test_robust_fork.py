"""Processes a profiled rank forks or spawns.

A rank under mpirun with HOROVOD_PROFILE=1 forks children that do work and
try their best to record (os.fork, a multiprocessing pool with the fork start
method, a torch DataLoader with two forked workers): none of them may write
into the parent's files, corrupt them, create files of their own, or print.
The parent's records are counted exactly.  Non-MPI Python processes spawned
from the rank with HOROVOD_PROFILE=1 inherited (python -c, pip --version, a
program importing threading and multiprocessing) print nothing and create
nothing."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import mpirun, requires_mpi

from profiler.formats.raw import read_raw

pytestmark = [requires_mpi, pytest.mark.mpi]

N_BEFORE, N_AFTER, CHILD_STEPS = 6, 4, 200

JOB = r'''
import ctypes, json, os, subprocess, sys
import multiprocessing as mp
import numpy as np
from mpi4py import MPI
import profiler
from profiler.collect import native

out = sys.argv[1]
c = MPI.COMM_WORLD
r = c.Get_rank()
a = np.arange(8, dtype=np.float64) + r
b = np.empty_like(a)
profiler.step(images=1)                       # opens step 0
for i in range(%(before)d):
    c.Allreduce(a, b)
lib = native.load()


def child_tries_to_record(tag):
    """In a forked child: everything that would write a record or change the file."""
    for i in range(%(child_steps)d):
        profiler.step(images=3)
    lib.hvprof_record_app(33, 1, 2, 3, 4)     # APP_MARK straight to the library
    profiler.sampling(False)
    lib.hvprof_set_enabled(1)
    from profiler.collect import activate as _activate
    _activate._at_exit()                       # the exit work must see a child and return
    return {"tag": tag, "pid": os.getpid(), "dir": native.profile_dir(),
            "active": native.is_active(), "rank": native.rank()}


# 1. os.fork: the child works, tries to record, exits
rfd, wfd = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(rfd)
    info = child_tries_to_record("fork")
    info["work"] = sum(i * i for i in range(20000))
    os.write(wfd, json.dumps(info).encode())
    os._exit(0)
os.close(wfd)
fork_info = json.loads(os.read(rfd, 65536).decode())
os.close(rfd)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0


# 2. multiprocessing, fork start method
def work(x):
    info = child_tries_to_record("pool")
    return x * x, info

with mp.get_context("fork").Pool(2) as pool:
    results = pool.map(work, range(16))
pool_sum = sum(v for v, _ in results)
pool_info = [i for _, i in results]

# 3. torch DataLoader, two forked workers
import torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        profiler.step(images=1)                # a worker marking steps: recorded nowhere
        return torch.tensor([i * i], dtype=torch.int64)

def init_worker(_):
    child_tries_to_record("loader")

loader = DataLoader(Squares(), batch_size=4, num_workers=2,
                    multiprocessing_context="fork", worker_init_fn=init_worker)
loader_sum = int(sum(int(x.sum()) for x in loader))

# 4. spawned non-MPI Python processes inherit HOROVOD_PROFILE=1
spawned = {}
for name, argv in {
    "python-c": [sys.executable, "-c", "print('hello')"],
    "pip": [sys.executable, "-m", "pip", "--version", "--disable-pip-version-check"],
    "threads": [sys.executable, "-c", "import threading, multiprocessing, ctypes; "
                "ctypes.CDLL(None).hvprof_dir; print('hello')"],
}.items():
    cwd = os.path.join(out, f"spawn-{r}-{name}")
    os.makedirs(cwd)
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    spawned[name] = {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr,
                     "created": sorted(os.listdir(cwd))}

for i in range(%(after)d):
    c.Allreduce(a, b)
profiler.step(images=1)                       # closes step 0
profiler.sampling(True)
with open(os.path.join(out, f"rank-{r}.json"), "w") as f:
    json.dump({"pid": os.getpid(), "fork": fork_info, "pool": pool_info, "pool_sum": pool_sum,
               "loader_sum": loader_sum, "spawned": spawned}, f)
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    d = tmp_path_factory.mktemp("fork")
    script = d / "job.py"
    script.write_text(JOB % {"before": N_BEFORE, "after": N_AFTER,
                             "child_steps": CHILD_STEPS})
    out = d / "out"
    out.mkdir()
    prof = d / "prof"
    p = mpirun(2, [sys.executable, str(script), str(out)], cwd=d, timeout=200,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                    # 8 KiB chunks (127 records): a child's 200 step marks would
                    # need new chunks of the file if it could write at all
                    "HOROVOD_PROFILE_CHUNK_KB": "8"})
    return prof, out, p.stderr


def test_children_did_their_work_and_were_inert(run: tuple[Path, Path, str]) -> None:
    _, out, _ = run
    for r in (0, 1):
        info = json.loads((out / f"rank-{r}.json").read_text())
        assert info["pool_sum"] == sum(x * x for x in range(16))
        assert info["loader_sum"] == sum(i * i for i in range(32))
        children = [info["fork"], *info["pool"]]
        assert info["fork"]["work"] == sum(i * i for i in range(20000))
        for child in children:
            assert child["pid"] != info["pid"]
            # the child sees no open profile: nothing to write into
            assert (child["dir"], child["active"], child["rank"]) == ("", False, -1), child


def test_parent_records_exact(run: tuple[Path, Path, str]) -> None:
    prof, out, _ = run
    for r in (0, 1):
        info = json.loads((out / f"rank-{r}.json").read_text())
        raw = read_raw(prof / "raw" / f"rank-{r:05d}.hvprof")
        assert raw.problems == []
        h = raw.header
        assert h["pid"] == info["pid"]  # the parent's file, written by the parent only
        assert h["dropped_records"] == 0 and h["unsampled_calls"] == 0
        assert "closed" in h["state_names"] and "truncated" not in h["state_names"]
        df = pd.read_parquet(prof / "ranks" / f"rank-{r:05d}.parquet")
        counts = df["op"].astype(str).value_counts().to_dict()
        # init, the allreduces, finalize; one step record and with it the main
        # thread's CPU sample (its one thread track); no mark record
        assert counts == {"init": 1, "allreduce": N_BEFORE + N_AFTER, "finalize": 1,
                          "step": 1, "cpu": 1}, counts
        # the CPU sidecar is the parent's too, rewritten by no child
        cpu = json.loads((prof / "raw" / f"rank-{r:05d}.cpu.json").read_text())
        assert cpu["pid"] == info["pid"] and cpu["state"] == "exit" and cpu["steps"] == 1
        assert set(df["tid"]) == {info["pid"]}  # every record from the rank's main thread
        assert df.loc[df["op"] == "allreduce", "seq"].tolist() == \
            list(range(1, N_BEFORE + N_AFTER + 1))


def test_no_foreign_files_and_modes(run: tuple[Path, Path, str]) -> None:
    prof, _, stderr = run
    files = sorted(str(p.relative_to(prof)) for p in prof.rglob("*"))
    assert files == ["ranks", "ranks/rank-00000.json", "ranks/rank-00000.parquet",
                     "ranks/rank-00001.json", "ranks/rank-00001.parquet", "raw",
                     "raw/rank-00000.cpu.json", "raw/rank-00000.hvprof",
                     "raw/rank-00000.mpit.json", "raw/rank-00001.cpu.json",
                     "raw/rank-00001.hvprof", "raw/rank-00001.mpit.json", "trace.json"]
    for p in [prof, *prof.rglob("*")]:
        assert not os.stat(p).st_mode & stat.S_IWOTH, p
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    assert meta["partial_ranks"] == [] and meta["missing_ranks"] == []
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("horovod-profiler: trace written to"), \
        stderr


def test_spawned_python_processes_do_nothing_visible(run: tuple[Path, Path, str]) -> None:
    _, out, _ = run
    for r in (0, 1):
        info = json.loads((out / f"rank-{r}.json").read_text())
        for name, s in info["spawned"].items():
            assert s["rc"] == 0, (name, s)
            assert s["stderr"] == "", (name, s)
            assert s["created"] == [], (name, s)
            if name != "pip":
                assert s["stdout"] == "hello\n"
            else:
                assert s["stdout"].startswith("pip ")
