"""Regenerate the small real Horovod timelines under tests/data/ (not run by the tests).

    HOROVOD_TIMELINE=tests/data/horovod_timeline_fused.json \\
        mpirun -n 2 .venv/bin/python tests/data/gen_horovod_timelines.py
    HOROVOD_TIMELINE=tests/data/horovod_timeline_nocache_unfused.json \\
        HOROVOD_CACHE_CAPACITY=0 HOROVOD_FUSION_THRESHOLD=0 SLOW_STEP=2 \\
        mpirun -n 2 .venv/bin/python tests/data/gen_horovod_timelines.py

(with the Open MPI settings of tests/conftest.py MPI_ENV when running as root).
The model has 4 parameter tensors: 0.weight [16, 8], 0.bias [16],
2.weight [4, 16], 2.bias [4] (float32).  SLOW_STEP=k makes rank 1 sleep 50 ms
before its backward pass in step k, so rank 1 is the straggler of that step.
"""

from __future__ import annotations

import os
import time

import horovod.torch as hvd
import torch

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.randn(32, 8)
y = torch.randn(32, 4)
slow = int(os.environ.get("SLOW_STEP", "-1"))
for step in range(int(os.environ.get("STEPS", "5"))):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if step == slow and hvd.rank() == 1:
        time.sleep(0.05)
    loss.backward()
    opt.step()
# Horovod's timeline writer stops without draining its queue at shutdown:
# give it time to write the last step.
time.sleep(0.2)
hvd.shutdown()
