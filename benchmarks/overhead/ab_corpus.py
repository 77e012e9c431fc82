#!/usr/bin/env python3
"""The profiler's whole run-time cost inside one job (benchmarks/, not a
test): blocks of training steps with the profiler's parts switched on or
off, in random order, so that the machine's drift between separate runs
cancels out (issue 25, "what profiling them costs").

    python benchmarks/overhead/ab_corpus.py [--workload mlp6] [--runs 4]
        [--block 100] [--groups 10] [--arms off,on,held] [--bind core]
        [--json OUT] [--env VAR=V ...]

Each run is one ``mpirun -n NP`` of a corpus workload
(profiler.workloads.corpus) profiled with HOROVOD_PROFILE=1.  After
``--warm`` steps with everything on, the loop runs ``--groups`` groups of
one block per arm, each ``--block`` optimizer steps, the order within a
group drawn at random (``--seed`` plus the run's number, the same on every
rank).  The parts an arm keeps on:

- ``mpi``: the MPI wrappers (``hvprof_set_enabled``; off, each wrapper is
  one load and a branch before PMPI);
- ``tensors``: Horovod's tensor entry points hooked (off: Horovod's own);
- ``steps``: the DistributedOptimizer's step and synchronize hooks (off:
  Horovod's own), with the per-step CPU reads they make;
- ``helper``: the helper thread's clock ticks every flush period (off:
  ``hvprof_set_flush_ms(0)``, it wakes only when a thread runs short of
  buffers); ``helper@MS`` ticks every MS ms instead of the job's period.

Built-in arms: ``on`` (all), ``off`` (none: what is left is the hang
watchdog's poll every few seconds and the wrappers' branch), ``held`` (all
but the helper), ``nostep``, ``notensor``, ``nompi``, ``flushMS`` (all,
the helper every MS ms); or ``NAME=part+part``.
Between blocks (outside them) the helper flushes what is left, so that a
block's records are written in that block or between blocks, never in the
next block: an arm without the helper's ticks writes them all between
blocks, so ``held`` says what the helper's whole work costs.  A period
compares fairly with another only in blocks several periods long.
The block's rate is rank 0's steps per second of wall clock between the
block's first and last step (the switch is outside it); each group gives
each arm's rate over the ``off`` block's, and the table gives the median
over all groups of all runs with a 95% bootstrap interval.  What separate
runs cannot share (start-up, the exit merge, memory layout) is outside it:
benchmarks/overhead/job_rate.py measures those runs.

Run it under the machine's lock when others share it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ab_driver
from job_rate import base_env, median_ci  # noqa: E402

PARTS = ("mpi", "tensors", "steps", "helper")
DRAIN_S = 0.005  # the helper flushes within 1 ms; both ranks pause alike
BUILTIN = {
    "on": frozenset(PARTS),
    "off": frozenset(),
    "held": frozenset(PARTS) - {"helper"},
    "nostep": frozenset(PARTS) - {"steps"},
    "notensor": frozenset(PARTS) - {"tensors"},
    "nompi": frozenset(PARTS) - {"mpi"},
}


Arm = tuple[frozenset[str], int | None]  # parts on, the helper's period (None: the job's)


def parse_arms(text: str) -> dict[str, Arm]:
    arms: dict[str, Arm] = {}
    for item in filter(None, text.split(",")):
        name, sep, parts = item.partition("=")
        period: int | None = None
        if not sep and name.startswith("flush") and name[5:].isdigit():
            parts, sep = "+".join(PARTS) + "@" + name[5:], "="
        if sep:
            got = set(filter(None, parts.split("+")))
            for p in list(got):
                if p.startswith("helper@") and p[7:].isdigit() and 0 < int(p[7:]) <= 60000:
                    got.discard(p)
                    got.add("helper")
                    period = int(p[7:])
            bad = got - set(PARTS)
            if bad:
                raise argparse.ArgumentTypeError(f"{item!r}: parts are {', '.join(PARTS)} "
                                                 "(helper@MS: a period of 1 to 60000 ms)")
            arms[name] = (frozenset(got), period)
        elif name in BUILTIN:
            arms[name] = (BUILTIN[name], None)
        else:
            raise argparse.ArgumentTypeError(f"{name!r}: one of {', '.join(BUILTIN)}, flushMS "
                                             "or NAME=part+part")
    if "off" not in arms or len(arms) < 2:
        raise argparse.ArgumentTypeError("the arms include off and at least one other")
    return arms


def block_order(arms: list[str], groups: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(groups):
        g = list(arms)
        rng.shuffle(g)
        out += g
    return out


class Parts:
    """The profiler's run-time parts in this process, switched per block."""

    def __init__(self) -> None:
        from profiler.collect import native

        if native.loaded() is None:
            raise SystemExit("ab_corpus: the profiler is not active (HOROVOD_PROFILE=1)")
        self.on = frozenset(PARTS)
        from ab_driver import Switch  # benchmarks/: Horovod's tensor entry points

        self.tensor_switch = Switch("tensors")
        self.step_hooks: dict[str, Any] = {}
        self.period = native.set_flush_ms(25)  # the job's (HOROVOD_PROFILE_FLUSH_MS)
        native.set_flush_ms(self.period)
        if self.period <= 0:
            raise SystemExit("ab_corpus: the helper's period cannot be switched here")
        self.job_period = self.period

    def drain(self) -> None:
        """Flush what the threads recorded, outside the timed blocks: the
        helper at a 1 ms period for DRAIN_S, then at the block's own."""
        from profiler.collect import native

        native.set_flush_ms(1)
        time.sleep(DRAIN_S)
        native.set_flush_ms(self.period)

    def set(self, arm: Arm, opt: Any) -> None:
        from profiler.collect import native

        want, period = arm
        period = (period or self.job_period) if "helper" in want else 0
        if period != self.period:
            native.set_flush_ms(period)
            self.period = period
        for part in PARTS:
            if part == "helper" or (part in want) == (part in self.on):
                continue
            on = part in want
            if part == "mpi":
                native.set_enabled(on)
            elif part == "tensors":
                self.tensor_switch.set("on" if on else "off")
            elif part == "steps":
                cls = type(opt)  # Horovod's per-optimizer class, its template's methods
                for method in ("step", "synchronize"):
                    if on:
                        setattr(cls, method, self.step_hooks[method])
                    else:
                        self.step_hooks[method] = cls.__dict__[method]
                        setattr(cls, method, _unhooked(opt, method))
        self.on = want


def _unhooked(opt: Any, method: str) -> Any:
    """The optimizer's `method` as it would be unprofiled: Horovod's own,
    inside torch's profiling wrapper where torch put one around step
    (Optimizer._patch_step_function wraps the class's step once)."""
    current = type(opt).__dict__[method]
    outer, hook = current, current
    while getattr(hook, "__hvprof_wrapped__", None) is None:
        hook = getattr(hook, "__wrapped__", None)
        if hook is None:
            raise SystemExit(f"ab_corpus: the optimizer's {method} is not the profiler's hook")
    orig = hook.__hvprof_wrapped__
    if outer is hook:
        return orig
    if not getattr(outer, "hooked", False):
        raise SystemExit(f"ab_corpus: the optimizer's {method} is wrapped by something "
                         "other than torch's step profiler")
    wrapped = opt.profile_hook_step(orig)
    wrapped.hooked = True
    return wrapped


def inner(args: argparse.Namespace) -> int:
    """One rank of one run (under mpirun)."""
    import torch

    from profiler.workloads import corpus

    arms = parse_arms(args.arms)
    order = block_order(list(arms), args.groups, args.seed)
    total = args.warm + len(order) * args.block
    cargs = corpus.parse_args([args.workload, "--steps", str(total)])
    torch.set_num_threads(1)
    import horovod.torch as hvd

    corpus.init_horovod(hvd, args.workload)
    parts = Parts()
    marks: list[tuple[float, float]] = []
    from profiler.collect import native

    now = native.function("hvprof_now")
    ticks: list[int] = []  # the profiler's clock (records' ticks) as each block begins, ends

    def before_step(step: int, opt: Any) -> None:
        k, r = divmod(step - args.warm, args.block)
        if step < args.warm or r:
            return
        if k:
            ticks.append(int(now()))
            marks.append((time.perf_counter(), time.thread_time()))  # block k-1 ends
        # the records still in memory go to the file between the blocks, so
        # that no block's flush work lands in the next block
        parts.drain()
        if k < len(order):
            parts.set(arms[order[k]], opt)
            marks.append((time.perf_counter(), time.thread_time()))  # block k begins
            ticks.append(int(now()))
        else:
            parts.set((frozenset(PARTS), None), opt)  # the job ends as it started

    corpus._train(args.workload, cargs, hvd, lambda images: None, before_step)
    hvd.barrier()
    if hvd.rank() == 0:
        starts, ends = marks[0::2], marks[1::2]
        print("AB " + json.dumps({
            "order": order, "block": args.block,
            "wall_s": [e[0] - s[0] for s, e in zip(starts, ends)],
            "cpu_s": [e[1] - s[1] for s, e in zip(starts, ends)],
            "ticks": [ticks[i:i + 2] for i in range(0, len(ticks), 2)]}), flush=True)
    hvd.shutdown()
    return 0


def run_once(args: argparse.Namespace, seed: int, work: Path) -> dict[str, Any]:
    env = base_env()
    env.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(work / f"prof-{seed}"))
    for item in args.env:
        k, _, v = item.partition("=")
        env[k] = v
    if args.bind != "none":
        env.pop("OMPI_MCA_hwloc_base_binding_policy", None)
    bind = ["--bind-to", args.bind] if args.bind != "none" else []
    cmd = ["mpirun", "-n", str(args.np), *bind, sys.executable, str(Path(__file__).resolve()),
           "--inner", "--workload", args.workload, "--block", str(args.block),
           "--groups", str(args.groups), "--warm", str(args.warm), "--arms", args.arms,
           "--seed", str(seed)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                       cwd=str(work))
    line = next((x for x in p.stdout.splitlines() if x.startswith("AB ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n"
                           f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(line[3:])
    return out


def ratios(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, dict[str, list[float]]]:
    """Per group: each arm's rate and CPU per step over the off block's."""
    out: dict[str, dict[str, list[float]]] = {a: {"rate": [], "cpu": [], "extra_us": []}
                                               for a in arms if a != "off"}
    for run in runs:
        n = len(arms)
        order = run["order"]
        for g in range(len(order) // n):
            blk = {order[g * n + i]: g * n + i for i in range(n)}
            off_wall, off_cpu = run["wall_s"][blk["off"]], run["cpu_s"][blk["off"]]
            for a in out:
                wall, cpu = run["wall_s"][blk[a]], run["cpu_s"][blk[a]]
                out[a]["rate"].append(off_wall / wall)
                out[a]["cpu"].append(cpu / off_cpu)
                out[a]["extra_us"].append((wall - off_wall) / run["block"] * 1e6)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="mlp6")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--block", type=int, default=100, help="optimizer steps a block")
    p.add_argument("--groups", type=int, default=10, help="groups of one block per arm, a run")
    p.add_argument("--warm", type=int, default=50, help="steps before the first block")
    p.add_argument("--arms", default="off,on,held")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bind", choices=("none", "core"), default="core")
    p.add_argument("--env", action="append", default=[], metavar="VAR=V",
                   help="set in every run (the profiler's settings: HOROVOD_PROFILE_...)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        arms = parse_arms(args.arms)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.inner:
        return inner(args)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ab_corpus-") as tmp:
        for i in range(args.runs):
            t0 = time.monotonic()
            run = run_once(args, args.seed + i, Path(tmp))
            runs.append(run)
            one = ratios([run], list(arms))
            print(f"run {i + 1}/{args.runs} ({time.monotonic() - t0:.0f} s): "
                  + ", ".join(f"{a} {statistics.median(v['rate']):.3f}"
                              for a, v in one.items()), flush=True)
    res = ratios(runs, list(arms))
    n = len(next(iter(res.values()))["rate"])
    off_ms = statistics.median(w / r["block"] * 1e3 for r in runs
                               for w, a in zip(r["wall_s"], r["order"]) if a == "off")
    print(f"\n{args.workload}, {args.np} ranks (binding: {args.bind}), {args.runs} runs of "
          f"{args.groups} groups of {args.block}-step blocks ({n} groups), started {started}"
          + (f", {' '.join(args.env)}" if args.env else "")
          + f"\n  off: {off_ms:.3f} ms a step (median block); rate over the same group's off "
          "block: median (95% bootstrap interval), and the time it adds a step")
    summary: dict[str, Any] = {}
    for a, v in res.items():
        m, lo, hi = median_ci(v["rate"])
        cm, clo, chi = median_ci(v["cpu"])
        x = statistics.median(v["extra_us"])
        parts, period = arms[a]
        label = "+".join(sorted(parts)) + (f"@{period}" if period else "")
        summary[a] = {"parts": sorted(parts), "flush_ms": period, "rate_ratio": [m, lo, hi],
                      "main_cpu_ratio": [cm, clo, chi], "extra_us_per_step": x}
        print(f"  {a} ({label or 'nothing'}): rate {m:.3f} "
              f"({lo:.3f}-{hi:.3f}), {x:+.1f} us a step; main thread CPU {cm:.3f} "
              f"({clo:.3f}-{chi:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "started": started, "summary": summary, "runs": runs},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
