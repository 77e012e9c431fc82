"""A driver's workers ended without their exit work (profiler.collect.driver).

horovod.ray.RayExecutor and horovod.spark.run start Horovod's workers from a
driver process and end them without Python's exit work: no rank builds the
trace.  The driver (a process started with HOROVOD_PROFILE that imports
horovod.ray or horovod.spark) merges what they wrote at its own exit.  Ray
is not installed here: the driver below calls driver.watch() itself, as the
import of horovod.ray does, and its workers are real MPI ranks that profile
and are then killed with SIGKILL, as Ray ends its workers.  The import's
trigger on a real Ray 2.60 job is on the validation page."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, base_env, requires_mpi

pytestmark = [pytest.mark.timeout(180), requires_mpi, pytest.mark.mpi]

WORKER = """
import os, signal, time
import numpy as np
from mpi4py import MPI
buf = np.ones(256)
for _ in range(5):
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf)
MPI.COMM_WORLD.Barrier()
time.sleep(0.5)                         # the helper thread flushes the records
os.kill(os.getpid(), signal.SIGKILL)    # as Ray ends its workers: no exit work
"""

DRIVER = """
import subprocess, sys
from profiler.collect import driver
driver.watch()                          # what importing horovod.ray does
p = subprocess.run(["mpirun", "-n", "2", sys.executable, "-c", sys.argv[1]])
print("workers ended with", p.returncode)
"""


def _driver(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-c", DRIVER, WORKER], cwd=tmp_path, text=True,
                          capture_output=True, timeout=150,
                          env=base_env(HOROVOD_PROFILE="1"))


def test_the_driver_merges_what_its_killed_workers_wrote(tmp_path: Path) -> None:
    # an older profile in the same folder, written before the driver started
    old = tmp_path / "horovod-profile-older"
    (old / "raw").mkdir(parents=True)
    (old / "raw" / "rank-00000.hvprof").write_bytes(b"")
    past = time.time() - 3600
    os.utime(old / "raw" / "rank-00000.hvprof", (past, past))
    p = _driver(tmp_path)
    assert p.returncode == 0, p.stderr
    assert "workers ended with" in p.stdout and "workers ended with 0" not in p.stdout
    (made,) = [d for d in tmp_path.iterdir() if d.name.startswith("horovod-profile-")
               and d != old]
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("horovod-profiler:")]
    assert ours == [f"horovod-profiler: trace written to {made}/trace.json (2 ranks, "
                    + ours[0].split(" (2 ranks, ", 1)[1]], ours
    assert "partial ranks (killed): 0-1" in ours[0] and "driver's exit" in ours[0]
    assert not (old / "trace.json").exists()  # not its workers'
    from profiler.analysis import load

    df = load(made / "trace.json")
    ar = df.loc[df["op"].astype(str) == "allreduce"]
    assert sorted(ar.groupby("rank").size().tolist()) == [5, 5]
    # its trace is now newer than its raw files: a later driver leaves it alone
    from profiler.collect.driver import written_since

    assert written_since(time.time() - 600, str(tmp_path)) == []


def test_a_driver_whose_workers_wrote_nothing_says_nothing(tmp_path: Path) -> None:
    p = subprocess.run([PYTHON, "-c", "from profiler.collect import driver; driver.watch()"],
                       cwd=tmp_path, text=True, capture_output=True, timeout=60,
                       env=base_env(HOROVOD_PROFILE="1"))
    assert p.returncode == 0 and p.stderr == "", p.stderr
