"""A Horovod (PyTorch) training job with known parameter tensors, for tests.

Run under mpirun.  Rank 0 prints one JSON line: {"params": {name: elements},
"steps": N, "size": world size}.  Steps are found by the profiler's
hvd.DistributedOptimizer hook (no code change).  Environment: STEPS (default
6), SLOW_STEP (rank 1 sleeps 50 ms before its backward pass in that step),
SLOW_EVERY_MS (rank SLOW_RANK, default 1, sleeps that many ms before its backward
pass in every step), MODEL=repeated (four layers of one shape: tensors of
equal sizes), BUSY_MS (the main thread spins that long, runnable throughout,
before its backward pass in every step: a CPU-bound step whose length does not
depend on how much CPU it gets), READY_FILE (set up, the job creates that file
and waits for READY_FILE.go before its first step: a test starts what should
only meet the steps in between).
"""

from __future__ import annotations

import json
import os
import time

import horovod.torch as hvd
import torch


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    if os.environ.get("MODEL") == "repeated":
        # Four layers of one shape: tensors of equal sizes, where which ones
        # rode in a fused call can be ambiguous from bytes alone.
        return torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(),
            *[m for _ in range(4) for m in (torch.nn.Linear(32, 32), torch.nn.ReLU())],
            torch.nn.Linear(32, 4),
        )
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(),
        torch.nn.Linear(16, 16), torch.nn.ReLU(),
        torch.nn.Linear(16, 4),
    )


def main() -> None:
    hvd.init()
    net = model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.01), named_parameters=net.named_parameters()
    )
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    x = torch.randn(32, 8)
    y = torch.randn(32, 4)
    steps = int(os.environ.get("STEPS", "6"))
    slow = int(os.environ.get("SLOW_STEP", "-1"))
    every_s = float(os.environ.get("SLOW_EVERY_MS", "0")) / 1e3
    slow_rank = int(os.environ.get("SLOW_RANK", "1"))
    busy_s = float(os.environ.get("BUSY_MS", "0")) / 1e3
    ready = os.environ.get("READY_FILE")
    if ready:
        open(ready, "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(ready + ".go") and time.monotonic() < deadline:
            time.sleep(0.01)
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        if step == slow and hvd.rank() == 1:
            time.sleep(0.05)
        if every_s and hvd.rank() == slow_rank:
            time.sleep(every_s)
        if busy_s:
            until = time.perf_counter() + busy_s
            while time.perf_counter() < until:
                pass
        loss.backward()
        opt.step()
    # Horovod's timeline writer stops without draining at shutdown: let it drain.
    time.sleep(0.2)
    if hvd.rank() == 0:
        params = {n: p.numel() for n, p in net.named_parameters()}
        print(json.dumps({"params": params, "steps": steps, "size": hvd.size()}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
