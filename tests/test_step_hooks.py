"""The DistributedOptimizer's step hooks in C (profiler._fastrec.StepHook)
and in Python (profiler.collect.horovod_hooks' wrappers) write the same
step records, through the one step state of the library (hooks/steps.c).

One real Horovod rank (mpirun -n 1) trains a small model with
hvd.DistributedOptimizer, once with each hook (HOROVOD_PROFILE_FASTREC=1,
the default, and 0):

* 6 hooked optimizer steps: the first opens the step timeline, so 5 step
  records (seq 0-4) of HOROVOD_PROFILE_BATCH_SIZE images, each after its
  "sync" row (the same seq) carrying the main thread's schedstat figures;
* a step whose closure raises: the error reaches the caller unchanged, and
  no boundary is marked;
* then 3 more steps, each followed by the application's own
  profiler.step(images=3): the first optimizer step is still hooked (seq
  5, its sync row too), then the application marks steps: the hook falls
  silent, the first profiler.step restarts the open interval (no record),
  the next two close seq 6 and 7 with 3 images;
* the model's weights, bit for bit, equal those of the unprofiled run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mpirun, requires_mpi

from profiler.formats.raw import read_raw

pytestmark = [requires_mpi, pytest.mark.mpi, pytest.mark.horovod]

JOB = r'''
import json, sys
import torch
import horovod.torch as hvd
import profiler
from profiler.collect import steps as st

hvd.init()
torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
x, y = torch.randn(16, 8), torch.randn(16, 2)

def step():
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()

for _ in range(6):
    step()
opt.zero_grad()
torch.nn.functional.mse_loss(model(x), y).backward()
try:
    opt.step(closure=lambda: 1 / 0)
    raised = None
except ZeroDivisionError as exc:
    raised = str(exc)
for _ in range(3):
    step()
    profiler.step(images=3)
cls = type(opt)
out = {"raised": raised, "step_hook": type(cls.__dict__["synchronize"]).__name__,
       "recorded": st.steps_recorded(), "mode": st.mode(),
       "weights": [p.detach().double().flatten().tolist() for p in model.parameters()]}
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
hvd.shutdown()
'''

APP_STEP, APP_SYNC, APP_CPU = 32, 34, 36
BATCH = 8


def run(tmp: Path, name: str, env: dict[str, str]) -> tuple[dict, Path]:
    d = tmp / name
    d.mkdir()
    (d / "job.py").write_text(JOB)
    prof = d / "prof"
    if env:
        env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
               "HOROVOD_PROFILE_MERGE": "0", "HOROVOD_PROFILE_BATCH_SIZE": str(BATCH), **env}
    mpirun(1, [sys.executable, str(d / "job.py"), str(d / "out.json")], cwd=d, env=env)
    return json.loads((d / "out.json").read_text()), prof


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Path]]:
    tmp = tmp_path_factory.mktemp("stephooks")
    return {"c": run(tmp, "c", {"HOROVOD_PROFILE_FASTREC": "1"}),
            "python": run(tmp, "python", {"HOROVOD_PROFILE_FASTREC": "0"}),
            "off": run(tmp, "off", {})}


@pytest.mark.parametrize("hook", ["c", "python"])
def test_step_records(runs: dict[str, tuple[dict, Path]], hook: str) -> None:
    out, prof = runs[hook]
    assert out["step_hook"] == ("StepHook" if hook == "c" else "function")
    assert out["raised"] == "division by zero"
    assert out["mode"] == "explicit"
    rec = read_raw(prof / "raw" / "rank-00000.hvprof").records
    steps = rec[rec["op"] == APP_STEP]
    assert list(steps["seq"]) == list(range(8))
    assert list(steps["count"]) == [BATCH] * 6 + [3, 3]
    assert (steps["t_end"] > steps["t_start"]).all()
    assert (steps["t_start"][1:] >= steps["t_end"][:-1]).all()
    sync = rec[rec["op"] == APP_SYNC]
    # one sync row per hooked step; the closure's step marked none
    assert list(sync["seq"]) == list(range(6))
    assert (sync["bytes"] > 0).all()  # the main thread's ns on a CPU in synchronize
    for s, row in zip(steps, sync):
        assert s["t_start"] <= row["t_start"] <= row["t_end"] <= s["t_end"]
    # every step record comes with the main thread's CPU row (and Horovod's thread's)
    cpu = rec[rec["op"] == APP_CPU]
    assert set(cpu["seq"]) == set(range(8))


def test_both_hooks_agree_and_change_nothing(runs: dict[str, tuple[dict, Path]]) -> None:
    c, py, off = (runs[k][0] for k in ("c", "python", "off"))
    for a, b in ((c, off), (py, off)):
        for wa, wb in zip(a["weights"], b["weights"]):
            assert np.array_equal(wa, wb)
    assert c["recorded"] == py["recorded"] == 8
    assert off["recorded"] == 0 and off["mode"] == "off"
