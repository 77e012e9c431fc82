"""Real Horovod jobs write their records into a store at once (issue 48): four
2-rank jobs started together -- PyTorch over MPI (mpirun), PyTorch over Gloo
(horovodrun --gloo), TensorFlow over MPI, and PyTorch with fusion off -- each
with HOROVOD_PROFILE=1 and the same HOROVOD_PROFILE_STORE, a directory store
or a real PostgreSQL server.  Every record is in the store once, equal to the
one written beside its profile, and says what ran: framework, controller,
settings, steps and the collectives' calls.  (The 64 parallel exit-time
writers are tests/test_site_store.py's; this is the real exit path.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, ROOT, base_env, requires_mpi
from site_fixtures import PG_BIN, Postgres

from profiler.site.record import RECORD_NAME, loads
from profiler.site.store import open_store

HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")
HAVE_TF = importlib.util.find_spec("tensorflow") is not None
BENCH = [PYTHON, "-m", "profiler.workloads.train_bench", "--model", "resnet8",
         "--batch-size", "16", "--image-size", "32", "--num-warmup-batches", "2",
         "--num-batches-per-iter", "4", "--num-iters", "3", "--quiet"]
#: name -> (launcher and command, extra environment, framework in the record)
JOBS: dict[str, tuple[list[str], dict[str, str], str]] = {
    # a cycle long enough for every gradient of a step to be fused, whatever
    # the machine's load (at 1 ms, a loaded machine's slow backward pass hands
    # Horovod one tensor a cycle: as many calls as fusion off)
    "torch-mpi": (["mpirun", "-n", "2", *BENCH], {"HOROVOD_CYCLE_TIME": "20"}, "pytorch"),
    "torch-gloo": ([HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", *BENCH], {},
                   "pytorch"),
    "torch-unfused": (["mpirun", "-n", "2", *BENCH], {"HOROVOD_FUSION_THRESHOLD": "0"},
                      "pytorch"),
    "tf-mpi": (["mpirun", "-n", "2", PYTHON, str(ROOT / "tests" / "tf_loop_job.py"),
                "--out", "result.json", "--steps", "10"], {"TF_CPP_MIN_LOG_LEVEL": "3"},
               "tensorflow"),
}


# Both in the full tier: the directory store's concurrent writers are
# tests/test_site_store.py's (64 at once), the PostgreSQL store's its round trip
# with concurrent writers, and a real job's exit into a store
# tests/test_site_activation.py's; here four real jobs at once (40 s).
@pytest.fixture(params=[pytest.param("directory", marks=pytest.mark.full),
                        pytest.param("postgresql", marks=pytest.mark.full)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "directory":
        (tmp_path / "store").mkdir()
        yield str(tmp_path / "store")
        return
    if not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL server binaries not installed")
    server = Postgres()
    try:
        server.start()
        import psycopg

        from profiler.site.store import PgStore

        with psycopg.connect(server.url("postgres"), autocommit=True) as con:
            con.execute("CREATE ROLE alice LOGIN")
        PgStore(server.url("postgres")).init()
        yield server.url("alice")
    finally:
        server.stop()


def _start(name: str, tmp: Path, store: str) -> tuple[subprocess.Popen[str], Path]:
    argv, extra, _ = JOBS[name]
    work = tmp / name
    work.mkdir()
    prof = work / "profile"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof),
                   HOROVOD_PROFILE_STORE=store, HOROVOD_PROFILE_RECORD_TIMEOUT="240",
                   SLURM_JOB_ID=str(7000 + sorted(JOBS).index(name)), SLURM_JOB_NAME=name,
                   SLURM_JOB_USER="alice", SLURM_JOB_PARTITION="cpu",
                   PATH=os.path.dirname(PYTHON) + os.pathsep + os.environ.get("PATH", ""),
                   **extra)
    return subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True), prof


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not os.path.exists(HOROVODRUN), reason="horovodrun not installed")
def test_four_real_jobs_finishing_together_leave_one_record_each(
        store_url: str, tmp_path: Path) -> None:
    names = [n for n in JOBS if HAVE_TF or not n.startswith("tf-")]
    jobs = {n: _start(n, tmp_path, store_url) for n in names}
    try:
        outs = {n: p.communicate(timeout=420)[0] for n, (p, _) in jobs.items()}
    finally:
        for p, _ in jobs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.communicate(timeout=30)
    for n, (p, _) in jobs.items():
        assert p.returncode == 0, f"{n}: {outs[n][-3000:]}"
        assert "no job record" not in outs[n], outs[n][-2000:]
    # each record beside its profile (the exit merge may end after the launcher)
    beside: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(beside) < len(jobs):
        for n, (_, prof) in jobs.items():
            if n not in beside and (prof / RECORD_NAME).is_file():
                beside[n] = loads((prof / RECORD_NAME).read_bytes())
        time.sleep(0.5)
    assert sorted(beside) == sorted(jobs), sorted(p for _, (_, p) in jobs.items())
    stored = open_store(store_url).select()
    assert stored.skipped == []
    # every record there once, read back exactly as written
    by_name = {r["job"]["name"]: r for r in stored.records}
    assert len(stored.records) == len(jobs) == len(by_name)
    assert by_name == beside
    for n, rec in beside.items():
        assert rec["job"]["scheduler"] == "slurm" and rec["job"]["user"] == "alice", rec["job"]
        assert rec["ranks"] == 2 and rec["steps"] > 0, (n, rec["ranks"], rec["steps"])
        assert rec["versions"]["framework"] == JOBS[n][2], (n, rec["versions"])
        calls = {(o["kind"], o["op"]): o["calls"] for o in rec["ops"]}
        op = "gloo_allreduce" if n.endswith("-gloo") else "allreduce"  # the trace's names
        assert calls.get(("data", op), 0) > 0, (n, calls)
        assert rec["breakdown"], n
    # what ran is told apart: the controller and the fusion setting
    assert beside["torch-gloo"]["settings"].get("HOROVOD_CONTROLLER") == "gloo"
    assert "HOROVOD_CONTROLLER" not in beside["torch-mpi"]["settings"]
    assert beside["torch-unfused"]["settings"].get("HOROVOD_FUSION_THRESHOLD") == "0"
    # fusion off: a data allreduce per gradient instead of a few fused ones
    # (the negotiation's allreduces, kind control, vary with timing: not these)
    per_step = {n: sum(o["calls"] for o in beside[n]["ops"]
                       if (o["kind"], o["op"]) == ("data", "allreduce")) / beside[n]["steps"]
                for n in ("torch-mpi", "torch-unfused")}
    assert per_step["torch-unfused"] >= 3 * per_step["torch-mpi"], per_step
