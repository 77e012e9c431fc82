#!/usr/bin/env python3
"""What the profiler's Python-side hooks cost the training thread, piece by
piece (benchmarks/, not a test).

    HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR=/tmp/hc mpirun -n 1 \\
        python benchmarks/overhead/hook_cost.py [--steps 400] [--blocks 10]

A real Horovod job (one rank unless mpirun says more; the corpus' mlp6: six
nn.Linear(96, 96), 12 gradient tensors, or --workload W [--workload-args ...])
with the library loaded.  Two parts:

* pieces: each piece of per-step hook work called in a loop on the main
  thread (the records' clock through ctypes, the schedstat read, the step
  hook with its record and per-thread CPU rows, one tensor record), its
  thread CPU time per call (time.thread_time_ns around the loop);
* whole: training steps in blocks, in pairs (order drawn at random, the
  same on every rank) with the Python hooks on
  (the DistributedOptimizer step/synchronize wrappers and the tensor entry
  points) and off (Horovod's own functions: horovod_hooks.unpatch_module,
  tensors.unpatch_module); the main thread's CPU time per step in each
  block (no waits in it), and the difference of the medians; the same for
  the forward and backward passes alone (where the tensor hooks run, without
  synchronize's polling); ``--toggle tensors`` switches the tensor hooks
  alone.  The MPI wrappers stay on in both: what is compared is the Python
  side alone.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shlex
import statistics
import sys
import time
from typing import Any, Callable

import horovod_job  # beside this script


def per_call(fn: Callable[[], Any], n: int) -> float:
    """Thread CPU ns per call of fn over n calls (best of 3 loops)."""
    best = float("inf")
    for _ in range(3):
        c0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - c0) / n)
    return best


def geo_ci(ratios: list[float], seed: int, n: int = 4000) -> tuple[float, float, float]:
    """Geometric mean of the pairs' ratios with a 95% bootstrap interval."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(seed)
    boot = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(n))
    return (math.exp(statistics.fmean(logs)), math.exp(boot[int(0.025 * n)]),
            math.exp(boot[int(0.975 * n) - 1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="mlp6",
                   help="a corpus workload (default mlp6: 12 gradient tensors)")
    p.add_argument("--workload-args", default="", metavar="ARGS",
                   help="more arguments of the workload (\"--layers 6\": bert's 105 tensors)")
    p.add_argument("--steps", type=int, default=200, help="steps per block")
    p.add_argument("--blocks", type=int, default=10, help="pairs of blocks")
    p.add_argument("--seed", type=int, default=0, help="the pairs' order")
    p.add_argument("--inside", type=int, default=0, metavar="STEPS",
                   help="first, STEPS steps with every hook invocation measured")
    p.add_argument("--calls", type=int, default=2000, help="calls per piece")
    p.add_argument("--toggle", choices=("all", "tensors"), default="all",
                   help="whole steps: switch every Python-side hook (all) or the tensor "
                        "hooks alone, the step hooks staying on (tensors)")
    p.add_argument("--wall-only", action="store_true",
                   help="with --inside: time each invocation on the wall clock alone (no "
                        "thread-clock system call before it, which leaves its work colder)")
    args = p.parse_args(argv)
    job = horovod_job.start(args.workload, shlex.split(args.workload_args))
    if job is None:
        return 2
    import torch

    from profiler.collect import steps, tensors

    hvd, model, wl, rank = job.hvd, job.model, job.wl, job.rank
    opt = job.optimizer()

    def train(n: int, first: int) -> int:
        """n steps; returns the main thread's CPU ns in their forward and
        backward passes (the tensor hooks run there; synchronize's polling
        does not)."""
        passes = 0
        for s in range(first, first + n):
            opt.zero_grad()
            x, y = wl.batch(rank, s % 50)
            c0 = time.thread_time_ns()
            wl.loss(model(x), y).backward()
            passes += time.thread_time_ns() - c0
            opt.step()
        return passes

    train(30, 0)  # warm: caches, Horovod's response cache, first records
    out: dict[str, Any] = {}
    # -- pieces --------------------------------------------------------
    lib = steps._library()
    pieces: dict[str, Callable[[], Any]] = {
        "steps.now (hvprof_now via _fastrec)": steps.now,
        "lib.now (no wrapper)": lib.now,
        "lib.rank (ctypes)": lib.rank,
        "steps.schedstat (pread)": steps.schedstat,
        "time.thread_time_ns": time.thread_time_ns,
        "time.perf_counter_ns": time.perf_counter_ns,
        "steps.hook_step (records + cpu rows)": steps.hook_step,
    }
    for name, fn in pieces.items():
        out[name] = per_call(fn, args.calls)
    t = torch.zeros(96)
    out["allreduce_async_ + synchronize, hooked (ns)"] = per_call(
        lambda: hvd.synchronize(hvd.allreduce_async_(t, name="hc.t")), 200)
    job.python_hooks(False)
    out["allreduce_async_ + synchronize, unhooked (ns)"] = per_call(
        lambda: hvd.synchronize(hvd.allreduce_async_(t, name="hc.t")), 200)
    job.python_hooks(True)
    if rank == 0:
        for k, v in out.items():
            print(f"  {k:48s} {v / 1e3:8.2f} us")
    # -- every hook invocation measured inside the job -------------------
    if args.inside:
        from profiler.collect import selfcost

        works: list[int] = []
        first, add = selfcost.MEASURE_FIRST, selfcost.add_python
        clock0 = selfcost.clock
        if args.wall_only:  # both of close()'s intervals then read the wall clock
            selfcost.clock = time.perf_counter_ns
        selfcost.MEASURE_FIRST = 1 << 62  # every invocation measured, counted for itself
        if tensors._fast:  # the C hook keeps its own count
            tensors._fast.sampling(selfcost.MEASURE_FIRST, selfcost.SAMPLE_EVERY)
        selfcost.add_python = lambda work, paid=0, weight=None: works.append(work)  # type: ignore[assignment]
        timed: dict[str, list[int]] = {}

        def timing(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            acc = timed.setdefault(label, [])

            def call(*a: Any) -> Any:
                t = time.perf_counter_ns()
                try:
                    return fn(*a)
                finally:
                    acc.append(time.perf_counter_ns() - t)
            return call

        # the C step hook (profiler._fastrec.StepHook) calls the library
        # itself; the Python API's boundary is timed where the Python hooks run
        hook_step0 = steps.hook_step
        steps.hook_step = timing("steps.hook_step", hook_step0)  # type: ignore[assignment]
        c_work0 = tensors._fast.work_ns() if tensors._fast else (0, 0, 0)
        train(args.inside, 30)
        if tensors._fast and rank == 0:  # the C hooks measure in C (fastrec's meter)
            c_work = [b - a for a, b in zip(c_work0, tensors._fast.work_ns())]
            print(f"  C hooks, every invocation measured: tensor hooks "
                  f"{c_work[0] / args.inside / 1e3:.2f} us a step, step and synchronize "
                  f"hooks {c_work[1] / args.inside / 1e3:.2f} us a step, measuring them "
                  f"{c_work[2] / args.inside / 1e3:.2f} us a step")
        steps.hook_step = hook_step0  # type: ignore[assignment]
        if rank == 0:
            for k, v in ((k, v) for k, v in timed.items() if v):
                print(f"    {k}: {len(v) / args.inside:.1f} a step, median "
                      f"{statistics.median(v) / 1e3:.2f} us, mean {statistics.fmean(v) / 1e3:.2f}")
        selfcost.MEASURE_FIRST, selfcost.add_python = first, add  # type: ignore[assignment]
        selfcost.clock = clock0
        if tensors._fast:
            tensors._fast.sampling(first, selfcost.SAMPLE_EVERY)
        if rank == 0 and works:
            q = statistics.quantiles(works, n=10)
            print(f"  every invocation measured ({len(works)} in "
                  f"{args.inside} steps): work median {statistics.median(works) / 1e3:.2f} us, "
                  f"mean {statistics.fmean(works) / 1e3:.2f}, p10 {q[0] / 1e3:.2f}, p90 "
                  f"{q[-1] / 1e3:.2f}; sum per step {sum(works) / args.inside / 1e3:.1f} us, "
                  f"of medians {statistics.median(works) * len(works) / args.inside / 1e3:.1f}")
            # invocations a step: its tensors, then synchronize, then the step
            per = len(works) // args.inside
            if per > 2 and len(works) == per * args.inside:
                for label, sel in (("tensor hooks", [w for i, w in enumerate(works)
                                                     if i % per < per - 2]),
                                   ("synchronize hook", works[per - 2::per]),
                                   ("step hook", works[per - 1::per])):
                    print(f"    {label}: median {statistics.median(sel) / 1e3:.2f} us, mean "
                          f"{statistics.fmean(sel) / 1e3:.2f}, max {max(sel) / 1e3:.0f}; per step "
                          f"{sum(sel) / args.inside / 1e3:.1f} us")
    # -- whole steps, hooks on/off in alternating blocks -----------------
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    wall: dict[str, list[float]] = {"on": [], "off": []}
    passes: dict[str, list[float]] = {"on": [], "off": []}
    rng = random.Random(args.seed)  # the same on every rank
    order: list[str] = []
    for _ in range(args.blocks):
        order += ["on", "off"] if rng.random() < 0.5 else ["off", "on"]
    step = 30
    for arm in order:
        if arm == "off":
            job.python_hooks(False, step_hooks=args.toggle == "all")
        train(5, step)
        step += 5
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        p_ns = train(args.steps, step)
        cpu[arm].append((time.thread_time_ns() - c0) / args.steps)
        wall[arm].append((time.perf_counter_ns() - w0) / args.steps)
        passes[arm].append(p_ns / args.steps)
        step += args.steps
        if arm == "off":
            job.python_hooks(True, step_hooks=args.toggle == "all")
    if rank == 0 and args.blocks:
        which = "every Python-side hook" if args.toggle == "all" else "the tensor hooks"
        print(f"  switched: {which}")
        for what, d in (("main thread CPU", cpu), ("wall", wall),
                        ("forward and backward passes' CPU", passes)):
            ratios = [a / b for a, b in zip(d["on"], d["off"])]
            gm, lo, hi = geo_ci(ratios, args.seed)
            print(f"  {what} per step, hooks on / off ({len(ratios)} pairs): {gm:.4f} "
                  f"[{lo:.4f}, {hi:.4f}]; medians on {statistics.median(d['on']) / 1e3:.1f}"
                  f" us, off {statistics.median(d['off']) / 1e3:.1f} us, difference of the "
                  f"medians {(statistics.median(d['on']) - statistics.median(d['off'])) / 1e3:+.1f}"
                  " us")
        print(f"  pid {os.getpid()}, steps recorded {steps.steps_recorded()}")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
