"""Randomized diagnosis scenarios: each seed draws a real Horovod job, the causes
injected into it and their sizes; `profiler advise` is judged on it against
the truth (benchmarks/scenarios/suite.py: evaluate, judge).  The fixed suite
shows the findings work on the jobs they were built with; this one asks
whether they hold on jobs nobody here wrote.

    python benchmarks/scenarios/randomized.py --set dev --count 12
    python benchmarks/scenarios/randomized.py --set heldout --count 40 --json held.json
    python benchmarks/scenarios/randomized.py --show 1000003     # what a seed draws
    python benchmarks/scenarios/randomized.py --rejudge held.json --work W   # new analysis

Seeds.  DEV (0 to 999,999) is for developing the findings: look at them, tune
on them.  HELDOUT (1,000,000 up) is never looked at while developing: its
figures are the ones reported (docs/validation.md), and a change tuned after
seeing a held-out failure moves that seed to the dev set, with the next
held-out seeds taking its place.

What a seed draws (draw()):

* ranks: 2, 3 or 4 on this host's 2 cores (3 and 4 oversubscribe it);
* the job's model (mlp; heads for a cliff), steps 24-40, batch 32 or 64;
* every rank's jitter a step: none, or uniform(0, J) / exponential with mean
  J/2, J in 10-40 ms (a shape the findings were not built on);
* one cause, or none:
  - none (a null: nothing may be named);
  - jitter alone (symmetric: no rank may be named; rank_waiting is priced
    against max - mean of the ranks' pauses this run drew (pauses.py), over
    the breakdown's steps, whose expectation is E[max] - E[mean]);
  - a late rank (which one, 10-50 ms, asleep or computing), over the jitter;
  - a latency cliff (Open MPI's tuned rules force a 64-byte-segment ring on
    one band of sizes) at the job's smallest, a middle or its largest
    message, fusion off so that each gradient is its own message; or (a
    quarter of cliff seeds, by their own stream) fusion on and the band over
    every fused buffer larger than the largest gradient, judged with a bench
    of the same host (the run alone has no curve beside the buffer);
  - busy processes beside the job: 1 or 2 wherever the kernel puts them,
    or (since 2026-12-06) one on the core of one of 2 ranks bound a core
    each (the step then waits for that rank): noisy_neighbour;
  - HOROVOD_CYCLE_TIME of 10-30 ms;
  - fusion off on a model of many small tensors;
  - (since late 2026-12-06) a slow link: 2 ranks on 2 simulated hosts
    (network namespaces, DESIGN.md), the link limited to 100-500 Mbit/s,
    8 MiB of gradients, the fabric measured by a sweep on the same hosts
    (the bench advise reads): transfer_bound.  Drawn from a stream of its
    own (LINK_SHARE of the seeds), so the other seeds keep their draws.
  - (since 2026-12-07) one slow host among 3 or 4 simulated hosts, one rank
    each, 4 MiB of gradients, that host's link limited to 200-500 Mbit/s,
    no bench (slow_link, priced against twins without the limit); or
    (ALIKE_SHARE of those) every link limited alike, a null where no host
    may be named.  Its own stream (HOST_SHARE of the seeds not drawn as a
    slow link).
  - (since 2026-12-07) one rank of 2 or 3 in a cgroup with a CPU quota of
    0.15-0.5 CPU (cgroups.py; cpu_quota, priced against twins without the
    quota).  Its own stream (QUOTA_SHARE of the seeds drawn as neither).

Truth. A cause whose effect is the step it adds is priced against twins: the
same job (same seed, same jitter) without the cause, unprofiled, alternating
with the cause (suite.TWIN_ROUNDS pairs); its 95% interval says when the
cause made no measurable difference, and such a run leaves recall. A late
rank (since late 2026-12-06) is priced in-run (suite.py, "alternate"): the
cause in even steps only, each against its odd neighbours; jitter on the
pauses the run drew (at 2 ranks and 30 steps, the exponential pauses' sample
mean is off its expectation by a fifth at one sigma).  Busy neighbours are
priced by twins, the loops running throughout against none: a loop stopped
and continued between steps costs its steps more than one that never stops
(toggle_check.py; docs/validation.md), so the in-run twin, which they used
from 09f6b1b to 9545994, overstated them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("scenario_suite", HERE / "suite.py")
assert _spec is not None and _spec.loader is not None
sys.path.insert(0, str(HERE))
from pauses import realized_wait_ms  # noqa: E402  (this folder: the job's own draws)

suite = sys.modules.get("scenario_suite") or importlib.util.module_from_spec(_spec)
if "scenario_suite" not in sys.modules:
    sys.modules["scenario_suite"] = suite
    _spec.loader.exec_module(suite)

DEV = range(0, 1_000_000)
HELDOUT = range(1_000_000, 2_000_000)
SETS = {"dev": DEV, "heldout": HELDOUT}

#: causes and their weights in the draw
CAUSES = {"none": 2, "jitter": 2, "late": 4, "cliff": 3, "busy": 1, "cycle": 1, "fusion": 1}
#: the share of seeds drawn as a slow link instead, by their own stream
LINK_SHARE = 0.1
LINK_RATES = ("100mbit", "200mbit", "500mbit")
#: the share of seeds drawn as one slow host among 3-4 simulated hosts
#: instead (their own stream), and of those, the share whose every link is
#: limited alike (a null: no host may be named)
HOST_SHARE = 0.1
HOST_RATES = ("200mbit", "300mbit", "500mbit")
ALIKE_SHARE = 0.25
#: the share of seeds drawn as one rank under a cgroup CPU quota instead
#: (their own stream), and the quota's range in CPUs
QUOTA_SHARE = 0.1
QUOTA_CPUS = (0.15, 0.5)
#: the heads model's gradients (job.CLIFF_WIDTHS x 128 float32s), smallest first
HEAD_BYTES = [128 * w * 4 for w in (32, 64, 128, 256, 320, 384, 448, 512, 1000, 2048)]
CLIFF_AT = {"smallest": HEAD_BYTES[0], "middle": HEAD_BYTES[4], "largest": HEAD_BYTES[-1]}
#: the share of cliff seeds drawn (by their own stream) with fusion on and the
#: cliff on the fused buffer: every size above the largest gradient, up to
#: all of them fused (FUSED_BAND), judged against a bench of the same host
FUSED_SHARE = 0.25
FUSED_BAND = (HEAD_BYTES[-1] + 1, sum(HEAD_BYTES) + 1)


def rules_text(np_: int, lo: int, hi: int) -> str:
    """Open MPI tuned rules: allreduce (id 2) on np_-rank communicators takes the
    segmented ring with 64-byte segments on [lo, hi), the default elsewhere."""
    return f"1\n2\n1\n{np_}\n3\n0 0 0 0\n{lo} 5 0 64\n{hi} 0 0 0\n"


#: the scenario job's warm-up iterations (job.py --warmup's default)
JOB_WARMUP = 3


def expected_wait_ms(shape: str, jitter_ms: float, n: int) -> float:
    """E[max] - E[mean] of n independent pauses: what the ranks wait for each
    other per step, averaged over them (rank_waiting's cost)."""
    if shape == "uniform":
        return jitter_ms * n / (n + 1) - jitter_ms / 2
    mean = jitter_ms / 2  # exponential: E[max of n] = mean * H_n
    return mean * (sum(1.0 / k for k in range(1, n + 1)) - 1.0)


@dataclasses.dataclass
class Drawn:
    seed: int
    cause: str
    params: dict[str, Any]
    scenario: Any  # suite.Scenario


def draw(seed: int) -> Drawn:
    """The scenario a seed stands for (the same seed, the same scenario)."""
    rng = np.random.default_rng([seed, 45])
    causes = list(CAUSES)
    w = np.array([CAUSES[c] for c in causes], dtype=float)
    cause = str(rng.choice(causes, p=w / w.sum()))
    np_ = int(rng.choice([2, 3, 4], p=[0.5, 0.3, 0.2]))
    steps = int(rng.integers(24, 41))
    batch = int(rng.choice([32, 64]))
    shape = str(rng.choice(["uniform", "exponential"]))
    jitter = 0.0 if cause == "none" else float(rng.choice([0.0, 10.0, 20.0, 40.0]))
    if cause == "jitter":
        jitter = float(rng.choice([10.0, 20.0, 40.0]))
    link = np.random.default_rng([seed, 48])  # its own stream: the others keep their draws
    slowhost = np.random.default_rng([seed, 50])  # likewise
    quota_rng = np.random.default_rng([seed, 51])  # likewise
    if link.random() < LINK_SHARE:
        cause, np_, rate = "link", 2, str(link.choice(LINK_RATES))
        steps = int(link.integers(12, 21))
    elif slowhost.random() < HOST_SHARE:
        np_ = int(slowhost.choice([3, 4]))
        rate = str(slowhost.choice(HOST_RATES))
        alike = bool(slowhost.random() < ALIKE_SHARE)
        slow_at = -1 if alike else int(slowhost.integers(0, np_))
        cause = "alike" if alike else "slowhost"
        steps = int(slowhost.integers(12, 21))
        jitter = 0.0 if alike else jitter
    elif quota_rng.random() < QUOTA_SHARE:
        cause = "quota"
        np_ = int(quota_rng.choice([2, 3], p=[0.7, 0.3]))
        q_rank = int(quota_rng.integers(0, np_))
        q_cpus = float(np.round(quota_rng.uniform(*QUOTA_CPUS), 2))
    base = ["--model", "mlp", "--steps", str(steps), "--batch", str(batch),
            "--seed", str(seed)]
    jit = ["--jitter-ms", f"{jitter:g}", "--jitter-shape", shape] if jitter else []
    params: dict[str, Any] = {"np": np_, "steps": steps, "batch": batch,
                              "jitter_ms": jitter, "jitter_shape": shape if jitter else "-"}
    waiting = {"rank_waiting": suite.WAITING + (" and the injected jitter" if jitter else "")}
    # a second cause: the jitter's waiting may cost more than the first and rank above it
    above = ({"rank_waiting": "the injected jitter, a second cause"}
             if jitter and cause not in ("none", "jitter") else {})
    if cause == "link":
        params["link_rate"] = rate
    if cause in ("slowhost", "alike"):
        params.update(hosts=np_, host_rate=rate, slow_host=slow_at)
    if cause == "quota":
        params.update(quota_rank=q_rank, quota_cpus=q_cpus)
    name = f"r{seed}-{cause}"
    common: dict[str, Any] = {"np": np_, "above": above}
    if cause == "link":
        sc = suite.Scenario(
            name, f"2 simulated hosts, the link limited to {rate}", "transfer_bound", "twin",
            ["--model", "wide", "--steps", str(steps), "--batch", str(batch),
             "--seed", str(seed), *jit],
            hosts=2, host_rates={1: rate}, twin_env={}, bench=True,
            also={**waiting, "compute_bound": suite.COMPUTE_BOUND,
                  "cpu_contention": "the job's threads poll while the link is slow"},
            **common)
    elif cause in ("slowhost", "alike"):
        mid = ["--model", "mid", "--steps", str(steps), "--batch", str(batch),
               "--seed", str(seed), *jit]
        rates = ({i: rate for i in range(np_)} if cause == "alike" else {slow_at: rate})
        link_also = {**waiting, "compute_bound": suite.COMPUTE_BOUND,
                     "transfer_bound": "the slow links' transfers",
                     "cpu_contention": "the job's threads poll while the links are slow"}
        if cause == "alike":
            sc = suite.Scenario(name, f"{np_} simulated hosts, every link limited to {rate}",
                                None, "none", mid, hosts=np_, host_rates=rates,
                                also=link_also, **common)
        else:
            sc = suite.Scenario(name, f"{np_} simulated hosts, h{slow_at}'s link limited to "
                                f"{rate}", "slow_link", "twin", mid, hosts=np_,
                                host_rates=rates, twin_env={}, also=link_also, **common)
    elif cause == "quota":
        sc = suite.Scenario(name, f"rank {q_rank} under a CPU quota of {q_cpus:g} CPU",
                            "cpu_quota", "twin", base + jit, quota=(q_rank, q_cpus),
                            twin_env={},
                            also={**waiting, "compute_bound": suite.COMPUTE_BOUND,
                                  "transfer_bound": "the throttled rank's transfers"},
                            **common)
    elif cause == "none":
        sc = suite.Scenario(name, "nothing injected", None, "none", base + jit,
                            also={**waiting, "compute_bound": suite.COMPUTE_BOUND}, **common)
    elif cause == "jitter":
        sc = suite.Scenario(name, f"every rank pauses {shape}({jitter:g} ms) a step",
                            "rank_waiting", "jitter", base + jit,
                            also={"compute_bound": suite.COMPUTE_BOUND},
                            value=lambda n, s=shape, j=jitter, it=steps + JOB_WARMUP:
                            realized_wait_ms(seed, j, s, n, it),
                            **common)
    elif cause == "late":
        rank = int(rng.integers(0, np_))
        late = float(np.round(rng.uniform(10.0, 50.0), 1))
        kind = str(rng.choice(["sleep", "spin"], p=[0.7, 0.3]))
        params.update(late_rank=rank, late_ms=late, late_kind=kind)
        job = base + jit + ["--late-rank", str(rank), "--late-ms", f"{late:g}",
                            "--late-kind", kind]
        sc = suite.Scenario(name, f"rank {rank} {kind}s {late:g} ms a step", "late_ranks",
                            "alternate", job,
                            also={**waiting, "compute_bound": suite.COMPUTE_BOUND}, **common)
    elif cause == "cliff":
        where = str(rng.choice(list(CLIFF_AT)))
        size = CLIFF_AT[where]
        job = ["--model", "heads", "--steps", str(steps), "--batch", "16",
               "--seed", str(seed), *jit]
        if np.random.default_rng([seed, 49]).random() < FUSED_SHARE:  # its own stream
            params.update(cliff_at="fused", cliff_bytes=FUSED_BAND[1] - 1)
            lo, hi = FUSED_BAND
            sc = suite.Scenario(
                name, f"a slow allreduce algorithm on the fused buffer ({lo}-{hi - 1} B), "
                "fusion on", "latency_cliffs", "twin", job, rules=True,
                rules_text=rules_text(np_, lo, hi), confirm=True, bench=True, twin_env={},
                also={**waiting, "transfer_bound": "the cliff's slow transfers",
                      "compute_bound": suite.COMPUTE_BOUND,
                      "fusion": "a threshold under the band keeps the buffer off it"},
                **common)
            return Drawn(seed, cause, params, sc)
        params.update(cliff_at=where, cliff_bytes=size)
        sc = suite.Scenario(
            name, f"a slow allreduce algorithm at {size} B (the job's {where} message)",
            "latency_cliffs", "twin", job, env={"HOROVOD_FUSION_THRESHOLD": "0"},
            rules=True, rules_text=rules_text(np_, size, size + 1), confirm=True, twin_env={},
            also={**waiting, "transfer_bound": "the cliff's slow transfers",
                  "compute_bound": suite.COMPUTE_BOUND,
                  "fusion": "the job runs unfused on purpose: fusing cuts its calls"},
            **common)
    elif cause == "busy":
        k = int(rng.integers(1, 3))
        # where: wherever the kernel puts the loops, or one loop on the core of
        # one rank of 2 bound a core each (the step waits for that rank)
        where = str(rng.choice(["anywhere", "one core"]))
        busy_also = {**waiting, "transfer_bound": "contention slows transfers",
                     "compute_bound": "compute slowed by the wait for cores",
                     "cpu_contention": "the job's threads wait for the cores the loops hold"}
        if where == "anywhere":
            params.update(busy=k, busy_where=where)
            sc = suite.Scenario(name, f"{k} busy-looping process(es) beside the job",
                                "noisy_neighbour", "twin", base + jit, competitors=k,
                                twin_env={}, also=busy_also, **common)
        else:
            rank = int(rng.integers(0, 2))
            params.update(np=2, busy=1, busy_where=where, busy_rank=rank)
            sc = suite.Scenario(name, f"ranks bound a core each, a busy loop on rank {rank}'s",
                                "noisy_neighbour", "twin", base + jit, competitors=1,
                                competitor_cpu=rank, bind=True, twin_env={},
                                also=busy_also, np=2, above=above)
    elif cause == "cycle":
        cyc = int(rng.integers(10, 31))
        params.update(cycle_ms=cyc)
        sc = suite.Scenario(name, f"HOROVOD_CYCLE_TIME={cyc} ms", "cycle_time", "twin",
                            base + jit, env={"HOROVOD_CYCLE_TIME": str(cyc)},
                            twin_env={"HOROVOD_CYCLE_TIME": ""}, also=waiting, **common)
    else:  # fusion
        sc = suite.Scenario(name, "fusion off, 128 small tensors", "fusion", "twin",
                            ["--model", "small", "--steps", str(steps), "--batch", "16",
                             "--seed", str(seed), *jit],
                            env={"HOROVOD_FUSION_THRESHOLD": "0"},
                            twin_env={"HOROVOD_FUSION_THRESHOLD": ""},
                            also={**waiting, "transfer_bound": "the unfused calls",
                                  "compute_bound": suite.COMPUTE_BOUND}, **common)
    return Drawn(seed, cause, params, sc)


# ---------------------------------------------------------------------------
# at scale: `profiler synth` jobs of 64-1024 ranks, truths by construction
# ---------------------------------------------------------------------------
#: the real profile the synthetic jobs repeat (a fused 2-rank job of the tests)
SCALE_SOURCE = HERE.parents[1] / "tests" / "data" / "analysis" / "fused" / "trace.json"
#: advise's bound on the rows it loads at scale: above it, a window of ranks
SCALE_MAX_ROWS = 200_000


@dataclasses.dataclass
class ScaleDrawn:
    seed: int
    cause: str  # "none", "late" or "two_late"
    params: dict[str, Any]


def draw_scale(seed: int) -> ScaleDrawn:
    """A job at scale a seed stands for (its own stream: draw()'s seeds keep
    their meaning): 64, 256 or 1024 ranks; none, one or two stragglers (two
    causes at once: either may be named, each priced on its own delays),
    late 0.5-5 ms (lognormal) at 20-60% of the collectives; jitter 1-20 us."""
    rng = np.random.default_rng([seed, 46])
    n = int(rng.choice([64, 256, 1024], p=[0.4, 0.35, 0.25]))
    k = int(rng.choice([0, 1, 2], p=[0.25, 0.45, 0.3]))
    params: dict[str, Any] = {
        "np": n, "stragglers": k, "calls_per_rank": int(rng.integers(1200, 3001)),
        "delay_us": float(np.round(rng.uniform(500.0, 5000.0), -1)),
        "share": float(np.round(rng.uniform(0.2, 0.6), 2)),
        "jitter_us": float(np.round(rng.uniform(1.0, 20.0), 1)),
        "synth_seed": int(rng.integers(0, 2**31 - 1)),
    }
    return ScaleDrawn(seed, {0: "none", 1: "late", 2: "two_late"}[k], params)


def evaluate_scale(d: ScaleDrawn, work: Path) -> dict[str, Any]:
    """Generate the job, advise on it as a user would (a bounded window above
    SCALE_MAX_ROWS rows), and judge: the first significant finding names an
    injected straggler, its cost within suite.TOLERANCE of that rank's delays
    per step; a job without stragglers names no rank."""
    from profiler.analysis import load_meta
    from profiler.analysis.findings import advise
    from profiler.analysis.findings.base import SIGNIFICANT_SHARE
    from profiler.synth import SynthConfig, synthesize

    p = d.params
    out = work / f"scale-{d.seed}"
    synthesize(SCALE_SOURCE, out, SynthConfig(
        ranks=p["np"], calls_per_rank=p["calls_per_rank"], stragglers=p["stragglers"],
        seed=p["synth_seed"], straggler_share=p["share"],
        straggler_delay_ns=int(p["delay_us"] * 1e3), jitter_ns=int(p["jitter_us"] * 1e3)),
        force=True)
    syn = load_meta(out)["synthetic"]
    injected = set(syn["stragglers"])
    a = advise(out, max_rows=SCALE_MAX_ROWS)
    sig = a.significant
    late = [f for f in sig if f.key == "late_ranks"]
    # what no straggler job may claim; control traffic and compute are the
    # template's own and may be priced
    false = [f.key for f in late if f.numbers.get("rank") not in injected]
    first = sig[0].key if sig else None
    named = late[0].numbers.get("rank") if late else None
    truth = (syn["data_delay_ns_by_straggler"].get(str(named), 0) / syn["steps"] / 1e6
             if named in injected else None)
    expected = "late_ranks" if injected else None
    cost = late[0].cost_ms if late else None
    # a straggler whose delays are below the noise floor (findings.base: a share of
    # the step) has no measurable effect: it leaves recall, as a twin's does
    floor = SIGNIFICANT_SHARE * float(a.header.get("step_ms") or 0.0)
    worst = max(syn["data_delay_ns_by_straggler"].values(), default=0) / syn["steps"] / 1e6
    no_effect = bool(injected) and worst <= floor
    ok = not false and (first == expected if expected and not no_effect else
                        not late or no_effect)
    if expected and truth is not None and cost is not None:
        ok = ok and abs(cost - truth) <= suite.TOLERANCE * truth
    return {"seed": d.seed, "cause": d.cause, "params": p, "expected": expected,
            "first": first, "cost_ms": cost, "truth_ms": truth, "false": false,
            "matching": len(sig) - len(false), "significant": len(sig), "ok": ok,
            "no_effect": no_effect, "window": a.header.get("ranks_analysed"),
            "named": named, "injected": sorted(injected)}


def run_scale(which: str, count: int, work: Path, start: int | None = None
              ) -> list[dict[str, Any]]:
    rows = []
    t0 = time.monotonic()
    chosen = seeds(which, count, start)
    for i, seed in enumerate(chosen):
        d = draw_scale(seed)
        print(f"[{i + 1}/{len(chosen)}] seed {seed}: {d.cause} on {d.params['np']} ranks "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        row = evaluate_scale(d, work)
        rows.append(row)
        print(f"  first: {row['first']}, named {row['named']} of {row['injected']}, cost "
              f"{suite._fmt(row['cost_ms'])} ms against {suite._fmt(row['truth_ms'])} ms, "
              f"false: {row['false'] or '-'}", file=sys.stderr, flush=True)
    return rows


def seeds(which: str, count: int, start: int | None = None) -> list[int]:
    """The first `count` seeds of a set (from `start` within it)."""
    r = SETS[which]
    first = r.start if start is None else start
    if first not in r:
        raise SystemExit(f"randomized: seed {first} is not in the {which} set "
                         f"({r.start}-{r.stop - 1})")
    return list(range(first, min(first + count, r.stop)))


def proportion(k: int, n: int) -> str:
    """k/n with its 95% Wilson interval."""
    if n == 0:
        return "-"
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(method="wilson")
    return f"{k}/{n} ({k / n:.0%}, 95% CI {ci.low:.0%}-{ci.high:.0%})"


def report(rows: Sequence[dict[str, Any]]) -> str:
    """The held-out (or dev) table: precision, recall and cost accuracy, over
    all runs and by cause and by rank count."""
    lines = []

    def block(title: str, sub: Sequence[dict[str, Any]]) -> None:
        sig = sum(r["significant"] for r in sub)
        match = sum(r["matching"] for r in sub)
        caused = [r for r in sub if r["expected"] and not r["no_effect"]]
        found = [r for r in caused if r["first"] == r["expected"]]
        costed = [r for r in found if r["truth_ms"] is not None and r["cost_ms"] is not None]
        close = [r for r in costed
                 if abs(r["cost_ms"] - r["truth_ms"]) <= suite.TOLERANCE * abs(r["truth_ms"])]
        nulls = [r for r in sub if not r["expected"]]
        clean = [r for r in nulls if r["ok"]]
        lines.append(f"{title}: {len(sub)} runs")
        lines.append(f"  precision: {proportion(match, sig)} significant findings true")
        lines.append(f"  recall:    {proportion(len(found), len(caused))} causes ranked first")
        lines.append(f"  cost:      {proportion(len(close), len(costed))} within "
                     f"{suite.TOLERANCE:.0%} of the truth")
        lines.append(f"  nulls:     {proportion(len(clean), len(nulls))} name nothing false")

    block("all", rows)
    for cause in [*CAUSES, "link", "slowhost", "alike", "quota", "late", "two_late"]:
        sub = [r for r in rows if r["cause"] == cause]
        if sub and f"cause {cause}" not in "\n".join(lines):
            block(f"cause {cause}", sub)
    for n in sorted({int(r["params"]["np"]) for r in rows}):
        sub = [r for r in rows if r["params"]["np"] == n]
        if sub:
            block(f"{n} ranks", sub)
    return "\n".join(lines)


def run(which: str, count: int, work: Path, start: int | None = None,
        twin: bool = True) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    chosen = seeds(which, count, start)
    t0 = time.monotonic()
    for i, seed in enumerate(chosen):
        d = draw(seed)
        print(f"[{i + 1}/{len(chosen)}] seed {seed}: {d.scenario.cause} on {d.params['np']} "
              f"ranks ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        try:
            r = suite.evaluate(d.scenario, 1, work, twin=twin)
            row = {**r.__dict__, "seed": seed, "cause": d.cause, "params": d.params}
        except Exception as exc:  # one broken run does not stop the table
            print(f"  failed: {str(exc)[:300]}", file=sys.stderr)
            row = {"seed": seed, "cause": d.cause, "params": d.params, "expected":
                   d.scenario.expect, "first": None, "cost_ms": None, "truth_ms": None,
                   "false": ["(run failed)"], "matching": 0, "significant": 0, "ok": False,
                   "no_effect": False, "note": str(exc)[:300]}
        rows.append(row)
        print(f"  first: {row['first']}, cost {suite._fmt(row['cost_ms'])} ms against "
              f"{suite._fmt(row['truth_ms'])} ms, false: {row['false'] or '-'}",
              file=sys.stderr, flush=True)
    return rows


def rejudge(rows: Sequence[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """The runs of a --json file judged again with the installed profiler, from
    their traces in `work` (suite.rejudge's rule: truths, twins and the job's
    own measurements from the file, nothing rerun).  A seed the generator now
    draws differently keeps its row, marked in its note."""
    from profiler.analysis.findings import advise

    out = []
    for d in rows:
        drawn = draw(int(d["seed"]))
        folder = work / f"{drawn.scenario.name}-1"
        if json.loads(json.dumps(drawn.params)) != d["params"] or not folder.is_dir():
            out.append({**d, "note": (d.get("note") or "") + " (not rejudged: drawn "
                                      "differently now, or no trace)"})
            continue
        replay = folder / "confirm" / "trace.json"
        bench = folder / "bench" / "trace.json"
        a = advise(folder / "trace.json", replay=replay if replay.is_file() else None,
                   bench=bench if drawn.scenario.bench and bench.is_file() else None)
        iv = d.get("truth_interval")
        r = suite.judge(drawn.scenario, 1, a, truth=d.get("truth_ms"),
                        truth_iv=tuple(iv) if iv else None, step_ms=d.get("step_ms"),
                        truths=d.get("job") or {}, note=d.get("note", ""))
        r.twin_ms = d.get("twin_ms")
        out.append({**r.__dict__, "seed": d["seed"], "cause": d["cause"],
                    "params": d["params"]})
    return out


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The per-seed table of docs/validation.md (Markdown): what each seed
    drew, what was ranked first, its cost against the truth, and the verdict."""
    keys = ("late_rank", "late_ms", "late_kind", "cliff_at", "busy", "busy_where", "busy_rank",
            "cycle_ms", "link_rate", "hosts", "host_rate", "slow_host", "quota_rank",
            "quota_cpus")
    out = ["| seed | cause | ranks | drawn | ranked first | cost ms | twin/truth ms [95%] "
           "| false | ok |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["params"]
        drawn = ([f"jitter {p['jitter_shape']} {p['jitter_ms']:g}"] if p.get("jitter_ms")
                 else []) + [f"{k.replace('_', ' ')} {p[k]}" for k in keys if k in p]
        t, iv = r.get("truth_ms"), r.get("truth_interval")
        truth = ("-" if t is None else f"{t:.1f}" + (f" [{iv[0]:.1f}, {iv[1]:.1f}]" if iv else "")
                 + (" (no effect)" if r.get("no_effect") else ""))
        cost = "-" if r.get("cost_ms") is None else f"{r['cost_ms']:.1f}"
        out.append(f"| {r['seed']} | {r['cause']} | {p['np']} | {', '.join(drawn) or '-'} | "
                   f"{r.get('first') or '-'} | {cost} | {truth} | "
                   f"{', '.join(r.get('false') or []) or '-'} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", choices=sorted(SETS), default="dev")
    p.add_argument("--count", type=int, default=12)
    p.add_argument("--start", type=int, default=None, help="first seed (default: the set's)")
    p.add_argument("--work", default=None, help="folder for the runs (default: a temp dir)")
    p.add_argument("--json", default=None, help="write the runs here")
    p.add_argument("--no-twin", action="store_true",
                   help="skip the twins (causes priced on a twin are not judged)")
    p.add_argument("--show", type=int, nargs="*", metavar="SEED",
                   help="print what these seeds draw, run nothing")
    p.add_argument("--rejudge", nargs="+", metavar="JSON",
                   help="judge the runs of these --json files again with the installed "
                        "profiler (their traces in --work), rerunning nothing; a later "
                        "file's seed replaces an earlier one's")
    p.add_argument("--table", nargs="+", metavar="JSON",
                   help="print the report and the per-seed Markdown table of these --json "
                        "files (docs/validation.md), judging nothing")
    p.add_argument("--scale", action="store_true",
                   help="jobs of 64-1024 ranks from `profiler synth` (draw_scale) instead "
                        "of real 2-4 rank jobs")
    a = p.parse_args(argv)
    if a.show is not None:
        for s in a.show or seeds(a.set, a.count, a.start):
            if a.scale:
                ds = draw_scale(s)
                print(json.dumps({"seed": s, "cause": ds.cause, **ds.params}))
                continue
            d = draw(s)
            print(json.dumps({"seed": s, "cause": d.cause, **d.params,
                              "job": d.scenario.job, "env": d.scenario.env}))
        return 0
    if a.table:
        rows = [d for f in a.table for d in json.loads(Path(f).read_text())]
        print(report(rows) + "\n\n" + table(rows))
        return 0
    if a.rejudge:
        if not a.work:
            raise SystemExit("randomized: --rejudge needs --work, the runs' folder")
        by_seed: dict[int, dict[str, Any]] = {}
        for f in a.rejudge:
            for d in json.loads(Path(f).read_text()):
                by_seed[int(d["seed"])] = d
        rows = rejudge([by_seed[k] for k in sorted(by_seed)], Path(a.work))
        print(report(rows))
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
        return 0 if all(r["ok"] for r in rows) else 1
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="hvprof-random-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = (run_scale(a.set, a.count, work, a.start) if a.scale else
            run(a.set, a.count, work, a.start, twin=not a.no_twin))
    print(report(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    print(f"\nwork folder: {work}", file=sys.stderr)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

