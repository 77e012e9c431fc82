"""A Horovod (PyTorch) training job with one known cause injected, for the
diagnosis scenarios (benchmarks/scenarios/suite.py).  Run under mpirun.

Every rank measures its own steps with its own clocks, independently of the
profiler, and rank 0 prints them as one JSON line at the end (``{"scenario":
{...}}``): the mean step time, the mean time outside optimizer.step (what the
step breakdown calls compute), and the main thread's run-queue wait per step
outside optimizer.step, read from /proc/self/task/<tid>/schedstat, per rank
(inside it Horovod's synchronize stays runnable while it waits: not
contention).

    mpirun -n 2 python job.py --model mlp --steps 40 [--late-rank 1 --late-ms 30]
        [--jitter-ms 60] [--stall-ms 50] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import horovod.torch as hvd
import torch

CLIFF_WIDTHS = (32, 64, 128, 256, 384, 512, 1024, 2048)


class Heads(torch.nn.Module):
    """Independent linear heads on one input: one weight tensor per width, of
    128 x width float32s (16 KiB to 1 MiB), each its own message with fusion off."""

    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(128, w, bias=False) for w in widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([h(x).mean(dim=1) for h in self.heads], dim=1)


def model(name: str) -> tuple[torch.nn.Module, int, int]:
    """(model, input width, output width)."""
    torch.manual_seed(0)
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 10)), 256, 10
    if name == "small":  # 64 small layers: 128 tensors of 1 KiB and 64 B
        layers: list[torch.nn.Module] = []
        for _ in range(64):
            layers += [torch.nn.Linear(16, 16), torch.nn.Tanh()]
        return torch.nn.Sequential(*layers), 16, 16
    if name == "heads":
        return Heads(CLIFF_WIDTHS), 128, len(CLIFF_WIDTHS)
    if name == "wide":  # about 8 MiB of gradients
        return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10)), 1024, 10
    raise SystemExit(f"job.py: unknown model {name!r}")


def run_queue_ns() -> int:
    """This (main) thread's time waiting on a run queue so far (schedstat)."""
    try:
        with open(f"/proc/self/task/{threading_native_id()}/schedstat") as fh:
            return int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def threading_native_id() -> int:
    import threading

    return threading.get_native_id()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--late-rank", type=int, default=-1)
    p.add_argument("--late-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--stall-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    hvd.init()
    rank = hvd.rank()
    net, n_in, n_out = model(a.model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.001),
                                   named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(a.batch, n_in, generator=g)
    y = torch.randn(a.batch, n_out, generator=g)
    rng = random.Random(a.seed * 1000 + rank)
    steps, outside, waits = [], [], []
    last = time.perf_counter()
    rq = run_queue_ns()
    for step in range(a.steps + a.warmup):
        # the "data loading" of this step: every injected sleep happens here
        pause = a.stall_ms
        if a.jitter_ms:
            pause += rng.uniform(0.0, a.jitter_ms)
        if rank == a.late_rank:
            pause += a.late_ms
        if pause:
            time.sleep(pause / 1e3)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        t_in = time.perf_counter()
        rq_in = run_queue_ns()
        opt.step()
        now = time.perf_counter()
        rq_now = run_queue_ns()
        if step >= a.warmup:
            steps.append(now - last)
            outside.append((now - last) - (now - t_in))
            waits.append((rq_in - rq) / 1e6 if rq >= 0 and rq_in >= 0 else float("nan"))
        last, rq = now, rq_now
    mine = {"rank": rank, "step_ms": 1e3 * sum(steps) / len(steps),
            "outside_ms": 1e3 * sum(outside) / len(outside),
            # the run-queue wait outside optimizer.step
            "run_queue_ms": sum(waits) / len(waits), "loss": float(loss.detach())}
    every = hvd.allgather_object(mine)
    if rank == 0:
        print(json.dumps({"scenario": {"ranks": every, "steps": a.steps, "warmup": a.warmup,
                                       "pid": os.getpid()}}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
