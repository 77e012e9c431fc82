"""The collective sweep that `profiler bench` runs under mpirun (one process per rank).

    HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR=out mpirun -n 2 \\
        python -m profiler.bench.sweep --collectives allreduce --sizes 8,1K,1536,4M

Sweep mode: for each collective and each size (bytes of the collective's data
volume, the profiler's ``bytes`` of the call, see hooks/mpi_protos.py: e.g. allgather
counts the gathered total), ``--warmup`` calls with recording paused, then
``--iters`` recorded calls timed as one block; rank 0 prints nccl-tests' columns
(size, count, type, redop, root, time, algbw, busbw; time = the slowest rank's
mean per call).

Replay mode (``--plan plan.json``, written by ``profiler bench --sizes-from``):
every entry {op, count, dtype_size, comm_size, calls} is called exactly ``calls``
times (warm-up paused), so the recorded data calls have the application's
sizes and counts.

Recording is paused (hvprof_set_enabled(0)) around everything that is not a
measured call (warm-up, barriers, the timing reduction), so the trace holds only
the benchmark's calls.  Rank 0 writes ``bench.json`` (parameters, environment
selection, results) next to the trace when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

OPS = ("allreduce", "iallreduce", "reduce", "bcast", "allgather", "allgatherv", "gather",
       "alltoall", "alltoallv", "reduce_scatter", "reduce_scatter_block", "barrier")
NCCL_OPS = ("allreduce", "bcast", "reduce", "allgather", "reduce_scatter")
# ops whose recorded count is (per-rank count) x (communicator size)
PER_RANK_TIMES_P = {"allgather", "gather", "alltoall", "reduce_scatter_block"}
# ops whose recorded count is the sum of a counts vector (split evenly here)
SUMMED = {"allgatherv", "alltoallv", "reduce_scatter"}
ROOTED = {"reduce", "bcast", "gather"}
REDUCING = {"allreduce", "iallreduce", "reduce", "reduce_scatter", "reduce_scatter_block"}

DTYPES: dict[str, tuple[str, int]] = {  # name -> (numpy dtype, size)
    "float32": ("float32", 4), "float64": ("float64", 8), "int32": ("int32", 4),
    "int64": ("int64", 8), "float16": ("int16", 2), "uint8": ("uint8", 1),
}
# MPI type names in traces -> a numpy dtype of the same element size
MPI_NAMES: dict[str, str] = {
    "MPI_FLOAT": "float32", "MPI_DOUBLE": "float64", "MPI_INT": "int32",
    "MPI_INT32_T": "int32", "MPI_UNSIGNED": "uint32", "MPI_UINT32_T": "uint32",
    "MPI_LONG": "int64", "MPI_LONG_LONG_INT": "int64", "MPI_INT64_T": "int64",
    "MPI_UNSIGNED_LONG": "uint64", "MPI_UNSIGNED_LONG_LONG": "uint64",
    "MPI_UINT64_T": "uint64", "MPI_SHORT": "int16", "MPI_INT16_T": "int16",
    "MPI_UNSIGNED_SHORT": "uint16", "MPI_UINT16_T": "uint16", "MPI_BYTE": "uint8",
    "MPI_CHAR": "uint8", "MPI_SIGNED_CHAR": "int8", "MPI_UNSIGNED_CHAR": "uint8",
    "MPI_INT8_T": "int8", "MPI_UINT8_T": "uint8", "MPI_C_BOOL": "uint8",
}
BY_SIZE = {1: "uint8", 2: "int16", 4: "float32", 8: "float64"}


def busbw(algbw: float, op: str, n: int) -> float:
    """Bus bandwidth: algbw times the nccl-tests factor of profiler.analysis.summary
    (the one table); an op without one (barrier: no data) counts algbw as is."""
    from profiler.analysis.summary import bus_factor  # imported by main() before timing

    f = bus_factor(op, n)
    return algbw * f if f == f else algbw


@dataclass
class Entry:
    """One line of a plan: `calls` calls of `op` recording `count` elements."""

    op: str
    count: int          # recorded element count (the profiler's `count`)
    dtype_size: int
    calls: int
    dtype: str = ""     # MPI type name in the source trace, informative
    comm_size: int = 0  # communicator size in the source trace (0 = this run's)


@dataclass
class Result:
    op: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    calls: int


# --------------------------------------------------------------------- recording


class Recorder:
    """Pauses and resumes the profiler's recording (no-op when not profiling)."""

    def __init__(self) -> None:
        self._lib: Any = None
        from profiler._env import profile_mode

        if profile_mode() not in (None, "off"):
            try:
                from profiler.collect import native

                self._lib = native if native.loaded() is not None else None
            except Exception:
                self._lib = None

    def set(self, on: bool) -> None:
        if self._lib is not None:
            self._lib.set_enabled(on)


# ---------------------------------------------------------------------- backends


class MpiBackend:
    """mpi4py on CPU numpy buffers."""

    name = "mpi"

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.size = self.comm.Get_size()
        self.rank = self.comm.Get_rank()

    def mpi_type(self, np_dtype: str) -> Any:
        return self.MPI._typedict[np.dtype(np_dtype).char]

    def prepare(self, op: str, count: int, np_dtype: str, comm_size: int = 0
                ) -> Callable[[], None]:
        """A closure that makes one call recording `count` elements (see hooks/mpi_protos.py)."""
        MPI, comm, p = self.MPI, self.comm, self.size
        t = self.mpi_type(np_dtype)
        src_p = comm_size or p
        if op in PER_RANK_TIMES_P:
            per = max(count // src_p, 0)
        else:
            per = count
        redop = MPI.SUM
        if np.dtype(np_dtype).kind not in "iuf":
            redop = MPI.BOR
        if op == "allreduce":
            a, b = np.ones(per, np_dtype), np.empty(per, np_dtype)
            return lambda: comm.Allreduce([a, t], [b, t], op=redop)
        if op == "iallreduce":
            a, b = np.ones(per, np_dtype), np.empty(per, np_dtype)

            def iallreduce() -> None:
                comm.Iallreduce([a, t], [b, t], op=redop).Wait()

            return iallreduce
        if op == "reduce":
            a, b = np.ones(per, np_dtype), np.empty(per, np_dtype)
            return lambda: comm.Reduce([a, t], [b, t], op=redop, root=0)
        if op == "bcast":
            a = np.ones(per, np_dtype)
            return lambda: comm.Bcast([a, t], root=0)
        if op == "allgather":
            a, b = np.ones(per, np_dtype), np.empty(per * p, np_dtype)
            return lambda: comm.Allgather([a, t], [b, t])
        if op == "gather":
            a, b = np.ones(per, np_dtype), np.empty(per * p, np_dtype)
            return lambda: comm.Gather([a, t], [b, t], root=0)
        if op == "alltoall":
            per_peer = per // p
            a, b = np.ones(per_peer * p, np_dtype), np.empty(per_peer * p, np_dtype)
            return lambda: comm.Alltoall([a, t], [b, t])
        if op == "reduce_scatter_block":
            a, b = np.ones(per * p, np_dtype), np.empty(per, np_dtype)
            return lambda: comm.Reduce_scatter_block([a, t], [b, t], op=redop)
        if op in SUMMED:
            counts = [count // p + (1 if i < count % p else 0) for i in range(p)]
            displs = [sum(counts[:i]) for i in range(p)]
            if op == "allgatherv":
                a = np.ones(counts[self.rank], np_dtype)
                b = np.empty(count, np_dtype)
                return lambda: comm.Allgatherv([a, t], [b, (counts, displs), t])
            if op == "reduce_scatter":
                a = np.ones(count, np_dtype)
                b = np.empty(counts[self.rank], np_dtype)
                return lambda: comm.Reduce_scatter([a, t], [b, t], recvcounts=counts, op=redop)
            # alltoallv: this rank sends `count` elements in total
            a = np.ones(count, np_dtype)
            rc = [counts[self.rank]] * p  # what every peer sends to this rank
            b = np.empty(sum(rc), np_dtype)
            rd = [sum(rc[:i]) for i in range(p)]
            return lambda: comm.Alltoallv([a, (counts, displs), t], [b, (rc, rd), t])
        if op == "barrier":
            return lambda: comm.Barrier()
        raise SystemExit(f"profiler bench: error: unsupported collective {op!r}")

    def barrier(self) -> None:
        self.comm.Barrier()

    def max_over_ranks(self, value: float) -> float:
        return float(self.comm.allreduce(value, op=self.MPI.MAX))

    def sync(self) -> None:
        return None


class NcclBackend:
    """cupy.cuda.nccl on one GPU per rank; mpi4py only distributes the unique id."""

    name = "nccl"

    def __init__(self) -> None:
        try:
            import cupy
            from cupy.cuda import nccl
        except Exception as exc:  # pragma: no cover - needs cupy
            raise SystemExit(f"profiler bench: error: --backend nccl needs cupy: {exc}") from None
        from mpi4py import MPI

        self.MPI, self.cupy, self.nccl = MPI, cupy, nccl
        self.mpi = MPI.COMM_WORLD
        self.size, self.rank = self.mpi.Get_size(), self.mpi.Get_rank()
        ndev = cupy.cuda.runtime.getDeviceCount()
        if ndev < 1:  # pragma: no cover - needs a GPU
            raise SystemExit("profiler bench: error: --backend nccl needs a GPU")
        cupy.cuda.Device(self.rank % ndev).use()
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = self.mpi.bcast(uid, root=0)
        self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def prepare(self, op: str, count: int, np_dtype: str, comm_size: int = 0
                ) -> Callable[[], None]:  # pragma: no cover - needs a GPU
        cp, nc, s = self.cupy, self.nccl, self.stream.ptr
        types = {"float32": nc.NCCL_FLOAT32, "float64": nc.NCCL_FLOAT64,
                 "int32": nc.NCCL_INT32, "int64": nc.NCCL_INT64, "int16": nc.NCCL_FLOAT16,
                 "uint8": nc.NCCL_UINT8, "int8": nc.NCCL_INT8}
        if np_dtype not in types:
            np_dtype = BY_SIZE.get(np.dtype(np_dtype).itemsize, "uint8")
        t = types[np_dtype]
        p = self.size
        if op == "allreduce":
            a, b = cp.ones(count, np_dtype), cp.empty(count, np_dtype)
            return lambda: self.comm.allReduce(a.data.ptr, b.data.ptr, count, t, nc.NCCL_SUM, s)
        if op == "bcast":
            a = cp.ones(count, np_dtype)
            return lambda: self.comm.bcast(a.data.ptr, count, t, 0, s)
        if op == "reduce":
            a, b = cp.ones(count, np_dtype), cp.empty(count, np_dtype)
            return lambda: self.comm.reduce(a.data.ptr, b.data.ptr, count, t, nc.NCCL_SUM, 0, s)
        per = count // (comm_size or p)
        if op == "allgather":
            a, b = cp.ones(per, np_dtype), cp.empty(per * p, np_dtype)
            return lambda: self.comm.allGather(a.data.ptr, b.data.ptr, per, t, s)
        if op == "reduce_scatter":
            a, b = cp.ones(per * p, np_dtype), cp.empty(per, np_dtype)
            return lambda: self.comm.reduceScatter(a.data.ptr, b.data.ptr, per, t, nc.NCCL_SUM,
                                                   s)
        raise SystemExit(f"profiler bench: error: --backend nccl does not run {op!r} "
                         f"(choose from {', '.join(NCCL_OPS)})")

    def barrier(self) -> None:  # pragma: no cover - needs a GPU
        self.stream.synchronize()
        self.mpi.Barrier()

    def max_over_ranks(self, value: float) -> float:  # pragma: no cover - needs a GPU
        return float(self.mpi.allreduce(value, op=self.MPI.MAX))

    def sync(self) -> None:  # pragma: no cover - needs a GPU
        self.stream.synchronize()


# ------------------------------------------------------------------------ driver


def np_dtype_of(entry_dtype: str, dtype_size: int) -> str:
    name = MPI_NAMES.get(entry_dtype)
    if name and np.dtype(name).itemsize == dtype_size:
        return name
    return BY_SIZE.get(dtype_size, "uint8")


def run_entry(backend: Any, rec: Recorder, op: str, count: int, np_dtype: str, calls: int,
              warmup: int, comm_size: int = 0) -> float:
    """Warm up (paused), then `calls` recorded calls; returns the slowest rank's mean
    seconds per call."""
    fn = backend.prepare(op, count, np_dtype, comm_size)
    rec.set(False)
    for _ in range(warmup):
        fn()
    backend.sync()
    backend.barrier()
    rec.set(True)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    backend.sync()
    dt = (time.perf_counter() - t0) / max(calls, 1)
    rec.set(False)
    worst = backend.max_over_ranks(dt)
    rec.set(True)
    return worst


def header(out: Any) -> None:
    out.write(f"#{'size':>12}{'count':>14}{'type':>10}{'redop':>8}{'root':>6}"
              f"{'time':>11}{'algbw':>9}{'busbw':>9}\n")
    out.write(f"#{'(B)':>12}{'(elements)':>14}{'':>10}{'':>8}{'':>6}"
              f"{'(us)':>11}{'(GB/s)':>9}{'(GB/s)':>9}\n")


def line(r: Result) -> str:
    return (f" {r.size:>12}{r.count:>14}{r.type:>10}{r.redop:>8}{r.root:>6}"
            f"{r.time_us:>11.2f}{r.algbw_gbps:>9.3f}{r.busbw_gbps:>9.3f}\n")


def sweep(backend: Any, ops: Sequence[str], sizes: Sequence[int], dtype: str, iters: int,
          warmup: int, rec: Recorder, out: Any) -> list[Result]:
    np_dtype, esize = DTYPES[dtype]
    results = []
    for op in ops:
        if backend.rank == 0:
            out.write(f"# Collective: {op}  ranks: {backend.size}  backend: {backend.name}\n")
            header(out)
        done: set[int] = set()
        for size in sizes:
            count = 0 if op == "barrier" else size // esize
            if op in PER_RANK_TIMES_P and backend.name == "mpi":
                count -= count % backend.size  # whole elements per rank
            if op == "alltoall":
                count -= count % (backend.size * backend.size)
            nbytes = count * esize
            if nbytes != size and backend.rank == 0:
                out.write(f"# note: {op} cannot move {size} B on {backend.size} ranks "
                          f"in whole {dtype} elements per rank; measured {nbytes} B\n")
            if nbytes in done:
                continue
            done.add(nbytes)
            sec = run_entry(backend, rec, op, count, np_dtype, iters, warmup)
            algbw = nbytes / sec / 1e9 if sec > 0 else 0.0
            r = Result(op=op, size=nbytes, count=count, type=dtype,
                       redop="sum" if op in REDUCING else "none",
                       root=0 if op in ROOTED else -1, time_us=sec * 1e6, algbw_gbps=algbw,
                       busbw_gbps=busbw(algbw, op, backend.size), calls=iters)
            results.append(r)
            if backend.rank == 0:
                out.write(line(r))
                out.flush()
        if op == "barrier":
            break
    return results


def replay(backend: Any, plan: Sequence[Entry], warmup: int, rec: Recorder, out: Any
           ) -> list[Result]:
    results = []
    if backend.rank == 0:
        out.write(f"# Replay: {len(plan)} (op, size) entries, "
                  f"{sum(e.calls for e in plan)} calls  ranks: {backend.size}\n")
    current = ""
    for e in plan:
        if backend.rank == 0 and e.op != current:
            current = e.op
            out.write(f"# Collective: {e.op}\n")
            header(out)
        np_dtype = np_dtype_of(e.dtype, e.dtype_size)
        sec = run_entry(backend, rec, e.op, e.count, np_dtype, e.calls, warmup, e.comm_size)
        nbytes = e.count * e.dtype_size
        algbw = nbytes / sec / 1e9 if sec > 0 else 0.0
        r = Result(op=e.op, size=nbytes, count=e.count, type=e.dtype or np_dtype,
                   redop="sum" if e.op in REDUCING else "none",
                   root=0 if e.op in ROOTED else -1, time_us=sec * 1e6, algbw_gbps=algbw,
                   busbw_gbps=busbw(algbw, e.op, backend.size), calls=e.calls)
        results.append(r)
        if backend.rank == 0:
            out.write(line(r))
            out.flush()
    return results


MAX_PLAN_BYTES = 16 << 20
MAX_PLAN_CALLS = 1 << 32


def read_plan(path: str) -> list[Entry]:
    """A replay plan written by profiler.bench.write_plan; anything else is refused
    with a ProfilerError (one line)."""
    import orjson

    from profiler.errors import CorruptError, NotATraceError
    from profiler.formats.raw import read_regular

    data = read_regular(path, "a bench plan", MAX_PLAN_BYTES)
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise NotATraceError(path, "not a bench plan (not JSON)") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
        raise NotATraceError(path, "not a bench plan (no 'entries' list)")
    out: list[Entry] = []
    for i, item in enumerate(raw["entries"]):
        if not isinstance(item, dict) or set(item) - set(Entry.__dataclass_fields__):
            raise CorruptError(path, f"plan entry {i} is not an entry")
        try:
            e = Entry(**item)
        except TypeError:
            raise CorruptError(path, f"plan entry {i} lacks a field") from None
        ints = (e.count, e.dtype_size, e.calls, e.comm_size)
        if (not isinstance(e.op, str) or not isinstance(e.dtype, str)
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in ints)
                or e.count < 0 or not 0 < e.dtype_size <= 1 << 16
                or not 0 <= e.calls <= MAX_PLAN_CALLS or e.comm_size < 0
                or e.count * e.dtype_size > 1 << 40):
            raise CorruptError(path, f"plan entry {i} has bad values: {item!r}"[:200])
        out.append(e)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m profiler.bench.sweep")
    p.add_argument("--collectives", default="allreduce")
    p.add_argument("--sizes", default="")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--backend", default="mpi", choices=("mpi", "nccl"))
    p.add_argument("--plan", default=None)
    p.add_argument("--out", default=None, help="directory for bench.json (rank 0)")
    p.add_argument("--transport", default="", help="recorded in bench.json")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    # The profiler converts this rank's records at exit through pandas, whose import
    # needs concurrent.futures.thread; importing that module after interpreter
    # shutdown has begun fails ("can't register atexit after shutdown"), so load it now.
    import concurrent.futures.thread  # noqa: F401

    args = parse_args(argv)
    import profiler.analysis.summary  # noqa: F401 - bus factors (pandas): not mid-sweep
    backend: Any = NcclBackend() if args.backend == "nccl" else MpiBackend()
    rec = Recorder()
    out = sys.stdout
    if args.plan:
        from profiler.errors import ProfilerError

        try:
            plan = read_plan(args.plan)
        except ProfilerError as exc:
            raise SystemExit(f"profiler bench: error: {exc.line()}") from None
        results = replay(backend, plan, args.warmup, rec, out)
        mode = "replay"
    else:
        ops = [o for o in args.collectives.split(",") if o]
        sizes = [int(s) for s in args.sizes.split(",") if s]
        results = sweep(backend, ops, sizes, args.dtype, args.iters, args.warmup, rec, out)
        mode = "sweep"
    if backend.rank == 0 and args.out:
        info = {
            "mode": mode, "backend": backend.name, "ranks": backend.size,
            "transport": args.transport,
            "btl": os.environ.get("OMPI_MCA_btl", ""), "pml": os.environ.get("OMPI_MCA_pml", ""),
            "dtype": args.dtype, "iters": args.iters, "warmup": args.warmup,
            "plan": args.plan or "", "results": [asdict(r) for r in results],
        }
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tmp = Path(args.out) / "bench.json.tmp"
        tmp.write_text(json.dumps(info, indent=1))
        tmp.replace(Path(args.out) / "bench.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
