#!/usr/bin/env python3
"""A Horovod job's training rate, profiled against unprofiled, in separate
runs (benchmarks/, not a test): the cost as a user's job sees it, helper
threads, exit work and all (issue 25, "what profiling them costs, measured
across runs").

    python benchmarks/overhead/job_rate.py [--workload mlp6] [--steps 1500]
        [--rounds 7] [--batch-size N] [--arm NAME=VAR=V,VAR=V ...] [--env VAR=V,...]
        [--pair ARM:BASE ...] [--json OUT]

Each round runs every arm once as its own ``mpirun -n NP python -m
profiler.workloads.corpus WORKLOAD --steps N``, in an order drawn at random
(``--seed``); ranks are not bound to cores unless ``--bind core``.  The
arms are ``off`` (HOROVOD_PROFILE unset) and ``on``
(HOROVOD_PROFILE=1, the profiler's defaults), plus any ``--arm``: a name and
the variables it sets besides HOROVOD_PROFILE=1 (``--arm nohelper=
HOROVOD_PROFILE_HELPER=0``).  An arm that sets HOROVOD_PROFILE=0 runs
unprofiled with the rest, ``--env`` sets variables in every arm (``off``
included), and ``--pair ARM:BASE`` prints ARM's rate against BASE's round
by round: ``--arm off25=HOROVOD_PROFILE=0,HOROVOD_CYCLE_TIME=0.25 --arm
on25=HOROVOD_CYCLE_TIME=0.25 --pair on25:off25`` is the profiler's cost at
another Horovod setting.  With ``--busy 16,40``, unprofiled arms
whose main thread spins 16 and 40 us after each optimizer step (the
workload's ``--busy-us``) run too: what that much work costs the job here, and so
how much main-thread work the profiler's cost is worth
(:func:`busy_equivalent`).  The rate is the workload's own ``timing``
(rank 0: optimizer steps per second from the start of step 10 to the end of
the loop, so start-up, the first steps and the exit merge are outside it),
and the main thread's CPU time per step over the same steps (no waits in it:
steadier than the wall clock).  Per round and arm the ratio to the round's
``off`` run; the table gives the median over rounds with the 25th and 75th
percentiles and a 95% bootstrap interval of the median.  Beside them, from
each profiled run's trace.json, what the profiler says it cost
(``self_cost``: the Python hooks' time and invocations per step, the
helper's CPU, the per-step CPU reads).

Run it under the machine's lock when others share it
(``flock /tmp/hvprof-machine.lock python benchmarks/overhead/job_rate.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
}


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition("=")
    env: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        k, sep, v = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r}: VAR=VALUE")
        env[k] = v
    if not name or name == "off":
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=VAR=V,...")
    return name, env


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HOROVOD_PROFILE") and not k.startswith("HOROVOD_TIMELINE")}
    env.update(MPI_ENV)
    return env


def unprofiled(extra: dict[str, str]) -> bool:
    """An arm that sets HOROVOD_PROFILE=0 (or off) runs unprofiled with its
    other variables: a Horovod setting's own effect, beside the profiler's."""
    return extra.get("HOROVOD_PROFILE", "1").lower() in ("0", "off", "")


def run_once(args: argparse.Namespace, arm: str, extra: dict[str, str] | None,
             work: Path, busy_us: float = 0.0) -> dict[str, Any]:
    """One mpirun; `extra` None = unprofiled.  Returns rank 0's timing and,
    when profiled, the trace's self_cost."""
    env = base_env()
    env.update(args.env)
    out = None
    if extra is not None and unprofiled(extra):
        env.update(extra)
    elif extra is not None:
        out = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=work))
        env.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(out / "prof"))
        env.update(extra)
    if args.bind != "none":
        env.pop("OMPI_MCA_hwloc_base_binding_policy", None)
    bind = ["--bind-to", args.bind] if args.bind != "none" else []
    cmd = ["mpirun", "-n", str(args.np), *bind, sys.executable, "-m",
           "profiler.workloads.corpus", args.workload, "--steps", str(args.steps)]
    if busy_us:
        cmd += ["--busy-us", str(busy_us)]
    if args.batch_size:
        cmd += ["--batch-size", str(args.batch_size)]
    cmd += shlex.split(args.workload_args)
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                       cwd=str(work))
    wall = time.monotonic() - t0
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"{arm}: {' '.join(cmd)} failed ({p.returncode}):\n"
                           f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    timing = json.loads(line[len("RESULT "):]).get("timing")
    if timing is None:  # ops: its collectives, once each, no training loop
        print(f"job_rate: {args.workload} has no training steps to time (its RESULT has "
              "no timing)", file=sys.stderr)
        raise SystemExit(2)
    res: dict[str, Any] = {"arm": arm, "job_wall_s": round(wall, 2), **timing}
    if timing.get("steps"):
        res["main_cpu_us_per_step"] = round(timing["main_cpu_s"] / timing["steps"] * 1e6, 1)
        for key in PHASES:  # the corpus' two phases of a step (corpus._LoopClock)
            if key in timing:
                res[f"{key}_us_per_step"] = round(timing[key] / timing["steps"] * 1e6, 1)
    if out is not None:
        res["self_cost"] = self_cost(out / "prof" / "trace.json", args.steps)
        shutil.rmtree(out, ignore_errors=True)
    return res


#: the corpus' phases of a step, wall and main-thread CPU (corpus._LoopClock)
PHASES = ("compute_s", "compute_cpu_s", "step_s", "step_cpu_s")


def phase_deltas(mine: list[dict[str, Any]], off: dict[int, dict[str, Any]]
                 ) -> dict[str, list[float]]:
    """Per phase: the median (95% interval) of what the arm adds a step to the
    same round's unprofiled run, in us."""
    out: dict[str, list[float]] = {}
    for key in PHASES:
        k = f"{key}_us_per_step"
        d = [r[k] - off[r["round"]][k] for r in mine if k in r and k in off[r["round"]]]
        if d:
            out[key] = [round(v, 1) for v in median_ci(d)]
    return out


#: the corpus' quantiles of each phase's wall time (corpus.QUANTILES)
PHASE_QUANTILES = {"compute_us_q": "backward passes", "step_us_q": "optimizer step"}


def phase_quantiles(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per phase: the median over `runs` of each of its quantiles, in us."""
    out: dict[str, list[float]] = {}
    for key in PHASE_QUANTILES:
        rows = [r[key] for r in runs if r.get(key)]
        if rows:
            out[key] = [round(statistics.median(col), 1) for col in zip(*rows)]
    return out


def self_cost(trace: Path, steps: int) -> dict[str, Any] | None:
    """Rank 0's self_cost from the trace's metadata, per optimizer step."""
    try:
        doc = json.loads(trace.read_text())
    except (OSError, ValueError):
        return None
    meta = doc.get("horovod_profiler") if isinstance(doc, dict) else None
    sc = (meta or {}).get("self_cost") or {}
    ranks = sc.get("ranks") or []
    if not ranks:
        return None
    r = ranks[0]
    per = {k: (r.get(k) or 0) / steps / 1e3 for k in
           ("python_hook_ns", "helper_cpu_ns", "cpu_read_ns", "record_ns", "total_ns")}
    return {"us_per_step": {k.replace("_ns", ""): round(v, 2) for k, v in per.items()},
            "python_hook_calls_per_step": round((r.get("python_hook_calls") or 0) / steps, 2),
            "cpu_share": r.get("cpu_share")}


def busy_equivalent(runs: list[dict[str, Any]], off: dict[int, dict[str, Any]],
                    busy: dict[str, float], profiled: list[str]) -> dict[str, Any]:
    """What a known amount of main-thread work costs this job, and how much of
    it each profiled arm's cost is worth.  Per round, an arm's extra time a
    step is the unprofiled step x (unprofiled rate / the arm's - 1); a busy
    arm of B us a step that adds X us costs the job X / B per us of work.
    A profiled arm's extra time divided by the busy arms' factor (least
    squares through the origin) is the main-thread work it is worth."""
    def extra(arm: str) -> float:
        return statistics.median(
            1e6 / off[r["round"]]["steps_per_s"]
            * (off[r["round"]]["steps_per_s"] / r["steps_per_s"] - 1)
            for r in runs if r["arm"] == arm)

    factors, xs = {}, {}
    for arm, us in busy.items():
        xs[arm] = x = extra(arm)
        factors[arm] = x / us
        print(f"  {arm}: a step {x:+.1f} us for {us:g} us of main-thread work "
              f"(x{x / us:.2f})")
    factor = sum(xs[a] * busy[a] for a in busy) / sum(u * u for u in busy.values())
    worth = {}
    for arm in profiled:
        x = extra(arm)
        worth[arm] = {"extra_us": x, "main_thread_us": x / factor if factor > 0 else None}
        print(f"  {arm}: a step {x:+.1f} us, "
              + (f"as much as {x / factor:.1f} us of main-thread work (the busy arms' "
                 f"x{factor:.2f})" if factor > 0 else "the busy arms resolve no factor"))
    return {"factors": factors, "factor": factor, "profiled": worth}


def median_ci(values: list[float], seed: int = 1, n: int = 4000) -> tuple[float, float, float]:
    """Median with a 95% bootstrap interval of the median."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return statistics.median(values), meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="mlp6")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=0, metavar="N",
                   help="the workload's --batch-size (0: its default): a longer step "
                   "with the same tensors and calls")
    p.add_argument("--workload-args", default="", metavar="ARGS",
                   help="more arguments of the workload (\"--layers 6\": bert's 105 "
                        "gradient tensors)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--arm", type=parse_arm, action="append", default=[],
                   help="NAME=VAR=V,VAR=V: another profiled arm (unprofiled when it "
                   "sets HOROVOD_PROFILE=0)")
    p.add_argument("--env", type=lambda v: parse_arm("all=" + v)[1], default={},
                   metavar="VAR=V,VAR=V", help="variables every arm's run sets, 'off' "
                   "included (a Horovod setting the comparison is made at)")
    p.add_argument("--no-on", action="store_true", help="leave out the default 'on' arm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bind", choices=("none", "core"), default="none",
                   help="none (the corpus' setting, default) or each rank bound to a core")
    p.add_argument("--busy", type=lambda v: [float(x) for x in v.split(",")], default=[],
                   metavar="US,US", help="unprofiled arms with a busy loop of US "
                   "microseconds a step (the workload's --busy-us): what that much "
                   "main-thread work costs this job here")
    p.add_argument("--pair", action="append", default=[], metavar="ARM:BASE",
                   help="also the ratio of ARM's rate to BASE's, round by round (a "
                   "profiled arm against the unprofiled arm of the same --arm settings)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    arms: dict[str, dict[str, str] | None] = {"off": None}
    if not args.no_on:
        arms["on"] = {}
    arms.update(dict(args.arm))
    busy = {f"busy{b:g}": b for b in args.busy}
    arms.update({name: None for name in busy})
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="job_rate-"))
    runs: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    try:
        for rnd in range(args.rounds):
            order = list(arms)
            rng.shuffle(order)
            for arm in order:
                r = run_once(args, arm, arms[arm], work, busy.get(arm, 0.0))
                r["round"] = rnd
                r["load1"] = os.getloadavg()[0]
                runs.append(r)
                sc = r.get("self_cost") or {}
                print(f"round {rnd} {arm:10s} {r.get('steps_per_s')} steps/s, main thread "
                      f"{r.get('main_cpu_us_per_step')} us CPU/step, job {r['job_wall_s']} s"
                      + (f", self_cost/step {sc.get('us_per_step')}" if sc else ""),
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.workload}"
          + (f" at batch size {args.batch_size}" if args.batch_size else "")
          + f", {args.np} ranks (binding: {args.bind}), {args.steps} steps a "
          f"run, {args.rounds} rounds, started {started}; ratio to the same round's "
          f"unprofiled run: median [p25, p75] (95% bootstrap interval of the median)")
    summary: dict[str, Any] = {}
    off = {r["round"]: r for r in runs if r["arm"] == "off"}
    base_rate = [r["steps_per_s"] for r in off.values()]
    print(f"  off: {statistics.median(base_rate):.1f} steps/s (range {min(base_rate):.1f}-"
          f"{max(base_rate):.1f})")
    for arm in arms:
        if arm == "off":
            continue
        mine = [r for r in runs if r["arm"] == arm]
        rate = [r["steps_per_s"] / off[r["round"]]["steps_per_s"] for r in mine]
        cpu = [r["main_cpu_us_per_step"] / off[r["round"]]["main_cpu_us_per_step"]
               for r in mine]
        m, lo, hi = median_ci(rate)
        q1, q3 = quartiles(rate)
        cm, clo, chi = median_ci(cpu)
        hooks = [r["self_cost"]["us_per_step"]["python_hook"] for r in mine if r.get("self_cost")]
        phases = phase_deltas(mine, off)
        summary[arm] = {"rate_ratio": [m, lo, hi], "rate_quartiles": [q1, q3],
                        "rate_ratios": rate, "main_cpu_ratio": [cm, clo, chi],
                        "python_hook_us_per_step_median":
                            statistics.median(hooks) if hooks else None,
                        "phase_us_added": phases}
        print(f"  {arm}: rate {m:.3f} [{q1:.3f}, {q3:.3f}] ({lo:.3f}-{hi:.3f}); main thread "
              f"CPU/step {cm:.3f} ({clo:.3f}-{chi:.3f})"
              + (f"; Python hooks {statistics.median(hooks):.1f} us/step (self_cost)"
                 if hooks else ""))
        quant = phase_quantiles(mine)
        summary[arm]["phase_quantiles_us"] = quant
        slow = [r["slow_share"] for r in mine if r.get("slow_share") is not None]
        base_slow = [r["slow_share"] for r in off.values() if r.get("slow_share") is not None]
        if slow and base_slow:
            summary[arm]["slow_share"] = statistics.median(slow)
            print(f"    steps of 1.5x the fast ones (p10) or more, median of the rounds: "
                  f"unprofiled {statistics.median(base_slow):.1%}, {arm} "
                  f"{statistics.median(slow):.1%}")
        base_q = phase_quantiles(list(off.values()))
        for key, label in PHASE_QUANTILES.items():
            if key in quant and key in base_q:
                print(f"    {label} p10/p50/p90/p99, median of the rounds: unprofiled "
                      + "/".join(f"{v:.0f}" for v in base_q[key]) + f" us, {arm} "
                      + "/".join(f"{v:.0f}" for v in quant[key]) + " us")
        if phases:
            print("    added a step, median (95% interval): " + "; ".join(
                f"{label} {phases[k][0]:+.1f} us ({phases[k][1]:+.1f} to {phases[k][2]:+.1f})"
                for k, label in zip(PHASES, ("compute", "its CPU", "optimizer step",
                                             "its CPU")) if k in phases))
    by = {(r["round"], r["arm"]): r["steps_per_s"] for r in runs}
    for pair in args.pair:
        a, _, b = pair.partition(":")
        rate = [by[(n, a)] / by[(n, b)] for n in range(args.rounds)
                if (n, a) in by and (n, b) in by]
        if not rate:
            print(f"  {a} against {b}: no round ran both")
            continue
        m, lo, hi = median_ci(rate)
        q1, q3 = quartiles(rate)
        summary[f"{a}:{b}"] = {"rate_ratio": [m, lo, hi], "rate_quartiles": [q1, q3],
                               "rate_ratios": rate}
        print(f"  {a} against {b}: rate {m:.3f} [{q1:.3f}, {q3:.3f}] ({lo:.3f}-{hi:.3f})")
    if busy:
        summary["busy"] = busy_equivalent(runs, off, busy, [a for a in arms if a != "off"
                                                          and a not in busy])
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k != "arm"},
             "arms": {k: v for k, v in arms.items()}, "started": started,
             "summary": summary, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
