"""Regenerate tests/data/predict/h2: the job of benchmarks/predict/job.py at
2 simulated hosts (one rank each, the bridge's speed), 10 measured steps,
merged without events and without its raw files (needs root).

    .venv/bin/python tests/data/predict/make_fixture.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE.parent.parent.parent / "benchmarks" / "predict" / "job.py"


def main() -> int:
    from profiler.bench.simcluster import SimCluster

    out = HERE / "h2"
    shutil.rmtree(out, ignore_errors=True)
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(out),
           "HOROVOD_PROFILE_MERGE_TIMEOUT": "60", "OMPI_MCA_mpi_yield_when_idle": "1"}
    with SimCluster(hosts=2, slots=1) as c:
        p = c.mpirun(2, [sys.executable, "-P", str(JOB), "--steps", "10", "--warmup", "3"],
                     env=env, timeout=300, per_host=1)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        return 1
    subprocess.run([sys.executable, "-m", "profiler.cli", "merge", str(out), "--events", "0",
                    "-q"], check=True, cwd="/tmp")
    shutil.rmtree(out / "raw", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
