"""`profiler bench`: a collective microbenchmark whose output is a profiler trace.

The sweep (:mod:`profiler.bench.sweep`) runs under mpirun with mpi4py on CPU
buffers (or cupy's NCCL on GPUs), prints nccl-tests' columns on rank 0 and is
recorded by the profiler itself (HOROVOD_PROFILE=1, HOROVOD_PROFILE_DIR=DIR):
the trace in DIR is the benchmark's result, loadable with profiler.analysis.

This module holds what the command line needs before launching: size lists,
replay plans from an application's trace (``--sizes-from``), the interconnect
switch (``--transport``) and the launch itself.  It stays light to import
(pandas only inside :func:`plan_from_trace`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from profiler.analysis.interconnect import FABRIC_ENV, TRANSPORTS, Fabric
from profiler.errors import NotFoundError, UsageError

__all__ = [
    "TRANSPORTS", "parse_size", "parse_sizes", "default_sizes", "plan_from_frame",
    "plan_from_trace", "write_plan", "transport_env", "sweep_command",
    "run_bench", "run_bench_on_hosts", "under_mpi", "FABRIC_ENV",
]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
# collectives the MPI sweep can run, and NCCL op names mapped to them for replay
MPI_COLLECTIVES = ("allreduce", "iallreduce", "reduce", "bcast", "allgather", "allgatherv",
                   "gather", "alltoall", "alltoallv", "reduce_scatter",
                   "reduce_scatter_block", "barrier")
NCCL_COLLECTIVES = ("allreduce", "bcast", "reduce", "allgather", "reduce_scatter")
_FROM_NCCL = {"nccl_allreduce": "allreduce", "nccl_broadcast": "bcast", "nccl_bcast": "bcast",
              "nccl_reduce": "reduce", "nccl_allgather": "allgather",
              "nccl_reducescatter": "reduce_scatter"}
_NOT_REPLAYED = {"gatherv", "init", "finalize", "step", "mark", "sync", "tensor", "cpu", "join",
                 "nccl_send", "nccl_recv", "nccl_group", "none"}


def parse_size(text: str) -> int:
    """'8' -> 8, '1K' / '1KiB' -> 1024, '1.5M' -> 1572864 (binary units)."""
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(None, f"bad size {text!r} (examples: 8, 1536, 64K, 1.5M, 1G)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value != int(value):
        raise UsageError(None, f"size {text!r} is not a whole number of bytes")
    return int(value)


def default_sizes(lo: int, hi: int, between: int = 1) -> list[int]:
    """Powers of two from lo to hi, plus `between` evenly spaced sizes inside each
    octave (between=1: 1.5 x 2^k), all rounded to multiples of 4 bytes."""
    if lo <= 0 or hi < lo:
        raise UsageError(None, f"bad size range {lo}:{hi}")
    if between < 0:
        raise UsageError(None, "--between must be >= 0")
    out: set[int] = set()
    p = 1
    while p < lo:
        p <<= 1
    while p <= hi:
        out.add(p)
        for i in range(1, between + 1):
            s = p + (p * i) // (between + 1)
            s -= s % 4
            if lo <= s <= hi and s > p:
                out.add(s)
        p <<= 1
    return sorted(out)


def parse_sizes(text: str, between: int = 1) -> list[int]:
    """A comma list of sizes and/or ranges 'LO:HI' (powers of two plus in-between)."""
    sizes: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            lo, hi = part.split(":", 1)
            sizes.update(default_sizes(parse_size(lo), parse_size(hi), between))
        else:
            sizes.add(parse_size(part))
    if not sizes:
        raise UsageError(None, "--sizes: no size given")
    return sorted(sizes)


def plan_from_frame(df: Any, *, backend: str = "mpi") -> list[dict[str, Any]]:
    """Replay plan from a trace frame: the application's data calls as one rank made
    them (the lowest rank), grouped by (op, count, dtype, dtype size, communicator
    size) with their number of calls.  Control calls and application rows are not
    replayed; nor are ops the sweep cannot run (gatherv, NCCL send/recv)."""
    from profiler.analysis._frame import calls, lowest_rank_view

    data = lowest_rank_view(calls(df, kinds=("data",)))
    allowed = NCCL_COLLECTIVES if backend == "nccl" else MPI_COLLECTIVES
    entries: list[dict[str, Any]] = []
    if data.empty:
        return entries
    ops = data["op"].astype(str).map(lambda o: _FROM_NCCL.get(o, o))
    work = data.assign(op_r=ops.to_numpy(), dtype_s=data["dtype"].astype(str).to_numpy())
    skipped: dict[str, int] = {}
    g = work.groupby(["op_r", "count", "dtype_s", "dtype_size", "comm_size"], sort=True,
                     observed=True).size()
    for (op, count, dtype, dsize, csize), n in g.items():
        if op in _NOT_REPLAYED or op not in allowed:
            skipped[str(op)] = skipped.get(str(op), 0) + int(n)
            continue
        entries.append({"op": str(op), "count": int(count), "dtype_size": int(dsize) or 1,
                        "calls": int(n), "dtype": str(dtype), "comm_size": int(csize)})
    if skipped:
        print("profiler bench: not replayed: " + ", ".join(
            f"{op} ({n} calls)" for op, n in sorted(skipped.items())), file=sys.stderr)
    return entries


def plan_from_trace(path: str | os.PathLike[str], *, backend: str = "mpi"
                    ) -> list[dict[str, Any]]:
    from profiler.analysis import load

    df = load(path, columns=["rank", "backend", "op", "bytes", "count", "dtype", "dtype_size",
                             "comm_size", "kind", "device", "dur_ns"])
    plan = plan_from_frame(df, backend=backend)
    if not plan:
        raise UsageError(path, "no data calls to replay in this trace")
    return plan


def write_plan(entries: Sequence[Mapping[str, Any]], path: Path, source: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"source": source, "entries": list(entries)}, indent=1))


def transport_env(transport: str | None) -> dict[str, str]:
    if not transport:
        return {}
    if transport not in TRANSPORTS:
        raise UsageError(None, f"--transport must be one of {', '.join(TRANSPORTS)}, "
                               f"got {transport!r}")
    return dict(TRANSPORTS[transport])


def under_mpi() -> bool:
    """True when this process is already a rank of an MPI job."""
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                         "MV2_COMM_WORLD_SIZE"))


def sweep_command(*, np: int, mpirun: str, mpirun_args: Sequence[str],
                  sweep_args: Sequence[str]) -> list[str]:
    exe = shutil.which(mpirun) if os.sep not in mpirun else mpirun
    if not exe or not Path(exe).exists():
        raise NotFoundError(mpirun, "mpirun not found (install Open MPI or pass --mpirun)")
    return [exe, "-n", str(np), *mpirun_args, sys.executable, "-m", "profiler.bench.sweep",
            *sweep_args]


def run_bench(cmd: Sequence[str], *, out_dir: Path, extra_env: Mapping[str, str],
              timeout: float) -> int:
    """Launch the sweep with profiling on into out_dir; returns mpirun's exit status."""
    env = dict(os.environ)
    env.update(extra_env)
    env["HOROVOD_PROFILE"] = "1"
    env["HOROVOD_PROFILE_DIR"] = str(out_dir.resolve())
    try:
        proc = subprocess.run(list(cmd), env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UsageError(None, f"benchmark did not finish within {timeout:g} s "
                               "(raise --timeout)") from None
    return proc.returncode


def run_bench_on_hosts(fabric: Fabric, *, np: int, out_dir: Path, sweep_args: Sequence[str],
                       extra_env: Mapping[str, str], mpirun_args: Sequence[str] = (),
                       timeout: float) -> int:
    """The sweep across `fabric.hosts` simulated hosts (profiler.bench.simcluster: one
    network namespace per host, veth links through a bridge, tbf at `fabric.rate`
    on both ends of every link), Open MPI over TCP (btl tcp,self, pml ob1), ranks
    spread evenly; profiled into out_dir.  Ranks blocked in MPI yield the CPU
    (OMPI_MCA_mpi_yield_when_idle=1, recorded in the trace's environment): the
    simulated hosts and the kernel's packet processing share this machine's
    cores.  Prints rank 0's table; returns mpirun's exit status."""
    from profiler.bench import simcluster

    ok, why = simcluster.available(rate=bool(fabric.rate))
    if not ok:
        raise UsageError(None, f"--fabric {fabric.name} needs simulated hosts: {why}")
    per_host = -(-np // fabric.hosts)
    env = {**extra_env, "HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(out_dir.resolve()),
           "HOROVOD_PROFILE_MERGE_TIMEOUT": "60", "OMPI_MCA_mpi_yield_when_idle": "1"}
    try:
        with simcluster.SimCluster(hosts=fabric.hosts, rate=fabric.rate,
                                   slots=per_host) as c:
            p = c.mpirun(np, [sys.executable, "-P", "-m", "profiler.bench.sweep", *sweep_args],
                         env=env, timeout=timeout, per_host=per_host, cwd=out_dir.resolve(),
                         extra=list(mpirun_args))
    except subprocess.TimeoutExpired:
        raise UsageError(None, f"benchmark did not finish within {timeout:g} s "
                               "(raise --timeout)") from None
    except simcluster.SimClusterError as exc:
        raise UsageError(None, f"--fabric {fabric.name}: {exc}") from None
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
    return p.returncode
