"""`profiler bench`: a collective microbenchmark whose output is a profiler trace.

The sweep (:mod:`profiler.bench.sweep`) runs under mpirun with mpi4py on CPU
buffers (or cupy's NCCL on GPUs), prints nccl-tests' columns on rank 0 and is
recorded by the profiler itself (HOROVOD_PROFILE=1, HOROVOD_PROFILE_DIR=DIR):
the trace in DIR is the benchmark's result, loadable with profiler.analysis.
"""

from __future__ import annotations

__all__: list[str] = []
