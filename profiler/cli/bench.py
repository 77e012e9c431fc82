"""`profiler bench -o DIR`: collective microbenchmark recorded as a profiler trace.

    profiler bench -o DIR [--np 2] [--collectives allreduce,bcast] [--sizes 8:4M]
                   [--between 1] [--iters 20] [--warmup 5] [--dtype float32]
                   [--sizes-from app/trace.json] [--backend mpi|nccl]
                   [--transport shm|tcp] [--mpirun mpirun] [--mpirun-args "..."]
                   [--fabric shm|tcp|tcp-10gbit|tcp-1gbit]
    profiler bench --pattern ps --servers 1,2,4 --workers 4 -o DIR
                   [--payload 8M] [--rate 200mbit] [--rounds 2]

Runs `mpirun -n NP python -m profiler.bench.sweep` with HOROVOD_PROFILE=1 and
HOROVOD_PROFILE_DIR=DIR: rank 0 prints nccl-tests' columns (size, count, type,
redop, root, time, algbw, busbw) and the profiler writes DIR/trace.json, which
profiler.analysis loads like any application trace (DIR/bench.json keeps the
parameters and the printed table).

--sizes: comma-separated sizes (8, 1536, 64K, 1.5M) and ranges LO:HI (every
power of two in the range plus --between sizes inside each octave; default
8:1M).  Sizes are the collective's data volume in bytes as the profiler
records it (allgather/gather/alltoall: the gathered total).
--sizes-from TRACE: replay the application's data calls exactly (op, element
count, element size and number of calls, as the trace's lowest rank made them).
--transport shm|tcp: Open MPI over shared memory (btl vader,self) or TCP
loopback (btl tcp,self), with pml ob1; the trace's metadata records the setting.
--fabric NAME: an emulated interconnect (profiler.analysis.interconnect.FABRICS):
shm (one host, shared memory), tcp (2 simulated hosts, TCP over veth, no rate
limit), tcp-10gbit / tcp-1gbit (the same with tbf on every link: 10 GbE, 1 GbE
bandwidth; latency is not emulated, netem is not in this kernel).  Ranks are
spread over the simulated hosts (needs root); the trace's metadata records
the fabric (HOROVOD_BENCH_FABRIC).  scripts/fabrics.sh runs all four.
--backend nccl: cupy's NCCL on one GPU per rank (needs cupy and a GPU).
Already inside an MPI job (launched by mpirun), the sweep runs in this process.
--pattern ps: parameter-server push+pull (sharded parameters, point-to-point
messages) through server ranks on simulated hosts of their own, beside
MPI_Allreduce of the same payload on the same rate-limited links; prints the
table of the MXNet design proposal "Extend MXNet Distributed Training by MPI
AllReduce" for this cluster, the proposal's figures beside (profiler.bench.ps;
needs root for namespaces).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

DEFAULT_SIZES = "8:1M"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "bench", help="collective sweep (nccl-tests columns) recorded as a trace",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="profile directory to create (holds trace.json afterwards)")
    p.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--collectives", default="allreduce",
                   help="comma-separated: allreduce, iallreduce, reduce, bcast, allgather, "
                        "allgatherv, gather, alltoall, alltoallv, reduce_scatter, "
                        "reduce_scatter_block, barrier (default allreduce)")
    p.add_argument("--sizes", default=None, help=f"sizes and ranges (default {DEFAULT_SIZES})")
    p.add_argument("--between", type=int, default=1,
                   help="in-between sizes per octave in ranges (default 1: 1.5 x 2^k)")
    p.add_argument("--sizes-from", default=None, metavar="TRACE",
                   help="replay the message sizes and counts of an application trace")
    p.add_argument("--iters", type=int, default=20, help="recorded calls per size (default 20)")
    p.add_argument("--warmup", type=int, default=5,
                   help="unrecorded warm-up calls per size (default 5)")
    p.add_argument("--dtype", default="float32",
                   choices=("float32", "float64", "int32", "int64", "float16", "uint8"))
    p.add_argument("--backend", choices=("mpi", "nccl"), default="mpi")
    p.add_argument("--transport", choices=("shm", "tcp"), default=None,
                   help="Open MPI transport: shared memory or TCP loopback")
    p.add_argument("--fabric", choices=("shm", "tcp", "tcp-10gbit", "tcp-1gbit"), default=None,
                   help="emulated interconnect: shared memory, or TCP between simulated "
                        "hosts, unlimited or tbf-limited (needs root)")
    p.add_argument("--mpirun", default="mpirun", help="MPI launcher (default mpirun)")
    p.add_argument("--mpirun-args", default="", help="extra launcher arguments (one string)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds before the run is abandoned (default 900)")
    _add_ps_arguments(p)
    return p


def _add_ps_arguments(p: argparse.ArgumentParser) -> None:
    """--pattern ps: parameter server against MPI_Allreduce on simulated hosts
    (profiler/bench/ps.py)."""
    g = p.add_argument_group("--pattern ps (parameter server vs MPI_Allreduce on simulated "
                             "hosts; needs root)")
    g.add_argument("--pattern", choices=("sweep", "ps"), default="sweep",
                   help="sweep: the collective sweep (default); ps: push+pull through "
                        "server ranks beside MPI_Allreduce, the table of the MXNet "
                        "proposal \"Extend MXNet Distributed Training by MPI AllReduce\"")
    g.add_argument("--servers", default="1,2,4", help="server counts (default 1,2,4)")
    g.add_argument("--workers", type=int, default=4, help="workers (default 4)")
    g.add_argument("--payload", default="8M", help="parameter bytes (default 8M)")
    g.add_argument("--rate", default="200mbit", help="per-link rate, tbf (default 200mbit)")
    g.add_argument("--rounds", type=int, default=2, help="timed rounds (default 2)")
    g.add_argument("--allreduce-algorithm", choices=("ring", "default"), default="ring")


def _check_nccl() -> None:
    from profiler.errors import UsageError

    try:
        import cupy  # type: ignore[import-not-found]

        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        raise UsageError(None, "--backend nccl needs cupy with a CUDA GPU "
                               f"({type(exc).__name__}: {exc})") from None
    if n < 1:
        raise UsageError(None, "--backend nccl needs a CUDA GPU; none found")


def run(args: argparse.Namespace) -> int:
    from profiler import bench
    from profiler.errors import UsageError

    if getattr(args, "pattern", "sweep") == "ps":
        from profiler.bench import ps

        return ps.run_from_args(args)

    dtype_size = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "float16": 2,
                  "uint8": 1}[args.dtype]
    if args.np < 1:
        raise UsageError(None, "--np must be >= 1")
    if args.iters < 1 or args.warmup < 0:
        raise UsageError(None, "--iters must be >= 1 and --warmup >= 0")
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UsageError(out, "exists and is not a directory")
    if out.is_dir() and any((out / sub).exists() for sub in ("raw", "ranks", "trace.json")):
        raise UsageError(out, "already holds a profile; choose a new directory")
    if args.backend == "nccl":
        _check_nccl()
    fabric = None
    if args.fabric:
        from profiler.analysis.interconnect import FABRICS

        fabric = FABRICS[args.fabric]
        if args.transport and args.transport != fabric.transport:
            raise UsageError(None, f"--fabric {fabric.name} uses --transport "
                                   f"{fabric.transport}; give one of them")
        if args.backend != "mpi":
            raise UsageError(None, "--fabric needs --backend mpi")
        args.transport = fabric.transport
    allowed = bench.NCCL_COLLECTIVES if args.backend == "nccl" else bench.MPI_COLLECTIVES
    sweep_args = ["--iters", str(args.iters), "--warmup", str(args.warmup),
                  "--dtype", args.dtype, "--backend", args.backend, "--out",
                  str(out.resolve()), "--transport", args.transport or ""]
    if args.sizes_from:
        if args.sizes:
            raise UsageError(None, "give --sizes or --sizes-from, not both")
        plan = bench.plan_from_trace(args.sizes_from, backend=args.backend)
        plan_path = out.resolve() / "bench-plan.json"
        bench.write_plan(plan, plan_path, str(args.sizes_from))
        sweep_args += ["--plan", str(plan_path)]
    else:
        ops = [o.strip() for o in args.collectives.split(",") if o.strip()]
        bad = [o for o in ops if o not in allowed]
        if not ops or bad:
            raise UsageError(None, f"--collectives: unknown or unsupported {', '.join(bad)!s} "
                                   f"for --backend {args.backend} (choose from "
                                   f"{', '.join(allowed)})")
        sizes = bench.parse_sizes(args.sizes or DEFAULT_SIZES, args.between)
        odd = [s for s in sizes if s % dtype_size]
        if odd:
            raise UsageError(None, f"--sizes: {odd[0]} B is not a multiple of the "
                                   f"{args.dtype} element size ({dtype_size} B)")
        sweep_args += ["--collectives", ",".join(ops), "--sizes", ",".join(map(str, sizes))]
    env = bench.transport_env(args.transport)
    if fabric is not None:
        env[bench.FABRIC_ENV] = fabric.name
    if fabric is not None and fabric.hosts > 1:
        if bench.under_mpi():
            raise UsageError(None, f"--fabric {fabric.name} launches its own job on "
                                   "simulated hosts; run it outside mpirun")
        out.mkdir(parents=True, exist_ok=True)
        rc = bench.run_bench_on_hosts(fabric, np=args.np, out_dir=out, sweep_args=sweep_args,
                                      extra_env={bench.FABRIC_ENV: fabric.name},
                                      mpirun_args=shlex.split(args.mpirun_args),
                                      timeout=args.timeout)
        if rc != 0:
            print(f"profiler: error: benchmark failed: mpirun exited with status {rc}",
                  file=sys.stderr)
            return 1
        print(f"profiler: bench trace: {out / 'trace.json'} ({fabric.label})", file=sys.stderr)
        return 0
    if bench.under_mpi():
        # already a rank of an MPI job (mpirun ... profiler bench): MPI is not initialized
        # yet, so the transport and the profile directory still take effect here; the
        # profiler records only if the job was started with HOROVOD_PROFILE=1
        import os

        from profiler.bench import sweep

        os.environ.update(env)
        os.environ.setdefault("HOROVOD_PROFILE_DIR", str(out.resolve()))
        return sweep.main(sweep_args)
    cmd = bench.sweep_command(np=args.np, mpirun=args.mpirun,
                              mpirun_args=shlex.split(args.mpirun_args),
                              sweep_args=sweep_args)
    out.mkdir(parents=True, exist_ok=True)
    import os

    os.environ.update(env)  # a fallback merge in this process records the same settings
    rc = bench.run_bench(cmd, out_dir=out, extra_env=env, timeout=args.timeout)
    if rc != 0:
        print(f"profiler: error: benchmark failed: mpirun exited with status {rc}",
              file=sys.stderr)
        return 1
    trace = out / "trace.json"
    if not trace.is_file():
        from profiler.postjob.merge import merge

        merge(out)
    print(f"profiler: bench trace: {trace}", file=sys.stderr)
    return 0
