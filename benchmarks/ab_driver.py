"""In-process half of ``images_per_sec.py --within`` (benchmarks/, not a test).

Runs the bundled training benchmark (profiler.workloads.train_bench) in a
job profiled with HOROVOD_PROFILE=1 and switches the profiler's per-call work
off and on between timed iterations, so that profiled and unprofiled
iterations alternate inside one run and share its machine state (the same
processes, cores, memory layout and neighbours): the run-to-run variation
that makes separate runs differ by 25-50% on this project's machine cancels
out of each pair.

Iterations come in pairs, one of each arm, the order within each pair
drawn at random (``--seed``, the same on every rank): a drift within the run
cancels out of the pairs' mean, and so does anything periodic in the job
(Python's garbage collector after a fixed number of allocations, the helper
thread's ticks) that a fixed order such as ABBA could meet in step, as the
first control runs with ABBA did (an A/A images/sec ratio of 101.7% [100.2,
103.2], a main-thread CPU ratio of 98.3% [96.9, 99.9]: intervals that
exclude 100%).

"off" switches off what the profiler does per MPI call, per tensor handed to
Horovod and per record: the MPI wrappers (``hvprof_set_enabled(0)``: each
wrapper is then one load and a branch before the MPI call) and Horovod's
tensor entry points (``profiler.collect.tensors.unpatch_module``: Horovod's
own functions again).  What stays in both arms is measured directly and
reported beside the ratio by the orchestrator (the trace's ``self_cost``):
the helper thread's wake-ups (every HOROVOD_PROFILE_FLUSH_MS), the hang
watchdog's poll, the step hook (one record per optimizer step).  Start-up and
exit (the merge) are outside the timed iterations in both arms.

``--arms aa`` is the control: the same pairs, nothing switched (the profiler
stays on); its ratio says what the method reads where there is no
difference.

Rank 0 prints one line ``AB {json}``: the arm of every timed iteration, the
iterations' images/sec (all ranks together) and each rank's CPU time per
iteration: its main thread's (the training loop, where the hooks run:
CLOCK_THREAD_CPUTIME_ID, no waits in it, so far steadier than the wall
clock) and the whole process's; beside train_bench's own ``RESULT`` line.

    mpirun -n 2 -x HOROVOD_PROFILE=1 python benchmarks/ab_driver.py \\
        [--arms ab|aa] [--seed N] [--what all|mpi|tensors] -- --model resnet8 --num-iters 40 ...
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any


def arms_for(n: int, seed: int) -> list[str]:
    """n arms (n even) in pairs, each pair (on, off) or (off, on) at random."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(n // 2):
        out += ["on", "off"] if rng.random() < 0.5 else ["off", "on"]
    return out


class Switch:
    """The profiler's per-call work, on or off, in this process: the MPI
    wrappers, the tensor hooks, or both (`what`).  TensorFlow's kernel hooks
    go with either (a Keras job's Switch("mpi") switches its tensor records
    too)."""

    def __init__(self, what: str = "all") -> None:
        from profiler.collect import native

        if native.loaded() is None:
            raise SystemExit("ab_driver: the profiler is not active (run with HOROVOD_PROFILE=1)")
        self.state = "on"
        self.what = what
        self.hooks: dict[str, Any] = {}  # entry point -> its hook, while off

    def set(self, state: str) -> None:
        if state == self.state:
            return
        from profiler.collect import native, tensors

        on = state == "on"
        if self.what in ("all", "mpi"):
            native.set_enabled(on)
        kernels = sys.modules.get("profiler.collect.tf_kernels")
        if kernels is not None and self.what in ("all", "mpi", "tensors"):
            kernels.switch(on)  # TensorFlow's tensor records, in Horovod's kernels
        ops = sys.modules.get(tensors.TARGET)
        if ops is not None and self.what in ("all", "tensors"):
            if on:  # the same hook objects again, as a run keeps them
                for name, hook in self.hooks.items():
                    setattr(ops, name, hook)
            else:
                self.hooks = {name: ops.__dict__[name] for name in tensors.ENTRY_POINTS
                              if name in ops.__dict__}
                tensors.unpatch_module(ops)
        self.state = state


def _gather(mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's `mine`, by rank (this rank's alone without Horovod)."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return [mine]
    return list(hvd.allgather_object(mine))  # type: ignore[attr-defined]


def _rank() -> int:
    hvd = sys.modules.get("horovod.torch")
    return int(hvd.rank()) if hvd is not None else 0  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", choices=("ab", "aa"), default="ab",
                   help="ab: switch; aa: the control (nothing switched)")
    p.add_argument("--seed", type=int, default=0, help="the pairs' order")
    p.add_argument("--what", choices=("all", "mpi", "tensors"), default="all",
                   help="what the switch turns off: the MPI wrappers and the tensor hooks "
                        "(all), or one of them")
    args = p.parse_args(argv)

    from profiler.workloads import train_bench

    bench_args = train_bench.parse_args(rest)
    if bench_args.num_iters % 2:
        raise SystemExit("ab_driver: --num-iters must be even (iterations come in pairs)")
    switch = Switch(args.what)
    arms = arms_for(bench_args.num_iters, args.seed)
    marks: list[tuple[int, int]] = []
    switched_at: list[int] = []  # CLOCK_MONOTONIC once each iteration's switch is done

    def mark() -> None:
        marks.append((time.thread_time_ns(), time.process_time_ns()))

    def before(i: int) -> None:
        if i:
            mark()  # the end of iteration i - 1 (the switch below is not in it)
        if i < len(arms):
            if args.arms == "ab":
                switch.set(arms[i])
            switched_at.append(time.monotonic_ns())
            mark()

    result: dict[str, Any] = train_bench.run(bench_args, before_iteration=before)
    switch.set("on")  # the job ends as it started
    starts, ends = marks[0::2], marks[1::2]
    cpu = _gather({"thread_ns": [e[0] - b[0] for b, e in zip(starts, ends)],
                   "process_ns": [e[1] - b[1] for b, e in zip(starts, ends)],
                   "switched_mono_ns": switched_at})
    if _rank() == 0:
        print("AB " + json.dumps({"arms": arms, "switched": args.arms == "ab",
                                  "images_per_sec": result["per_iteration"], "cpu": cpu}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
