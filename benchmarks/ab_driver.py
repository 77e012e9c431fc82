"""In-process half of ``images_per_sec.py --within`` (benchmarks/, not a test).

Runs the bundled training benchmark (profiler.workloads.train_bench) in a
job profiled with HOROVOD_PROFILE=1 and switches the profiler's per-call work
off and on between timed iterations, so that profiled and unprofiled
iterations alternate inside one run and share its machine state (the same
processes, cores, memory layout and neighbours): the run-to-run variation
that makes separate runs differ by 25-50% on this project's machine cancels
out of each pair.

Iterations come in pairs, one of each arm, in the order ABBA (on-off,
off-on, on-off, ...) so that a drift within the run cancels too.

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
        [--arms abba|aa] -- --model resnet8 --num-iters 40 ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def arm_of(i: int) -> str:
    """ABBA: pair p = i // 2 is (on, off) when p is even, (off, on) when odd."""
    first_on = (i // 2) % 2 == 0
    return "on" if (i % 2 == 0) == first_on else "off"


class Switch:
    """The profiler's per-call work, on or off, in this process."""

    def __init__(self) -> None:
        from profiler.collect import native

        if native.loaded() is None:
            raise SystemExit("ab_driver: the profiler is not active (run with HOROVOD_PROFILE=1)")
        self.state = "on"

    def set(self, state: str) -> None:
        if state == self.state:
            return
        from profiler.collect import native, tensors

        ops = sys.modules.get(tensors.TARGET)
        on = state == "on"
        native.set_enabled(on)
        if ops is not None:
            if on:
                tensors.patch_module(ops)
            else:
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
    p.add_argument("--arms", choices=("abba", "aa"), default="abba")
    args = p.parse_args(argv)

    from profiler.workloads import train_bench

    bench_args = train_bench.parse_args(rest)
    if bench_args.num_iters % 2:
        raise SystemExit("ab_driver: --num-iters must be even (iterations come in pairs)")
    switch = Switch()
    arms = [arm_of(i) for i in range(bench_args.num_iters)]
    thread_ns: list[int] = []
    process_ns: list[int] = []
    marks: list[tuple[int, int]] = []

    def mark() -> None:
        marks.append((time.thread_time_ns(), time.process_time_ns()))

    def before(i: int) -> None:
        if i:
            mark()  # the end of iteration i - 1 (the switch below is not in it)
        if i < len(arms):
            if args.arms == "abba":
                switch.set(arms[i])
            mark()

    result: dict[str, Any] = train_bench.run(bench_args, before_iteration=before)
    switch.set("on")  # the job ends as it started
    for k in range(0, len(marks) - 1, 2):
        thread_ns.append(marks[k + 1][0] - marks[k][0])
        process_ns.append(marks[k + 1][1] - marks[k][1])
    cpu = _gather({"thread_ns": thread_ns, "process_ns": process_ns})
    if _rank() == 0:
        print("AB " + json.dumps({"arms": arms, "switched": args.arms == "abba",
                                  "images_per_sec": result["per_iteration"], "cpu": cpu}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
