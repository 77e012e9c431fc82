#!/usr/bin/env python3
"""What sits between a gradient becoming ready and its enqueue to Horovod, per
tensor, with the profiler's hooks and without (benchmarks/, not a test).

    HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR=/tmp/r2e mpirun -n 2 \\
        python benchmarks/overhead/ready_to_enqueue.py [--workload mlp6] [--steps 100]
        [--blocks 8] [--seed 0] [--json OUT]

A real Horovod job (the corpus' workload: mlp6's 12 gradient tensors, or
``--workload bert --layers 6``: 105) with the library loaded.  Each tensor's
interval is read on the wall clock (time.perf_counter_ns) at two points:

* ready: a hook on the parameter's gradient accumulator, registered before
  hvd.DistributedOptimizer registers its own on the same node (a node runs its
  hooks in registration order), so it fires as the gradient is ready, right
  before Horovod's hook;
* enqueue: Horovod's C++ entry point (``mpi_lib.horovod_torch_allreduce_async_*``)
  wrapped, timed as it is entered (the tensor known by the name Horovod passes:
  the parameter's).

Between them run Horovod's Python (its hook, allreduce_async_, the name) and,
when the profiler's hooks are installed, its tensor hook's part before the
call (profiler._fastrec.Hook: the clock read for the record's start).  Blocks
of --steps steps alternate, in pairs drawn at random (--seed, the same on
every rank), between the profiler's Python-side hooks installed (the tensor
entry points and the DistributedOptimizer's step and synchronize) and
removed (horovod_hooks.unpatch_module, tensors.unpatch_module); the MPI
wrappers stay on in both.  The two timing points are the same in both arms.
Reported per arm: the median over tensors of each tensor's median interval,
and per tensor the difference of its medians (hooks on - off): its median
and range over the tensors, with a 95% bootstrap interval of the median
difference over the block pairs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

import horovod_job  # beside this script

PREFIX = "horovod_torch_allreduce_async_"


def median_ci(values: list[float], seed: int = 1, n: int = 4000) -> tuple[float, float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return statistics.median(values), meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="mlp6", help="a corpus workload (default mlp6)")
    p.add_argument("--layers", type=int, default=6, help="bert's layers (default 6: 105 tensors)")
    p.add_argument("--steps", type=int, default=100, help="steps per block")
    p.add_argument("--blocks", type=int, default=8, help="pairs of blocks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    job = horovod_job.start(args.workload, ["--layers", str(args.layers)])
    if job is None:
        return 2
    mpi_ops, model, wl, rank = job.mpi_ops, job.model, job.wl, job.rank
    clock = time.perf_counter_ns
    ready: dict[int, int] = {}  # parameter index -> its gradient's ready time, this step
    waits: dict[str, dict[int, list[int]]] = {"on": {}, "off": {}}
    arm = ["off"]
    named = [(n, q) for n, q in model.named_parameters() if q.requires_grad]
    params = [q for _, q in named]
    index_of = {n.encode(): i for i, (n, _) in enumerate(named)}  # Horovod's name -> index
    accs = []
    for i, q in enumerate(params):
        acc = q.expand_as(q).grad_fn.next_functions[0][0]
        accs.append(acc)  # kept alive: the node, and so its hooks, are the parameter's

        def on_ready(*_: Any, i: int = i) -> None:
            ready[i] = clock()
        acc.register_hook(on_ready)
    for name in [n for n in dir(mpi_ops.mpi_lib) if n.startswith(PREFIX)]:
        orig = getattr(mpi_ops.mpi_lib, name)

        def entered(tensor: Any, output: Any, divisor: Any, name: Any, *rest: Any,
                    _orig: Any = orig) -> Any:
            t = clock()
            i = index_of.get(name)
            if i is not None and i in ready:
                waits[arm[0]].setdefault(i, []).append(t - ready.pop(i))
            return _orig(tensor, output, divisor, name, *rest)
        setattr(mpi_ops.mpi_lib, name, entered)
    opt = job.optimizer()  # its hooks after ours on each accumulator

    def train(n: int, first: int) -> None:
        for s in range(first, first + n):
            opt.zero_grad()
            x, y = wl.batch(rank, s % 50)
            wl.loss(model(x), y).backward()
            opt.step()

    train(20, 0)  # warm
    waits = {"on": {}, "off": {}}
    rng = random.Random(args.seed)
    pairs: list[dict[str, float]] = []
    step = 20
    for _ in range(args.blocks):
        order = ["on", "off"]
        rng.shuffle(order)
        med: dict[str, float] = {}
        for a in order:
            job.python_hooks(a == "on")
            arm[0] = a
            mark = {i: len(v) for i, v in waits[a].items()}
            train(args.steps, step)
            step += args.steps
            per = [statistics.median(v[mark.get(i, 0):]) for i, v in waits[a].items()
                   if len(v) > mark.get(i, 0)]
            med[a] = statistics.median(per) if per else float("nan")
        pairs.append(med)
    job.python_hooks(True)
    if rank != 0:
        return 0
    by_tensor = {a: {i: statistics.median(v) for i, v in waits[a].items() if v}
                 for a in ("on", "off")}
    both = sorted(set(by_tensor["on"]) & set(by_tensor["off"]))
    diff = [by_tensor["on"][i] - by_tensor["off"][i] for i in both]
    pair_diff = [p["on"] - p["off"] for p in pairs]
    m, lo, hi = median_ci(pair_diff, seed=args.seed)
    out = {
        "workload": args.workload, "tensors": len(params), "steps_per_block": args.steps,
        "block_pairs": args.blocks,
        "median_ns": {a: statistics.median(by_tensor[a].values()) for a in ("on", "off")},
        "per_tensor_diff_ns": {"median": statistics.median(diff), "min": min(diff),
                               "max": max(diff)},
        "block_pairs_diff_ns": {"median": m, "ci95": [lo, hi]},
    }
    print(f"gradient ready -> Horovod's enqueue, {len(params)} tensors, {args.blocks} pairs of "
          f"{args.steps}-step blocks:")
    print(f"  hooks on: median {out['median_ns']['on'] / 1e3:.2f} us a tensor; off: "
          f"{out['median_ns']['off'] / 1e3:.2f} us")
    print(f"  per tensor, on - off: median {statistics.median(diff):+.0f} ns "
          f"(tensors' range {min(diff):+.0f} to {max(diff):+.0f} ns); over the block pairs: "
          f"{m:+.0f} ns [{lo:+.0f}, {hi:+.0f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
