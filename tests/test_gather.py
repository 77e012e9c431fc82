"""Every rank's data at rank 0 when the hosts share no disk (profiler.postjob.gather,
hooks/mpi_gather.c), on simulated hosts whose profile folder is private: each
host is a mount namespace with a folder of its own bound at the same path, as
node-local scratch or Kubernetes pods give.

* MPI (mpirun, mpi4py, 3 hosts x 2 ranks): rank 0's folder ends with one
  complete trace, no command run by hand: rank 1 (rank 0's host) sent
  nothing, ranks 2-5 sent their files over MPI at MPI_Finalize with the
  facts only their process knew; their hosts converted nothing.
* The null, a shared folder: nothing moves, the metadata says none was
  gathered.
* Gloo (horovodrun --gloo, 3 hosts x 1 rank): the same over TCP to rank 0's
  exit merge, found through horovodrun's rendezvous server; the ranks'
  own datasets come along.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, requires_mpi
from simcluster_fixture import ClusterFactory, sim_cluster  # noqa: F401 (fixture)

from profiler.formats.raw import read_header

pytestmark = [requires_mpi, pytest.mark.mpi]

JOB = Path(__file__).with_name("cluster_job.py")
N = 12
GLOO_JOB = r"""
import torch
import horovod.torch as hvd

hvd.init()
for i in range(N):
    out = hvd.allreduce(torch.full((1000,), float(hvd.rank())), name=f"t{i}")
print("RESULT", hvd.rank(), float(out[0]), flush=True)
"""


def trace_meta(prof: Path) -> dict[str, Any]:
    return json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]


def env_for(prof: Path) -> dict[str, str]:
    return {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
            "HOROVOD_PROFILE_MERGE_TIMEOUT": "60"}


def test_mpi_job_without_a_shared_disk_ends_with_one_trace(
        sim_cluster: ClusterFactory, tmp_path: Path) -> None:  # noqa: F811
    prof = tmp_path / "prof"
    c = sim_cluster(hosts=3, slots=2, private=prof)
    p = c.mpirun(6, [PYTHON, str(JOB), str(N)], env=env_for(prof), cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert p.stdout.count("RESULT OK") == 6
    said = [x for x in p.stderr.splitlines() if "horovod-profiler" in x]
    assert said == [f"horovod-profiler: trace written to {prof}/trace.json (6 ranks, "
                    f"{6 * (2 * N + 3)} calls; rank(s) 2-5 gathered from 2 other host(s) "
                    "over MPI)"], p.stderr[-3000:]
    assert not prof.exists() or not list(prof.iterdir())  # nothing at the shared path

    home = c.private_dir(0)
    meta = trace_meta(home)
    assert meta["missing_ranks"] == [] and meta["partial_ranks"] == []
    assert [(r["rank"], r["host"]) for r in meta["ranks"]] == [
        (0, "h0"), (1, "h0"), (2, "h1"), (3, "h1"), (4, "h2"), (5, "h2")]
    assert {r["calls"] for r in meta["ranks"]} == {2 * N + 3}  # init, N x 2, barrier, finalize
    g = meta["gathered"]
    assert (g["over"], g["ranks"], g["hosts"]) == ("mpi", [2, 3, 4, 5], ["h1", "h2"])
    # each rank's raw file, CPU and MPI sidecars, and facts; the raw files whole
    assert g["files"] == 4 * 4 and g["bytes"] > 0
    for r in (2, 3, 4, 5):
        mine = c.private_dir(r // 2) / "raw" / f"rank-{r:05d}.hvprof"
        assert (home / "raw" / mine.name).stat().st_size == mine.stat().st_size
    for r in (2, 3, 4, 5):
        # the copy is closed and was converted by the merge, with the facts
        # its process wrote before its files left
        h = read_header(home / "raw" / f"rank-{r:05d}.hvprof")
        assert h["self_converts"] == 0 and h["hostname"] == f"h{r // 2}"
        rm = json.loads((home / "ranks" / f"rank-{r:05d}.json").read_bytes())
        assert rm["argv"] and rm["argv"][-1] == str(N)
        assert rm["executable"] and "HOROVOD_PROFILE" in rm["env"]
        assert rm["interconnect"] is not None  # the MPI library's sidecar came along
        assert rm["source"]["converted_by"].endswith(" on h0")  # by rank 0's merge
    for h in (1, 2):  # the other hosts converted nothing
        assert not (c.private_dir(h) / "ranks").exists()
        assert not (c.private_dir(h) / "trace.json").exists()


def test_a_shared_disk_moves_nothing(sim_cluster: ClusterFactory,  # noqa: F811
                                     tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    c = sim_cluster(hosts=2, slots=1)
    p = c.mpirun(2, [PYTHON, str(JOB), str(N)], env=env_for(prof), cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    meta = trace_meta(prof)
    assert meta["gathered"] is None and meta["missing_ranks"] == []
    assert not list(prof.glob("raw/*gather*"))
    assert "gathered" not in p.stderr


def test_gloo_job_without_a_shared_disk_ends_with_one_trace(
        sim_cluster: ClusterFactory, tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("horovod.torch")
    prof = tmp_path / "prof"
    job = tmp_path / "job.py"
    job.write_text(f"N = {N}\n" + GLOO_JOB)
    c = sim_cluster(hosts=3, slots=1, private=prof)
    p = c.horovodrun(3, [PYTHON, str(job)], env=env_for(prof), cwd=tmp_path, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert sorted(x.split(":", 1)[-1] for x in p.stdout.splitlines() if "RESULT" in x) == [
        f"RESULT {r} 1.0" for r in range(3)]  # the average of 0, 1, 2
    home = c.private_dir(0)
    meta = trace_meta(home)
    assert meta["missing_ranks"] == [] and meta["world_size"] == 3
    assert [(r["rank"], r["host"]) for r in meta["ranks"]] == [(0, "h0"), (1, "h1"), (2, "h2")]
    g = meta["gathered"]
    assert (g["over"], g["ranks"], g["hosts"]) == ("tcp", [1, 2], ["h1", "h2"])
    for r in (1, 2):
        rm = json.loads((home / "ranks" / f"rank-{r:05d}.json").read_bytes())
        assert rm["source"]["converted_by"] == "self"  # its own dataset came along
        assert rm["host"] == f"h{r}"
    calls = {r["rank"]: r["calls"] for r in meta["ranks"]}
    assert len(set(calls.values())) == 1, calls
    line = [x for x in p.stderr.splitlines() if "trace written to" in x]
    assert len(line) == 1 and "rank(s) 1-2 gathered from 2 other host(s) over TCP" in line[0]
