"""The workers of benchmarks/gpu_check.py: one backend each (cupy's NCCL,
torch.distributed NCCL, the project's NCCL/CUDA stand-ins), run as
`gpu_check.py --worker BACKEND` under LD_PRELOAD in a fresh process.

A worker sweeps NCCL calls over message sizes, timing each call with its own
CUDA events on the call's stream (--mode sweep), or measures the host time
per call of small messages (--mode overhead), and writes what it did to
--result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

NCCL_FLOAT32 = 7
NCCL_SUM = 0


# ---------------------------------------------------------------------------
# Workers: one backend each, run under LD_PRELOAD in a fresh process
# ---------------------------------------------------------------------------
class Backend:
    name = "?"

    def setup(self, max_bytes: int) -> None:
        raise NotImplementedError

    def issue(self, op: str, nbytes: int) -> None:
        """Enqueue one NCCL call of nbytes on the stream (no synchronization)."""
        raise NotImplementedError

    def event_pair(self) -> tuple[Any, Any]:
        raise NotImplementedError

    def record(self, ev: Any) -> None:
        raise NotImplementedError

    def elapsed_us(self, a: Any, b: Any) -> float:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def last_error(self) -> int:
        return 0

    def syncs(self) -> int | None:
        return None

    def close(self) -> None:
        pass

    def versions(self) -> dict[str, str]:
        return {}


class CupyBackend(Backend):
    name = "cupy"
    ops = ("allreduce",)

    def setup(self, max_bytes: int) -> None:
        import cupy as cp
        from cupy.cuda import nccl

        self.cp, self.nccl = cp, nccl
        cp.cuda.Device(0).use()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.send = cp.ones(max_bytes // 4, dtype=cp.float32)
        self.recv = cp.zeros(max_bytes // 4, dtype=cp.float32)
        self.comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)

    def issue(self, op: str, nbytes: int) -> None:
        self.comm.allReduce(self.send.data.ptr, self.recv.data.ptr, nbytes // 4,
                            self.nccl.NCCL_FLOAT32, self.nccl.NCCL_SUM, self.stream.ptr)

    def event_pair(self) -> tuple[Any, Any]:
        return self.cp.cuda.Event(), self.cp.cuda.Event()

    def record(self, ev: Any) -> None:
        ev.record(self.stream)

    def elapsed_us(self, a: Any, b: Any) -> float:
        return float(self.cp.cuda.get_elapsed_time(a, b)) * 1e3

    def sync(self) -> None:
        self.stream.synchronize()

    def last_error(self) -> int:
        return _cudart_last_error()

    def versions(self) -> dict[str, str]:
        return {"cupy": self.cp.__version__, "nccl": str(self.nccl.get_version())}


class TorchBackend(Backend):
    name = "torch"
    ops = ("allreduce", "allgather")

    def setup(self, max_bytes: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        torch.cuda.set_device(0)
        port = int(os.environ.get("GPU_CHECK_PORT", "0")) or _free_port()
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        # world 2: two processes sharing GPU 0 (--pair: pair_env)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, device_id=torch.device("cuda:0"))
        self.buf = torch.ones(max_bytes // 4, dtype=torch.float32, device="cuda")
        self.out = torch.zeros(world * max_bytes // 4, dtype=torch.float32, device="cuda")
        self.stream = torch.cuda.current_stream()

    def issue(self, op: str, nbytes: int) -> None:
        n = nbytes // 4
        if op == "allreduce":
            self.dist.all_reduce(self.buf[:n])
        else:
            w = self.dist.get_world_size()
            self.dist.all_gather_into_tensor(self.out[:n * w], self.buf[:n])

    def event_pair(self) -> tuple[Any, Any]:
        e = self.torch.cuda.Event
        return e(enable_timing=True), e(enable_timing=True)

    def record(self, ev: Any) -> None:
        ev.record(self.stream)

    def elapsed_us(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) * 1e3

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def last_error(self) -> int:
        return _cudart_last_error()

    def close(self) -> None:
        self.dist.destroy_process_group()

    def versions(self) -> dict[str, str]:
        v = self.torch.cuda.nccl.version()
        return {"torch": self.torch.__version__, "cuda": str(self.torch.version.cuda),
                "nccl": ".".join(map(str, v)) if isinstance(v, tuple) else str(v)}


class StandinBackend(Backend):
    """The project's NCCL and CUDA stand-ins (tests/standin), for --dry-run."""

    name = "standin"
    ops = ("allreduce",)

    def setup(self, max_bytes: int) -> None:
        import ctypes

        c = ctypes
        d = Path(os.environ["GPU_CHECK_STANDIN_DIR"])
        self.cudart = c.CDLL(str(d / "libcudart.so.12"), mode=c.RTLD_GLOBAL)
        self.ncclso = c.CDLL(str(d / "libnccl.so.2"), mode=c.RTLD_LOCAL)
        g = c.CDLL(None)  # the profiler's wrappers (LD_PRELOAD), else the stand-in
        self.g = g
        self.stream, self.comm = c.c_void_p(), c.c_void_p()
        assert self.cudart.cudaStreamCreate(c.byref(self.stream)) == 0

        class UniqueId(c.Structure):
            _fields_ = [("internal", c.c_char * 128)]

        uid = UniqueId()
        self.ncclso.ncclGetUniqueId(c.byref(uid))
        init = (g.ncclCommInitRank if hasattr(g, "ncclCommInitRank")
                else self.ncclso.ncclCommInitRank)
        # resolved before the communicator exists, as a program linked to NCCL
        # binds it: NCCL's plugin loading must not make the wrappers the target
        self.allreduce = (g.ncclAllReduce if hasattr(g, "ncclAllReduce")
                          else self.ncclso.ncclAllReduce)
        init.argtypes = [c.POINTER(c.c_void_p), c.c_int, UniqueId, c.c_int]
        assert init(c.byref(self.comm), 1, uid, 0) == 0
        self.allreduce.argtypes = [c.c_void_p, c.c_void_p, c.c_size_t, c.c_int, c.c_int,
                                   c.c_void_p, c.c_void_p]
        self.bufs = (c.c_char * 16)(), (c.c_char * 16)()  # the stand-in copies count*4 bytes
        self.set_delay = self.ncclso.standin_nccl_set_delay_us
        self.elapsed = self.cudart.cudaEventElapsedTime
        self.elapsed.argtypes = [c.POINTER(c.c_float), c.c_void_p, c.c_void_p]
        self.c = c

    def issue(self, op: str, nbytes: int) -> None:
        # virtual device time: 10 us + 1 us per 4 KiB ("4 GB/s")
        self.set_delay(10 + nbytes // 4096)
        # a 16-byte buffer stands for the payload: the count is what is recorded
        assert self.allreduce(None, None, nbytes // 4, NCCL_FLOAT32, NCCL_SUM, self.comm,
                              self.stream) == 0

    def event_pair(self) -> tuple[Any, Any]:
        a, b = self.c.c_void_p(), self.c.c_void_p()
        self.cudart.cudaEventCreate(self.c.byref(a))
        self.cudart.cudaEventCreate(self.c.byref(b))
        return a, b

    def record(self, ev: Any) -> None:
        self.cudart.cudaEventRecord(ev, self.stream)

    def elapsed_us(self, a: Any, b: Any) -> float:
        ms = self.c.c_float()
        assert self.elapsed(self.c.byref(ms), a, b) == 0
        return float(ms.value) * 1e3

    def sync(self) -> None:
        self.cudart.cudaStreamSynchronize(self.stream)

    def last_error(self) -> int:
        return int(self.cudart.cudaGetLastError())

    def syncs(self) -> int | None:
        return int(self.cudart.standin_total_syncs())

    def versions(self) -> dict[str, str]:
        return {"nccl": "stand-in"}


BACKENDS: dict[str, type[Backend]] = {"cupy": CupyBackend, "torch": TorchBackend,
                                      "standin": StandinBackend}


def _cudart_last_error() -> int:
    """cudaGetLastError of the runtime the profiler uses (the process's own)."""
    import ctypes

    try:
        from profiler.collect import native

        st = native.native_state() or {}
        path = st.get("cuda_runtime") or ""
        if not path:
            return 0
        return int(ctypes.CDLL(path).cudaGetLastError())
    except Exception:
        return -1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(args: argparse.Namespace) -> int:
    be = BACKENDS[args.worker]()
    sizes = [int(s) for s in args.sizes.split(",")]
    t0 = time.perf_counter()
    be.setup(max(sizes))
    out: dict[str, Any] = {"backend": be.name, "versions": be.versions(), "sweep": [],
                           "setup_s": time.perf_counter() - t0}
    if args.mode == "sweep":
        n = args.warmup + args.iters
        events = [be.event_pair() for _ in range(n)]
        sync_before = be.syncs()
        for op in getattr(be, "ops", ("allreduce",)):
            for size in sizes:
                for e0, e1 in events:
                    be.record(e0)
                    be.issue(op, size)
                    be.record(e1)
                be.sync()  # the application's own synchronization, once per size
                durs = [be.elapsed_us(e0, e1) for e0, e1 in events]
                out["sweep"].append({"op": op, "bytes": size, "count": size // 4, "calls": n,
                                     "warmup": args.warmup, "app_us": durs})
        out["app_syncs"] = len(sizes) * len(getattr(be, "ops", ("allreduce",)))
        if sync_before is not None:
            out["standin_syncs"] = be.syncs() - sync_before  # type: ignore[operator]
    else:  # overhead: host time per call, small messages, no device timing of our own
        size = 8
        rounds = []
        for _ in range(args.rounds):
            be.sync()
            t = time.perf_counter_ns()
            for _ in range(args.calls):
                be.issue("allreduce", size)
            rounds.append((time.perf_counter_ns() - t) / args.calls / 1e3)
        be.sync()
        out["host_us_per_call"] = rounds
    be.sync()
    out["last_error"] = be.last_error()
    try:
        from profiler.collect import native

        out["unfinished"] = native.finish_native(5000)
        out["profiler"] = native.native_state()
    except Exception as exc:  # not profiled (overhead baseline)
        out["profiler_error"] = str(exc)
    be.close()
    Path(args.result).write_text(json.dumps(out))
    return 0
