"""The job the multi-host tests run across simulated hosts (mpi4py, profiled by
HOROVOD_PROFILE=1 without code change).

    cluster_job.py N [--kill-host HOST] [--sleep S]

Every rank: N allreduces of 4096 bytes and N bcasts of 1000 bytes on the world,
then one barrier; prints `RANK r HOST h` and `RESULT OK r <checksum>`.
--kill-host HOST: after that, the ranks on HOST SIGKILL themselves (a host
that dies); the others first do N allreduces of 64 bytes among themselves and
a barrier there, so their records are complete when the host dies.
--sleep S: seconds between halves of the work (spreads the run in time).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time

import numpy as np
from mpi4py import MPI

ap = argparse.ArgumentParser()
ap.add_argument("n", type=int)
ap.add_argument("--kill-host", default=None)
ap.add_argument("--sleep", type=float, default=0.0)
a = ap.parse_args()

c = MPI.COMM_WORLD
r, size = c.Get_rank(), c.Get_size()
host = socket.gethostname()
print(f"RANK {r} HOST {host}", flush=True)
total = 0.0
for it in range(a.n):
    x = np.full(1024, r + it, dtype=np.float32)  # 4096 B
    y = np.empty_like(x)
    c.Allreduce(x, y, op=MPI.SUM)
    total += float(y[0])
    b = np.arange(250, dtype=np.float32) if r == 0 else np.zeros(250, dtype=np.float32)
    c.Bcast(b, root=0)  # 1000 B
    total += float(b[-1])
    if a.sleep and it == a.n // 2:
        time.sleep(a.sleep)
c.Barrier()
expect = sum(size * (size - 1) / 2 + size * it + 249.0 for it in range(a.n))
assert total == expect, (total, expect)
if a.kill_host is not None:
    doomed = host == a.kill_host
    sub = c.Split(1 if doomed else 0, r)
    if not doomed:
        for _ in range(a.n):
            z = np.full(16, 1.0, dtype=np.float32)  # 64 B
            sub.Allreduce(MPI.IN_PLACE, z, op=MPI.SUM)
        sub.Barrier()
    print(f"RESULT OK {r} {total:.1f}", flush=True)
    c.Barrier()  # the survivors' work is done and recorded
    if doomed:
        time.sleep(0.5)  # five flush periods (100 ms): the records are on disk
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
else:
    print(f"RESULT OK {r} {total:.1f}", flush=True)
