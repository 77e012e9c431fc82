"""Site-wide activation (profiler/site/templates, docs/guide/site.md): the
sitecustomize route turns the profiler on, in summary mode, for a real 2-rank
mpirun job that asked for nothing, which leaves its trace, its record beside
it and in the store; HOROVOD_PROFILE=0 opts out; the .pth route and the Slurm
TaskProlog set the same variables only where the job did not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import mpirun, requires_mpi

from profiler.site.record import RECORD_NAME, loads
from profiler.site.store import DirStore

TEMPLATES = Path(__file__).resolve().parent.parent / "profiler" / "site" / "templates"
JOB = """\
from mpi4py import MPI
import numpy as np
a = np.ones(1000)
for _ in range(40):
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)
assert a[0] == MPI.COMM_WORLD.size ** 40
"""


@requires_mpi
@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_sitecustomize_profiles_every_job_and_the_opt_out_works(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    store = tmp_path / "store"
    store.mkdir()
    env = {"PYTHONPATH": str(TEMPLATES), "HOROVOD_PROFILE_STORE": str(store),
           "HOROVOD_PROFILE_RECORD_TIMEOUT": "20"}
    out = tmp_path / "on"
    out.mkdir()
    p = mpirun(2, [sys.executable, str(tmp_path / "job.py")], env=env, cwd=out)
    dirs = list(out.glob("horovod-profile-*"))
    assert len(dirs) == 1, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("horovod-profiler:")]
    assert len(lines) == 1 and "trace written to" in lines[0] and "summary mode" in lines[0]
    deadline = time.monotonic() + 30  # the exit merge may finish after mpirun returns
    while time.monotonic() < deadline and not DirStore(store).select().records:
        time.sleep(0.2)
    stored = DirStore(store).select().records
    beside = loads((dirs[0] / RECORD_NAME).read_bytes())
    assert stored == [beside]
    assert (beside["mode"], beside["ranks"], beside["job"]["name"]) == ("summary", 2, "job.py")
    assert beside["settings"] == {"HOROVOD_PROFILE": "summary"}
    calls = {(o["kind"], o["op"]): o["calls"] for o in beside["ops"]}
    assert calls[("data", "allreduce")] >= 2 * 40
    # opt out: the same job with HOROVOD_PROFILE=0 leaves nothing
    off = tmp_path / "off"
    off.mkdir()
    p = mpirun(2, [sys.executable, str(tmp_path / "job.py")], env={**env, "HOROVOD_PROFILE": "0"},
               cwd=off)
    assert list(off.iterdir()) == [] and "horovod-profiler" not in p.stderr


@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_RANK": "0"}, "summary"),
    ({"SLURM_PROCID": "3"}, "summary"),
    ({"OMPI_COMM_WORLD_RANK": "0", "HOROVOD_PROFILE": "0"}, "0"),
    ({"PMIX_RANK": "1", "HOROVOD_PROFILE": "1"}, "1"),
    ({}, "None"),  # not a rank: nothing
    ({"OMPI_COMM_WORLD_RANK": "0", "ARGS": "-m profiler.site.record"}, "None"),  # our own
])
def test_the_pth_route_sets_summary_mode_for_ranks_only(env: dict[str, str],
                                                          expected: str) -> None:
    base = {k: v for k, v in os.environ.items() if k not in (
        "HOROVOD_PROFILE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")}
    p = subprocess.run([sys.executable, "-S", "-c",
                        "import os, site; site.addsitedir(os.environ['T']); "
                        "print(os.environ.get('HOROVOD_PROFILE'))", *env.pop("ARGS", "").split()],
                       env={**base, **env, "T": str(TEMPLATES)}, capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0 and p.stdout.strip() == expected, p.stderr


def test_slurm_task_prolog_keeps_the_jobs_own_choice() -> None:
    script = TEMPLATES / "slurm-taskprolog.sh"
    clean = {"PATH": os.environ["PATH"]}
    p = subprocess.run(["sh", str(script)], env=clean, capture_output=True, text=True)
    assert p.stdout.splitlines() == ["export HOROVOD_PROFILE=summary",
                                     "export HOROVOD_PROFILE_STORE=/shared/horovod-profiler/store"]
    p = subprocess.run(["sh", str(script)], env={**clean, "HOROVOD_PROFILE": "0",
                                                 "HOROVOD_PROFILE_STORE": "/mine"},
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == ""


@pytest.mark.skipif(shutil.which("tclsh") is None,
                    reason="tclsh not installed (apt-get install tcl)")
def test_the_module_file_is_valid_tcl_setting_summary_unless_set() -> None:
    """The modulefile's logic under a stand-in for environment-modules' setenv."""
    prog = ('proc setenv {k v} {puts "$k=$v"}; proc module-whatis {args} {}; '
            f'source {TEMPLATES / "horovod-profiler.modulefile"}')
    run = lambda env: subprocess.run(["tclsh"], input=prog, env=env, capture_output=True,  # noqa: E731
                                     text=True, timeout=30)
    p = run({"PATH": os.environ["PATH"]})
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["HOROVOD_PROFILE=summary",
                                     "HOROVOD_PROFILE_STORE=/shared/horovod-profiler/store"]
    p = run({"PATH": os.environ["PATH"], "HOROVOD_PROFILE": "0"})
    assert p.stdout.splitlines() == ["HOROVOD_PROFILE_STORE=/shared/horovod-profiler/store"]
