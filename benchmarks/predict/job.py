"""The job `profiler predict` is validated on (benchmarks/predict/validate.py).

    HOROVOD_PROFILE=1 mpirun -n 2 python benchmarks/predict/job.py [--steps 30]

A Horovod training loop (horovod.torch, hvd.DistributedOptimizer, real
gradients of a real torch model reduced over MPI) whose compute stands for
an accelerator's: each layer's forward and backward pass sleeps its share of
--compute-ms instead of keeping a core busy, as a GPU job's host thread waits
on its device.  On simulated hosts that share this machine's two cores, a
CPU-bound model would slow down with every host added (three ranks to a
core at six hosts): that is the rig's, not the job's, and no prediction of a
cluster should reproduce it.  Horovod's background thread, MPI and TCP still
run on the shared cores.

The gradients come as a CNN's do, a weight and a bias per layer (--layers
sizes in elements), ready in reverse layer order as the backward pass
reaches them.  Each rank's step starts with a data-loading stall drawn per
rank and step (exponential, mean --jitter-ms, seeded by rank and step):
the arrival spread whose slowest-of-N the prediction must carry to more
ranks.  Warm-up steps carry 0 images; the others --batch-size.
Rank 0 prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

#: weights of a small CNN-like stack (elements); each layer also has a bias
DEFAULT_LAYERS = "864,9216,18432,36864,73728,147456,65536,5120"


class Layer(torch.autograd.Function):
    """y = x + sum(w) * 0 + b.sum() * 0 (the values do not matter), forward and
    backward each sleeping the layer's device time; backward hands out dense
    gradients of the parameters' shapes."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                fwd_s: float, bwd_s: float) -> torch.Tensor:
        ctx.save_for_backward(w, b)
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        w, b = ctx.saved_tensors
        time.sleep(ctx.bwd_s)
        scale = float(g.sum())
        return g, torch.full_like(w, 1e-3 * scale), torch.full_like(b, 1e-3 * scale), None, None


class Model(nn.Module):
    def __init__(self, sizes: Sequence[int]) -> None:
        super().__init__()
        self.w = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in sizes])
        self.b = nn.ParameterList([nn.Parameter(torch.zeros(max(1, n // 288)))
                                   for n in sizes])

    def forward(self, x: torch.Tensor, fwd_s: float, bwd_s: float) -> torch.Tensor:
        for w, b in zip(self.w, self.b):
            x = Layer.apply(x, w, b, fwd_s, bwd_s)
        return x.sum()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/predict/job.py")
    p.add_argument("--layers", default=DEFAULT_LAYERS, help="weight elements per layer")
    p.add_argument("--compute-ms", type=float, default=40.0,
                   help="device time per step: a third forward, the rest backward")
    p.add_argument("--jitter-ms", type=float, default=4.0,
                   help="mean of each rank's data-loading stall per step (exponential)")
    p.add_argument("--steps", type=int, default=30, help="measured steps")
    p.add_argument("--warmup", type=int, default=5, help="steps with 0 images first")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args(argv)

    import horovod.torch as hvd

    import profiler

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    sizes = [int(x) for x in a.layers.split(",") if x.strip()]
    model = Model(sizes)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    n = len(sizes)
    fwd_s = a.compute_ms / 3 / n / 1e3
    bwd_s = a.compute_ms * 2 / 3 / n / 1e3
    x = torch.ones(4)
    t_steps: list[float] = []
    for i in range(a.warmup + a.steps):
        profiler.set_batch_size(0 if i < a.warmup else a.batch_size)
        rng = np.random.default_rng([a.seed, rank, i])
        t0 = time.perf_counter()
        time.sleep(float(rng.exponential(a.jitter_ms)) / 1e3 if a.jitter_ms > 0 else 0.0)
        opt.zero_grad()
        model(x, fwd_s, bwd_s).backward()
        opt.step()
        if i >= a.warmup:
            t_steps.append(time.perf_counter() - t0)
    profiler.set_batch_size(None)
    all_t = hvd.allgather_object(t_steps)
    if rank == 0:
        per_step = np.mean(np.array(all_t), axis=0) * 1e3
        print("RESULT " + json.dumps({
            "ranks": hvd.size(), "steps": a.steps, "batch_size": a.batch_size,
            "tensors": 2 * n, "bytes": 4 * sum(p.numel() for p in model.parameters()),
            "step_ms_mean": float(per_step.mean()),
            "step_ms_median": float(np.median(per_step))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
