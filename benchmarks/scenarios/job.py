"""A Horovod (PyTorch) training job with one known cause injected, for the
diagnosis scenarios (benchmarks/scenarios/suite.py).  Run under mpirun.

Every rank measures its own steps with its own clocks, independently of the
profiler, and rank 0 prints them as one JSON line at the end (``{"scenario":
{...}}``): the mean step time, the mean time outside optimizer.step (what the
step breakdown calls compute), and the main thread's run-queue wait per step
outside optimizer.step, read from /proc/self/task/<tid>/schedstat, per rank
(inside it Horovod's synchronize stays runnable while it waits: not
contention); every step's arrival at optimizer.step on CLOCK_MONOTONIC (one
clock for every process of a kernel, simulated hosts included); and the
busiest other threads' run-queue share over the timed steps (Horovod's
background thread, intra-op workers).

    mpirun -n 2 python job.py --model mlp --steps 40 [--late-rank 1 --late-ms 30
        [--late-kind spin]]
        [--jitter-ms 60 [--jitter-shape exponential]] [--stall-ms 50] [--threads 2]
        [--alternate {0,1} [--toggle-pids PID,...]]

--alternate P is the runner's in-run twin: the cause is on only in the steps
whose number is P modulo 2 (the late rank's delay; the processes named by
--toggle-pids run, stopped in the other steps by rank 0), so that the two
halves of one run share the machine's state and a step with the cause
against its neighbours without prices it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import horovod.torch as hvd
import torch
from pauses import pauses  # this folder: the runner prices the same draws

CLIFF_WIDTHS = (32, 64, 128, 256, 320, 384, 448, 512, 1000, 2048)


class Heads(torch.nn.Module):
    """Independent linear heads on one input: one weight tensor per width, of
    128 x width float32s (16 KiB to 1 MiB), each its own message with fusion off."""

    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(128, w, bias=False) for w in widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([h(x).mean(dim=1) for h in self.heads], dim=1)


def model(name: str) -> tuple[torch.nn.Module, int | tuple[int, ...], int]:
    """(model, input width or shape, output width)."""
    torch.manual_seed(0)
    if name == "resnet8":  # the main job's model: 29 gradient tensors, 312 KB
        from profiler.workloads.train_bench import build_model

        return build_model("resnet8"), (3, 32, 32), 10
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
    if name == "many":  # 256 tiny layers: 512 tensors of 256 B and 32 B
        layers = []
        for _ in range(256):
            layers += [torch.nn.Linear(8, 8), torch.nn.Tanh()]
        return torch.nn.Sequential(*layers), 8, 8
    if name == "mid":  # about 4 MiB of gradients
        return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10)), 1024, 10
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


def threads_schedstat() -> dict[int, tuple[str, int, int]]:
    """Every thread of this process: tid -> (name, ns on a CPU, ns waiting)."""
    out: dict[int, tuple[str, int, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                run, wait = (int(x) for x in fh.read().split()[:2])
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except (OSError, ValueError):
            continue
        out[int(tid)] = (name, run, wait)
    return out


def other_threads_wait(before: dict[int, tuple[str, int, int]], wall_ns: int,
                       main_tid: int) -> list[dict[str, object]]:
    """The other threads busy at least a tenth of the timed steps: their name and
    run-queue share (wait over run + wait) over those steps."""
    rows = []
    for tid, (name, run, wait) in threads_schedstat().items():
        if tid == main_tid:
            continue
        r0, w0 = before.get(tid, (name, 0, 0))[1:]
        dr, dw = run - r0, wait - w0
        if dr >= 0.1 * wall_ns and dr + dw > 0:
            rows.append({"name": name, "wait_share": dw / (dr + dw)})
    return rows


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
    p.add_argument("--late-kind", choices=("sleep", "spin"), default="sleep",
                   help="how the late rank spends --late-ms: asleep, or computing (a busy "
                        "loop until its thread has run that long on a CPU)")
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--jitter-shape", choices=("uniform", "exponential"), default="uniform",
                   help="each rank's pause a step: uniform(0, J), or exponential with "
                        "mean J/2 (the same mean, a long tail)")
    p.add_argument("--stall-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alternate", type=int, choices=(0, 1), default=None,
                   help="the cause only in steps of this parity (the runner's in-run twin)")
    p.add_argument("--toggle-pids", default="",
                   help="with --alternate: processes rank 0 lets run in the cause's steps only")
    p.add_argument("--toggle-how", choices=("stop", "idle", "stopidle"), default="stop",
                   help="how they are kept from the other steps: stopped (SIGSTOP), left "
                        "running at SCHED_IDLE, or made SCHED_IDLE and stopped (continued "
                        "at SCHED_IDLE, then made normal); toggle_check.py compares them")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    hvd.init()
    rank = hvd.rank()
    net, n_in, n_out = model(a.model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.001),
                                   named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(1234 + rank)
    shape = n_in if isinstance(n_in, tuple) else (n_in,)
    x = torch.randn(a.batch, *shape, generator=g)
    y = torch.randn(a.batch, n_out, generator=g)
    jitter = pauses(a.seed, rank, a.jitter_ms, a.jitter_shape)
    steps, outside, waits, arrivals, iters = [], [], [], [], []
    last = time.perf_counter()
    rq = run_queue_ns()
    threads0: dict[int, tuple[str, int, int]] = {}
    t_timed = 0
    # the processes rank 0 lets run in the cause's steps only (--alternate)
    toggled = [int(x) for x in a.toggle_pids.split(",") if x] if rank == 0 else []
    try:
        for step in range(a.steps + a.warmup):
            on = a.alternate is None or step % 2 == a.alternate  # the cause, this step
            for pid in toggled:
                _toggle(pid, on, a.toggle_how)
            # the "data loading" of this step: every injected sleep happens here
            pause = a.stall_ms + next(jitter)
            if on and rank == a.late_rank and a.late_kind == "spin":
                until = time.thread_time_ns() + int(a.late_ms * 1e6)
                while time.thread_time_ns() < until:
                    pass
            elif on and rank == a.late_rank:
                pause += a.late_ms
            if pause:
                time.sleep(pause / 1e3)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            t_in = time.perf_counter()
            rq_in = run_queue_ns()
            arrivals.append(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
            if step == a.warmup:
                threads0, t_timed = threads_schedstat(), time.monotonic_ns()
            opt.step()
            now = time.perf_counter()
            rq_now = run_queue_ns()
            if step >= a.warmup:
                steps.append(now - last)
                outside.append((now - last) - (now - t_in))
                waits.append((rq_in - rq) / 1e6 if rq >= 0 and rq_in >= 0 else float("nan"))
            iters.append(1e3 * (now - last))
            last, rq = now, rq_now
    finally:
        for pid in toggled:  # as they came: running (the runner stops them)
            _toggle(pid, True, a.toggle_how)
    mine = {"rank": rank, "step_ms": 1e3 * sum(steps) / len(steps),
            "outside_ms": 1e3 * sum(outside) / len(outside),
            # the run-queue wait outside optimizer.step
            "run_queue_ms": sum(waits) / len(waits), "loss": float(loss.detach()),
            # every iteration, warm-up included: from the end of the previous
            # optimizer.step to the end of its own (the profiler's step s is
            # iteration s + 1: its step hook's first call only opens a step)
            "iter_ms": iters,
            # arrival at optimizer.step per timed step (ns, CLOCK_MONOTONIC)
            "arrivals_ns": arrivals[a.warmup:],
            "other_threads": other_threads_wait(threads0, time.monotonic_ns() - t_timed,
                                                threading_native_id())}
    every = hvd.allgather_object(mine)
    if rank == 0:
        print(json.dumps({"scenario": {"ranks": every, "steps": a.steps, "warmup": a.warmup,
                                       "pid": os.getpid()}}), flush=True)
    hvd.shutdown()


def _toggle(pid: int, on: bool, how: str) -> None:
    """Let a process run as a normal one (`on`), or keep it from the job's
    CPU time (`how`, --toggle-how): stopped; at SCHED_IDLE (it runs when no
    other task wants the CPU, but takes what the job's yielding threads hand
    it); or both, continued at SCHED_IDLE before it is made normal."""
    try:
        if how == "stop":
            os.kill(pid, signal.SIGCONT if on else signal.SIGSTOP)
        elif how == "stopidle":
            if on:
                os.kill(pid, signal.SIGCONT)
                os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
            else:
                os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
                os.kill(pid, signal.SIGSTOP)
        else:
            os.sched_setscheduler(pid, os.SCHED_OTHER if on else os.SCHED_IDLE,
                                  os.sched_param(0))
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main()
