"""Every MPI collective a known number of times at given sizes, through mpi4py.

A non-Horovod example for the profiler and a fixture for exact-count tests::

    HOROVOD_PROFILE=1 mpirun -n 2 python -m profiler.workloads.mpi4py_collectives \\
        --sizes 8,1024,65536 --repeat 3

For each size S (bytes per rank, rounded down to whole elements of --dtype, at
least one element unless S is 0) and each repetition, every selected collective is called
once, in the order of OPS, on MPI_COMM_WORLD.  ``count`` below is S / element
size; it is the per-rank count argument given to MPI:

    allreduce             Allreduce(count)            (MPI_IN_PLACE with --in-place)
    iallreduce            Iallreduce(count) + Wait
    reduce                Reduce(count, root 0)
    bcast                 Bcast(count, root 0)
    allgather             Allgather(sendcount = count)
    allgatherv            Allgatherv(sendcount = count, recvcounts = [count] * P)
    gather                Gather(sendcount = count, root 0)
    gatherv               Gatherv(sendcount = count, recvcounts = [count] * P, root 0)
    alltoall              Alltoall(sendcount = count per peer)
    alltoallv             Alltoallv(sendcounts = [count] * P)
    reduce_scatter        Reduce_scatter(recvcounts = [count] * P)
    reduce_scatter_block  Reduce_scatter_block(recvcount = count)
    barrier               Barrier()   (once per repetition, not per size)

Reductions use MPI_SUM.  Results are checked (a wrong sum fails the run).
Rank 0 prints one line ``MANIFEST {json}``: per op, the number of calls and
the (count, dtype) of each, so tests derive their expectations from it.
With ``--mark-steps`` each repetition is one ``profiler.step`` (images 0 or
``--images-per-step``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

OPS = (
    "allreduce", "iallreduce", "reduce", "bcast", "allgather", "allgatherv",
    "gather", "gatherv", "alltoall", "alltoallv", "reduce_scatter",
    "reduce_scatter_block", "barrier",
)
DTYPES = {"float32": "MPI_FLOAT", "float64": "MPI_DOUBLE", "int32": "MPI_INT",
          "int64": "MPI_LONG", "uint8": "MPI_UNSIGNED_CHAR"}


def parse_sizes(text: str) -> list[int]:
    """"8,1K,64KiB,1M" -> bytes.  Suffixes K/M/G (and KiB/MiB/GiB) are powers of 1024."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low = part.lower().removesuffix("ib").removesuffix("b")
        mult = 1
        if low and low[-1] in "kmg":
            mult = 1024 ** ("kmg".index(low[-1]) + 1)
            low = low[:-1]
        try:
            value = int(low) * mult
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a size: {part!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"negative size: {part!r}")
        out.append(value)
    if not out:
        raise argparse.ArgumentTypeError("no sizes given")
    return out


def parse_ops(text: str) -> list[str]:
    ops = [o.strip() for o in text.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown op(s) {', '.join(unknown)}; choose from {', '.join(OPS)}"
        )
    return ops


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m profiler.workloads.mpi4py_collectives",
        description="Call every MPI collective a known number of times at given sizes.",
    )
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("8,1K,64K"),
                   help="comma-separated payload sizes in bytes per rank (K/M suffixes)")
    p.add_argument("--repeat", type=int, default=2, help="repetitions of the whole sweep")
    p.add_argument("--ops", type=parse_ops, default=list(OPS),
                   help="comma-separated subset of: " + ",".join(OPS))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--in-place", action="store_true", help="Allreduce with MPI_IN_PLACE")
    p.add_argument("--mark-steps", action="store_true",
                   help="mark each repetition as a profiler step")
    p.add_argument("--images-per-step", type=int, default=0)
    args = p.parse_args(argv)
    if args.repeat < 0:
        p.error("--repeat must be >= 0")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the sweep; returns the manifest (the same on every rank)."""
    from mpi4py import MPI

    from profiler.collect import steps as prof_steps

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dt = np.dtype(args.dtype)
    calls: dict[str, list[dict[str, Any]]] = {op: [] for op in args.ops}

    def note(op: str, count: int) -> None:
        calls[op].append({"count": count, "dtype": DTYPES[args.dtype]})

    def check(ok: bool, op: str) -> None:
        if not ok:
            raise SystemExit(f"mpi4py_collectives: rank {rank}: wrong result from {op}")

    def one(op: str, count: int) -> None:
        send = np.full(count, rank + 1, dtype=dt)
        total = size * (size + 1) // 2  # sum over ranks of (rank + 1)
        if op == "allreduce":
            if args.in_place:
                buf = send.copy()
                comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            else:
                buf = np.empty(count, dtype=dt)
                comm.Allreduce(send, buf, op=MPI.SUM)
            check(bool(np.all(buf == total)), op)
        elif op == "iallreduce":
            buf = np.empty(count, dtype=dt)
            comm.Iallreduce(send, buf, op=MPI.SUM).Wait()
            check(bool(np.all(buf == total)), op)
        elif op == "reduce":
            rbuf = np.empty(count, dtype=dt) if rank == 0 else None
            comm.Reduce(send, rbuf, op=MPI.SUM, root=0)
            check(rbuf is None or bool(np.all(rbuf == total)), op)
        elif op == "bcast":
            buf = np.full(count, 7 if rank == 0 else 0, dtype=dt)
            comm.Bcast(buf, root=0)
            check(bool(np.all(buf == 7)), op)
        elif op in ("allgather", "allgatherv"):
            buf = np.empty(count * size, dtype=dt)
            if op == "allgather":
                comm.Allgather(send, buf)
            else:
                comm.Allgatherv(send, [buf, [count] * size])
            want = np.repeat(np.arange(1, size + 1, dtype=dt), count)
            check(bool(np.array_equal(buf, want)), op)
        elif op in ("gather", "gatherv"):
            gbuf = np.empty(count * size, dtype=dt) if rank == 0 else None
            if op == "gather":
                comm.Gather(send, gbuf, root=0)
            else:
                comm.Gatherv(send, [gbuf, [count] * size] if gbuf is not None else None, root=0)
            if gbuf is not None:
                want = np.repeat(np.arange(1, size + 1, dtype=dt), count)
                check(bool(np.array_equal(gbuf, want)), op)
        elif op in ("alltoall", "alltoallv"):
            sbuf = np.full(count * size, rank + 1, dtype=dt)
            rbuf = np.empty(count * size, dtype=dt)
            if op == "alltoall":
                comm.Alltoall(sbuf, rbuf)
            else:
                comm.Alltoallv([sbuf, [count] * size], [rbuf, [count] * size])
            want = np.repeat(np.arange(1, size + 1, dtype=dt), count)
            check(bool(np.array_equal(rbuf, want)), op)
        elif op in ("reduce_scatter", "reduce_scatter_block"):
            sbuf = np.full(count * size, rank + 1, dtype=dt)
            rbuf = np.empty(count, dtype=dt)
            if op == "reduce_scatter":
                comm.Reduce_scatter(sbuf, rbuf, recvcounts=[count] * size, op=MPI.SUM)
            else:
                comm.Reduce_scatter_block(sbuf, rbuf, op=MPI.SUM)
            check(bool(np.all(rbuf == total)), op)
        else:  # pragma: no cover - parse_ops rejects anything else
            raise ValueError(op)

    counts = [max(1, s // dt.itemsize) if s > 0 else 0 for s in args.sizes]
    sweep = [(op, count) for count in counts for op in args.ops if op != "barrier"]
    for _ in range(args.repeat):
        for op, count in sweep:
            one(op, count)
            note(op, count)
        if "barrier" in args.ops:
            comm.Barrier()
            note("barrier", 0)
        if args.mark_steps:
            prof_steps.step(images=args.images_per_step)

    manifest = {
        "workload": "mpi4py_collectives",
        "ranks": size,
        "repeat": args.repeat,
        "sizes": args.sizes,
        "counts": counts,
        "bytes": [c * dt.itemsize for c in counts],
        "dtype": DTYPES[args.dtype],
        "dtype_size": dt.itemsize,
        "in_place": bool(args.in_place),
        "calls": {op: len(v) for op, v in calls.items()},
        "detail": calls,
        "steps_marked": args.repeat if args.mark_steps else 0,
    }
    if rank == 0:
        print("MANIFEST " + json.dumps(manifest), flush=True)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
