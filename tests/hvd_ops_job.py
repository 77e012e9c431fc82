"""Every Horovod collective once, for classification tests (run under mpirun).

Rank 0 prints one JSON line naming what it issued.  Each call is a
synchronous Horovod op on a CPU tensor: allreduce (float32, float16,
int64 max), broadcast (float32, int32, uint8), allgather, alltoall,
reducescatter, barrier.
"""

from __future__ import annotations

import json

import horovod.torch as hvd
import torch


def main() -> None:
    hvd.init()
    n = hvd.size()
    r = hvd.rank()
    hvd.allreduce(torch.ones(100), name="ar.f32")
    hvd.allreduce(torch.ones(64, dtype=torch.float16), name="ar.f16")
    hvd.allreduce(torch.full((3,), r, dtype=torch.int64), name="ar.i64max", op=hvd.Max)
    hvd.broadcast(torch.ones(10), root_rank=0, name="bc.f32")
    hvd.broadcast(torch.ones(7, dtype=torch.int32), root_rank=0, name="bc.i32")
    hvd.broadcast(torch.ones(5, dtype=torch.uint8), root_rank=0, name="bc.u8")
    hvd.allgather(torch.ones(4 + r, 2), name="ag")
    hvd.alltoall(torch.ones(2 * n, 3), name="a2a")
    hvd.reducescatter(torch.ones(4 * n), name="rs")
    hvd.barrier()
    if r == 0:
        print(json.dumps({"size": n}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
