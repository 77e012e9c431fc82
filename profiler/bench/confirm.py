"""The replay behind `profiler advise --confirm`: the message sizes a run
flagged, and their neighbours, measured alone by the collective sweep
(profiler.bench.sweep) with the job's own MPI settings (the OMPI_MCA_*,
MPICH_* and UCX_* variables its ranks recorded), so that a size slow by itself
can be told from a size that was slow only when its calls ran."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from profiler.errors import UsageError

__all__ = ["job_mpi_env", "replay"]

#: Variables of the job's environment that choose the MPI library's behaviour.
MPI_PREFIXES = ("OMPI_MCA_", "MPICH_", "MPIR_CVAR_", "UCX_")


def job_mpi_env(meta: Mapping[str, Any]) -> dict[str, str]:
    """The MPI settings the job's ranks ran with (rank 0's recorded environment)."""
    env = meta.get("env") or {}
    return {str(k): str(v) for k, v in env.items()
            if str(k).startswith(MPI_PREFIXES) and v is not None}


def replay(sizes: Sequence[int], *, np: int, out_dir: Path, job_env: Mapping[str, str],
           iters: int = 40, warmup: int = 5, timeout: float = 600.0,
           mpirun: str = "mpirun") -> Path:
    """Run the allreduce sweep over `sizes` (bytes, float32) at `np` local ranks
    into `out_dir`, profiled; returns its trace.json.  Its table goes to
    out_dir/replay.log."""
    from profiler import bench

    if not sizes:
        raise UsageError(None, "--confirm: no message size to replay")
    odd = [s for s in sizes if s % 4]
    if odd:
        raise UsageError(None, f"--confirm: {odd[0]} B is not a whole number of float32s")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["--iters", str(iters), "--warmup", str(warmup), "--dtype", "float32",
            "--backend", "mpi", "--out", str(out_dir.resolve()), "--transport", "",
            "--collectives", "allreduce", "--sizes", ",".join(str(int(s)) for s in sizes)]
    cmd = bench.sweep_command(np=np, mpirun=mpirun, mpirun_args=[], sweep_args=args)
    env = dict(os.environ)
    env.update(job_env)
    env["HOROVOD_PROFILE"] = "1"
    env["HOROVOD_PROFILE_DIR"] = str(out_dir.resolve())
    if os.geteuid() == 0:  # the profiler's own launch; Open MPI refuses root unless told
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    log = out_dir / "replay.log"
    try:
        with log.open("w") as fh:
            proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UsageError(None, f"--confirm: the replay did not finish within {timeout:g} s "
                               f"(see {log})") from None
    trace = out_dir / "trace.json"
    if proc.returncode != 0:
        raise UsageError(None, f"--confirm: the replay failed: mpirun exited with status "
                               f"{proc.returncode} (see {log})")
    if not trace.is_file():
        from profiler.postjob.merge import merge

        merge(out_dir)
    if not trace.is_file():
        raise UsageError(None, f"--confirm: the replay wrote no trace (see {log})")
    print(f"profiler: replayed {len(sizes)} sizes alone at {np} ranks: {trace}",
          file=sys.stderr)
    return trace
