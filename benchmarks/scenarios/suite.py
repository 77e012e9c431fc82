"""Ground-truth scenarios for `profiler advise`: real Horovod jobs on this machine,
each with one known cause of known size injected, or none, and the diagnosis
each must give.

    python benchmarks/scenarios/suite.py                 # every scenario, once
    python benchmarks/scenarios/suite.py --runs 3        # three runs each
    python benchmarks/scenarios/suite.py clean cliff     # some scenarios
    python benchmarks/scenarios/suite.py --list

Per run it prints the expected cause, what advise ranked first among its
significant findings (past those a scenario names in Scenario.above: true of
its job by construction and larger, such as the contention a fusion-off job's
polling is part of), that finding's cost against the truth, every other
significant finding that the scenario does not account for (a false claim),
and how far the step breakdown's total is from the step time the job measured
itself; then precision (significant findings that match the scenario, over all
significant findings) and recall (runs whose expected cause is ranked first
with its cost within TOLERANCE of the truth) over all runs.

How the truth is known, per scenario (Scenario.truth):

* "late": rank 1 sleeps D ms before each step (and every rank uniform(0, J)
  ms); without its D the step would end, on average, D + J/2 - J n/(n+1) ms
  sooner (its excess, less the jitter it no longer leads by: E[max] of n
  uniforms is J n/(n+1)): late_ranks' counterfactual cost;
* "jitter": every rank sleeps uniform(0, J) ms before each step, independently;
  at 2 ranks the mean wait averaged over the ranks is E|X - Y| / 2 = J / 6;
* "outside": the job's own clock: its mean time outside optimizer.step;
* "runqueue": the job's own schedstat read: its main thread's run-queue wait
  per step;
* "runqueue_twin": that read in the profiled run, less the same read in
  twins without the busy processes beside the job (TWIN_ROUNDS of them):
  the wait the neighbours cause (noisy_neighbour's figure), not the job's
  own contention;
* "twin": the job-measured step time minus that of the same job without the
  cause (the what-if's threshold, the default cycle, no rules file, no rate
  limit, no busy processes beside it), both unprofiled, alternating (cause,
  twin) TWIN_ROUNDS times right after the profiled run: the profiler's own
  cost is in neither.
* "alternate": the in-run twin, for a cause the job can switch between steps
  (a late rank's delay, busy processes it stops and continues): ALT_ROUNDS
  unprofiled runs with the cause in every other step (even steps, then odd
  ones), each such step against the mean of its neighbours, pooled.  Twin runs on this
  machine drift apart by more than the effect (a 2-rank job's steps run in
  blocks at one or two times their length): the two halves of one run see
  the same drift.

Four findings can be true of any job on a small shared machine, injected or
not, so each run also asks the job's own measurements (job_truths):

* noisy_neighbour is true when the runner's own reading (psutil, every
  process alive before and after the job, less the runner and its parents)
  finds processes outside the job using at least half the finding's share
  of the machine's CPUs while it ran (the scenario's competitors included);

* cpu_contention is true when the job's own schedstat reads show its main
  thread (outside optimizer.step) or another busy thread waiting for a core at
  least half the finding's threshold (UNCONTENDED_SHARE / 2); claimed below
  that, it is false;
* second_cycles is true when the job's own step clock (each iteration's
  time, the mean over its ranks, from the third on) passes the same test
  (analysis.cycles.cycle_edge, at the job's HOROVOD_CYCLE_TIME) at
  p < CORROBORATE: Horovod's cycle splits any job's steps whose compute sits
  near its edge, injected or not;
* late_ranks is true of rank R when the job's own arrival times at
  optimizer.step (CLOCK_MONOTONIC, one clock on one kernel) make R last more
  often than chance by the finding's own test (analysis.stats.most_often),
  or make the same rank last at p < CORROBORATE when they single none out
  at the finding's bar; naming another rank, or any rank the job's clocks
  do not make last more often than that, is false.

A scenario with `bench` also measures its fabric: the allreduce sweep
(profiler.bench.sweep) at the job's data sizes and the powers of two up to
them, on simulated hosts with the same link rates, right after the job; its
trace is the `--bench` of the job's advise, as a user would run `profiler
bench` on the job's hosts.

The job (benchmarks/scenarios/job.py) measures its own step times; the runner
starts it under mpirun with HOROVOD_PROFILE=1 and reads its trace with the
profiler's public API.  Several hosts are simulated with network namespaces
(profiler.bench.simcluster; needs root).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder's modules
# the definitions (fixed.py), named suite.X by the generator and the tests too
from fixed import (  # noqa: E402, F401
    ALT_ROUNDS,
    BASE,
    BY_NAME,
    COMPUTE_BOUND,
    CORROBORATE,
    HERE,
    JOB,
    JOB_TIMEOUT_S,
    MPI_ENV,
    NAMING,
    RULES,
    SCENARIOS,
    TOLERANCE,
    TWIN_ROUNDS,
    WAITING,
    Scenario,
)


def _python() -> str:
    return sys.executable


def _text(b: str | bytes | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


class JobHung(RuntimeError):
    """A scenario's job ran past its time limit; the message holds its output
    and, for a profiled job, `profiler hang` on its profile directory."""


def _hung(cmd: list[str], timeout: float, stdout: str | None, stderr: str | None,
          profile_dir: Path | None) -> JobHung:
    """The JobHung of a job stopped after `timeout` s: the end of its output
    and, where the watchdog left a snapshot, `profiler hang` on it."""
    diagnosis = ""
    if profile_dir is not None and (profile_dir / "hang").is_dir():
        from profiler.analysis.facade import TraceAnalysis

        try:
            lines = TraceAnalysis.open_raw(profile_dir).hang().lines()
        except Exception as exc:  # noqa: BLE001 - the hang is reported either way
            lines = [f"(no diagnosis: {exc})"]
        diagnosis = f"\nprofiler hang {profile_dir}:\n" + "\n".join(lines)[-3000:]
    return JobHung(f"the job ran past {timeout:g} s: {' '.join(cmd[:4])} ...\n"
                   f"{(stdout or '')[-1500:]}\n{(stderr or '')[-1500:]}{diagnosis}")


def _mpirun_bounded(cmd: list[str], env: dict[str, str], timeout: float,
                    profile_dir: Path | None, grace: float = 10.0
                    ) -> subprocess.CompletedProcess[str]:
    """`cmd` to completion, or JobHung after `timeout` s: mpirun is asked to
    stop (SIGTERM, which it passes to its ranks), `grace` s later whatever is left of it
    and of every process it started is killed (Open MPI puts each rank in a
    process group of its own), so that no rank is left spinning on a core."""
    import psutil

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            family = []
        stdout = stderr = ""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            stdout, stderr = proc.communicate(timeout=grace)
        raise _hung(cmd, timeout, stdout, stderr, profile_dir) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


class ForeignMeter:
    """The share of the machine's CPUs that processes outside the job used
    while it ran (the truth of a noisy neighbour, read by the runner, not the
    profiler): every process is read every PERIOD_S by a thread of the
    runner (psutil), and the CPU time each used between its first and last
    reading (from 0 when it started after the meter) counts, except this
    runner, its ancestors (pytest, the shell: they wait on the job) and its
    descendants (the job: mpirun, the ranks, their children, however
    reparented later), the competitors it started excepted (they are the
    neighbour a scenario injects).  Read throughout, so that other sessions'
    short jobs on a shared machine count too, not only the processes alive
    at both ends."""

    PERIOD_S = 0.25

    def __init__(self, foreign_pids: Sequence[int] = ()) -> None:
        import threading

        import psutil

        self.t0 = time.monotonic()
        self.first: dict[tuple[int, float], float] = {}
        self.last: dict[tuple[int, float], float] = {}
        self.job: set[tuple[int, float]] = set()
        self.foreign_pids = set(foreign_pids)  # the competitors
        self.mine = {os.getpid()}
        with contextlib.suppress(psutil.Error):
            self.mine |= {p.pid for p in psutil.Process().parents()}
        self.stop = threading.Event()
        self.wall = 0.0
        self.read(start=True)
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def read(self, start: bool = False) -> None:
        import psutil

        procs = {}
        for p in psutil.process_iter(["pid", "ppid", "create_time", "cpu_times"]):
            t = p.info.get("cpu_times")
            if t is not None:
                procs[p.info["pid"]] = (p.info["ppid"], p.info["create_time"] or 0.0,
                                        t.user + t.system)
        me = os.getpid()
        for pid, (ppid, created, cpu) in procs.items():
            key = (pid, created)
            if key not in self.first:
                self.first[key] = cpu if start else 0.0
            self.last[key] = cpu
            if key in self.job or pid in self.mine or pid in self.foreign_pids:
                continue
            q, seen = ppid, 0
            while q and seen < 64:  # a descendant of this runner: the job
                if q == me:
                    self.job.add(key)
                    break
                if q in self.foreign_pids:
                    break
                q = procs[q][0] if q in procs else 0
                seen += 1

    def loop(self) -> None:
        while not self.stop.wait(self.PERIOD_S):
            with contextlib.suppress(Exception):
                self.read()

    def share(self) -> float:
        """Stop, read a last time, and the foreign share of the CPUs."""
        self.stop.set()
        self.thread.join()
        self.read()
        wall = time.monotonic() - self.t0
        used = sum(max(self.last[k] - self.first[k], 0.0) for k in self.last
                   if k not in self.job and k[0] not in self.mine)
        return used / (wall * (os.cpu_count() or 1)) if wall > 0 else 0.0


#: how an in-run twin keeps busy processes from the job in the steps without
#: the cause (job.py --toggle-how)
TOGGLE_HOW = "stop"


def run_job(sc: Scenario, out: Path, *, env: dict[str, str] | None = None,
            job: list[str] | None = None, profile: bool = True,
            rules_file: Path | None = None, timeout: float | None = None,
            twin: bool = False, alternate: int | None = None) -> dict[str, Any]:
    """One run of the scenario's job (profiled into `out` when `profile`; its
    twin, without the link's rate limit, the busy competitors and the CPU
    quota, when `twin`; the cause, competitors included, only in the steps of parity
    `alternate` when given); returns the job's own measurements (rank 0's
    JSON line)."""
    timeout = JOB_TIMEOUT_S if timeout is None else timeout
    e = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    e.update(MPI_ENV)
    for k, v in {**sc.env, **(env or {})}.items():
        if v == "":
            e.pop(k, None)
        else:
            e[k] = v
    if rules_file is not None:
        e["OMPI_MCA_coll_tuned_use_dynamic_rules"] = "1"
        e["OMPI_MCA_coll_tuned_dynamic_rules_filename"] = str(rules_file)
    batch = (job or sc.job)[(job or sc.job).index("--batch") + 1] if "--batch" in (
        job or sc.job) else "64"
    if profile:
        # the watchdog leaves its snapshot well before the runner gives up
        e.update({"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(out),
                  "HOROVOD_PROFILE_BATCH_SIZE": batch,
                  "HOROVOD_PROFILE_HANG_S": f"{max(10.0, timeout / 4):g}"})
    loop = [_python(), "-c", "while True: pass"]
    if sc.competitor_cpu is not None:
        loop = ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[sc.competitor_cpu]), *loop]
    competitors: list[subprocess.Popen[bytes]] = []
    limits = contextlib.ExitStack()
    meter: ForeignMeter | None = None
    try:
        for _ in range(0 if twin else sc.competitors):  # a twin runs without them
            competitors.append(subprocess.Popen(loop, stdout=subprocess.DEVNULL))
        argv = [_python(), str(JOB), *(job or sc.job)]
        if alternate is not None:
            argv += ["--alternate", str(alternate)]
            if competitors:
                argv += ["--toggle-pids", ",".join(str(c.pid) for c in competitors),
                         "--toggle-how", TOGGLE_HOW]
        if sc.quota is not None and not twin:  # one rank under a CPU quota; the twin without
            from cgroups import quota_cgroup

            cg = limits.enter_context(quota_cgroup(sc.quota[1]))
            argv = cg.wrap(argv, rank=sc.quota[0])
        if sc.pin is not None:
            argv = ["taskset", "-c", sc.pin, *argv]
        if sc.bind:  # rank r on the r-th CPU this runner may use
            cpus = " ".join(map(str, sorted(os.sched_getaffinity(0))))
            argv = ["sh", "-c", f'set -- {cpus}; shift $(( OMPI_COMM_WORLD_RANK % $# )); '
                    f'exec taskset -c "$1" {shlex.join(argv)}']
        # what else used the CPUs while the job ran (the competitors included):
        # the truth of a noisy neighbour, measured by the runner, not the profiler
        meter = ForeignMeter([c_.pid for c_ in competitors])
        if sc.hosts > 1:
            from profiler.bench import simcluster

            with simcluster.SimCluster(hosts=sc.hosts, slots=1,
                                       host_rates=None if twin else sc.host_rates) as c:
                try:
                    proc = c.mpirun(sc.np, argv, env=simcluster.run_env(e), timeout=timeout,
                                    per_host=-(-sc.np // sc.hosts))
                except subprocess.TimeoutExpired as exc:
                    # simcluster.run has killed every process in the hosts
                    raise _hung(list(map(str, exc.cmd)), timeout, _text(exc.stdout),
                                _text(exc.stderr), out if profile else None) from None
        else:
            proc = _mpirun_bounded(["mpirun", "-n", str(sc.np), *argv], e, timeout,
                                   out if profile else None)
        foreign = meter.share()
    finally:
        if meter is not None:
            meter.stop.set()
        for c_ in competitors:
            c_.kill()
            c_.wait()
        limits.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{sc.name}: the job failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith('{"scenario"'):
            return {**json.loads(line)["scenario"], "foreign_share": foreign}
    raise RuntimeError(f"{sc.name}: the job printed no measurements:\n{proc.stdout[-2000:]}")


def run_bench(sc: Scenario, trace: Path, out: Path, timeout: float = 300) -> Path:
    """The allreduce sweep over the job's data sizes (and every power of two
    from 1 KiB up to the largest) on sc.hosts simulated hosts with the job's
    link rates and MPI settings, profiled into `out`; returns its trace."""
    from profiler.analysis import load
    from profiler.bench import simcluster

    df = load(trace, columns=["rank", "op", "bytes", "kind"])
    data = df.loc[(df["kind"].astype(str) == "data") & (df["op"].astype(str) == "allreduce")]
    sizes = {int(b) for b in data["bytes"].unique() if int(b) > 0 and int(b) % 4 == 0}
    if not sizes:
        raise RuntimeError(f"{sc.name}: no data allreduce to measure the fabric at")
    p2, top = 1024, max(sizes)
    while p2 < 2 * top:
        sizes.add(p2)
        p2 *= 2
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    e.update(MPI_ENV)
    e.update({"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(out)})
    args = ["--iters", "6", "--warmup", "2", "--dtype", "float32", "--backend", "mpi",
            "--out", str(out), "--transport", "", "--collectives", "allreduce",
            "--sizes", ",".join(str(b) for b in sorted(sizes))]
    with simcluster.SimCluster(hosts=sc.hosts, slots=1, host_rates=sc.host_rates) as c:
        proc = c.mpirun(sc.np, [_python(), "-P", "-m", "profiler.bench.sweep", *args],
                        env=simcluster.run_env(e), timeout=timeout,
                        per_host=-(-sc.np // sc.hosts), cwd=out)
    if proc.returncode != 0 or not (out / "trace.json").is_file():
        raise RuntimeError(f"{sc.name}: the bench failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return out / "trace.json"


def job_truths(measured: dict[str, Any], cycle_ms: float | None = None) -> dict[str, Any]:
    """What the job's own measurements say about the findings any run can
    make true (module docstring): the largest run-queue share of a thread
    ("contended_share"), whether that counts as contention ("contended"), the
    rank its arrivals make last more often than chance ("late_rank", None
    when none; "late_share", "late_p"), and whether its step times wait whole
    cycles of `cycle_ms` (Horovod's default when None; "cycles", "cycles_p")."""
    import numpy as np

    from profiler.analysis.cycles import cycle_edge
    from profiler.analysis.findings.contention import NEIGHBOUR_SHARE, UNCONTENDED_SHARE
    from profiler.analysis.stats import most_often
    from profiler.formats.horovod_env import DEFAULT_CYCLE_MS

    ranks = sorted(measured["ranks"], key=lambda r: int(r["rank"]))
    shares = []
    for r in ranks:
        outside = float(r.get("outside_ms") or 0.0)
        if outside > 0 and float(r.get("run_queue_ms", -1)) >= 0:
            shares.append(float(r["run_queue_ms"]) / outside)
        shares.extend(float(t["wait_share"]) for t in r.get("other_threads") or [])
    share = max(shares, default=0.0)
    foreign = float(measured.get("foreign_share") or 0.0)
    out: dict[str, Any] = {"contended_share": share,
                           "contended": share >= UNCONTENDED_SHARE / 2,
                           # busy processes beside the job, by the runner's own
                           # reading, at half the finding's bar (as contention)
                           "foreign_share": foreign,
                           "neighbour": foreign >= NEIGHBOUR_SHARE / 2,
                           "late_rank": None, "late_share": None, "late_p": None,
                           "cycles": False, "cycles_p": None}
    iters = [r.get("iter_ms") or [] for r in ranks]
    n_iter = min((len(i) for i in iters), default=0)
    if n_iter > 2:
        per_iter = [sum(i[k] for i in iters) / len(iters) for k in range(2, n_iter)]
        edge = cycle_edge(np.asarray(per_iter), cycle_ms or DEFAULT_CYCLE_MS)
        if edge is not None:
            out.update(cycles=bool(edge.peak > 0 and edge.p_value < CORROBORATE),
                       cycles_p=edge.p_value)
    arrivals = [r.get("arrivals_ns") or [] for r in ranks]
    n_steps = min((len(a) for a in arrivals), default=0)
    if len(ranks) >= 2 and n_steps >= 3:
        last = [max(range(len(ranks)), key=lambda i, s=s: arrivals[i][s])
                for s in range(n_steps)]
        test = most_often([int(ranks[i]["rank"]) for i in last], len(ranks))
        if test is not None:
            out.update(late_share=test.share, late_p=test.p_value,
                       late_candidate=test.candidate,
                       late_rank=test.candidate if test.significant else None)
    return out


def _cycle_ms(env: dict[str, str]) -> float | None:
    v = env.get("HOROVOD_CYCLE_TIME")
    return float(v) if v else None


def alternate_pairs(measured: dict[str, Any], phase: int) -> list[tuple[float, float]]:
    """A run with --alternate `phase`: each timed step with the cause (its
    number `phase` modulo 2) and the mean of its two neighbours without, both
    the mean over the ranks' iterations.  Either neighbour alone would carry
    an order effect of the cause on the step after it."""
    ranks = [r["iter_ms"] for r in measured["ranks"]]
    n, first = min(map(len, ranks)), int(measured["warmup"]) + 1
    out = []
    for s in range(first + (first + phase) % 2, n - 1, 2):
        out.append((sum(it[s] for it in ranks) / len(ranks),
                    sum((it[s - 1] + it[s + 1]) / 2 for it in ranks) / len(ranks)))
    return out


def _paired(with_cause: Sequence[float], without: Sequence[float]
            ) -> tuple[float, tuple[float, float]]:
    """The mean of the paired differences (cause - twin, round by round) and
    its 95% t interval."""
    return _t_interval([a - b for a, b in zip(with_cause, without, strict=True)])


def _t_interval(d: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """The mean of `d` and its 95% t interval."""
    m = sum(d) / len(d)
    if len(d) < 2:
        return m, (float("-inf"), float("inf"))
    sd = (sum((x - m) ** 2 for x in d) / (len(d) - 1)) ** 0.5
    from scipy.stats import t

    h = float(t.ppf(0.975, len(d) - 1)) * sd / len(d) ** 0.5
    return m, (m - h, m + h)


def _mean(ranks: Sequence[dict[str, Any]], key: str) -> float:
    return sum(float(r[key]) for r in ranks) / len(ranks)


@dataclass
class Result:
    scenario: str
    run: int
    expected: str | None
    first: str | None
    cost_ms: float | None
    truth_ms: float | None
    false: list[str]
    matching: int
    significant: int
    sum_error: float
    ok: bool
    note: str = ""
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: what the job's own measurements say (job_truths)
    job: dict[str, Any] = field(default_factory=dict)
    #: the twin truth's 95% interval (None: not a twin truth)
    truth_interval: tuple[float, float] | None = None
    #: the injected cause made no measurable difference (its interval holds 0)
    no_effect: bool = False
    #: the job's own mean step time (what the breakdown's total is judged on)
    step_ms: float | None = None
    #: a twin truth's unprofiled runs, ms per step: [with the cause, without], in order
    twin_ms: list[list[float]] | None = None

    def cost_ok(self) -> bool:
        if self.truth_ms is None or self.cost_ms is None:
            return self.truth_ms is None
        return abs(self.cost_ms - self.truth_ms) <= TOLERANCE * abs(self.truth_ms)


def evaluate(sc: Scenario, run: int, work: Path, *, twin: bool = True) -> Result:
    """Run the scenario once (and its twin when its truth needs one and `twin`);
    judge the diagnosis (without the twin, a "twin" truth is unknown and the
    cost is not judged)."""
    from profiler.analysis.findings import advise

    out = work / f"{sc.name}-{run}"
    shutil.rmtree(out, ignore_errors=True)
    rules = None
    if sc.rules:
        rules = work / f"rules-{sc.name}.txt"
        rules.write_text(sc.rules_text or RULES)
    measured = run_job(sc, out, rules_file=rules)
    trace = out / "trace.json"
    replay = None
    # the bench first: a size the run alone cannot judge (a fused buffer) is
    # flagged against it, and then replayed
    bench = run_bench(sc, trace, out / "bench") if sc.bench else None
    if sc.confirm:
        from profiler.analysis.facade import trace_meta
        from profiler.bench.confirm import job_mpi_env
        from profiler.bench.confirm import replay as do_replay

        first = advise(trace, only=["latency_cliffs"], bench=bench)
        sizes = next((f.numbers.get("replay_sizes") for f in first.findings
                      if f.key == "latency_cliffs"), None)
        if sizes:
            replay = do_replay(sizes, np=sc.np, out_dir=out / "confirm",
                               job_env=job_mpi_env(trace_meta(trace) or {}))
    a = advise(trace, replay=replay, bench=bench)
    first = next((f for f in a.significant if f.key not in sc.above), None)
    truth: float | None = None
    truth_iv: tuple[float, float] | None = None
    twin_ms: list[list[float]] | None = None
    note = ""
    if sc.truth == "late" or sc.truth == "jitter":
        truth = sc.value(sc.np) if sc.value else None
    elif sc.truth == "outside":
        truth = _mean(measured["ranks"], "outside_ms")
    elif sc.truth == "runqueue":
        truth = _mean(measured["ranks"], "run_queue_ms")
    elif sc.truth == "runqueue_twin" and twin:
        # the run-queue wait this run's compute threads had, less what the job
        # has without the busy processes (twins): the wait they cause
        without = [_mean(run_job(sc, work / f"{sc.name}-{run}-twin{i}", profile=False,
                                 twin=True)["ranks"], "run_queue_ms")
                   for i in range(TWIN_ROUNDS)]
        own = _mean(measured["ranks"], "run_queue_ms")
        truth, truth_iv = _paired([own] * len(without), without)
        twin_ms = [[own], without]
    elif sc.truth == "alternate" and twin:
        # one unprofiled run holds both twins: each step with the cause against
        # its neighbours without, pooled over ALT_ROUNDS runs, the cause in the
        # even steps, then the odd ones (the same seeded pauses on both sides)
        on, off, d = [], [], []
        for i in range(ALT_ROUNDS):
            m = run_job(sc, work / f"{sc.name}-{run}-alt{i}", profile=False, rules_file=rules,
                        alternate=i % 2)
            pairs = alternate_pairs(m, i % 2)
            on.append(sum(p[0] for p in pairs) / len(pairs))
            off.append(sum(p[1] for p in pairs) / len(pairs))
            d += [a - b for a, b in pairs]
        truth, truth_iv = _t_interval(d)
        twin_ms = [on, off]
    elif sc.truth == "twin" and twin:
        twin_env = dict(sc.twin_env or {})
        if sc.expect == "fusion" and first is not None and first.key == "fusion":
            twin_env["HOROVOD_FUSION_THRESHOLD"] = str(first.numbers.get("best_threshold"))
            note = f"twin at HOROVOD_FUSION_THRESHOLD={twin_env['HOROVOD_FUSION_THRESHOLD']}"
        with_cause, without = [], []
        for i in range(TWIN_ROUNDS):
            with_cause.append(_mean(run_job(sc, work / f"{sc.name}-{run}-cause{i}",
                                            profile=False, rules_file=rules)["ranks"],
                                    "step_ms"))
            without.append(_mean(run_job(sc, work / f"{sc.name}-{run}-twin{i}", env=twin_env,
                                         job=sc.twin_job, profile=False, rules_file=None,
                                         twin=True)["ranks"], "step_ms"))
        truth, truth_iv = _paired(with_cause, without)
        twin_ms = [with_cause, without]
    # the breakdown's steady steps are the profiler's steps from 1 on
    # (throughput.steady_steps), the job's iterations from 2 on
    step_ms = sum(sum(r["iter_ms"][2:]) / len(r["iter_ms"][2:])
                  for r in measured["ranks"]) / len(measured["ranks"])
    res = judge(sc, run, a, truth=truth, truth_iv=truth_iv, step_ms=step_ms,
                truths=job_truths(measured, _cycle_ms(sc.env)), note=note)
    res.twin_ms = twin_ms
    return res


def judge(sc: Scenario, run: int, a: Any, *, truth: float | None,
          truth_iv: tuple[float, float] | None, step_ms: float | None,
          truths: dict[str, Any], note: str = "") -> Result:
    """Judge one advise result (`a`) against the scenario, its truth and the
    job's own measurements (job_truths); `step_ms`: the job's own step time
    (None: the breakdown's total is not judged)."""
    sig = a.significant
    first = next((f for f in sig if f.key not in sc.above), None)
    bd = a.breakdown
    total = float(bd["ms"].sum()) if bd is not None and len(bd) else float("nan")
    sum_error = (abs(total - step_ms) / step_ms if step_ms is not None and step_ms > 0
                 else float("nan"))
    no_effect = truth_iv is not None and truth_iv[0] <= 0.0 <= truth_iv[1]
    expect = None if no_effect else sc.expect
    allowed = {expect} | set(sc.also) if expect else set(sc.also)
    if no_effect and truth_iv is not None:
        # a claim the twins can neither bear out nor refute is not false: only
        # one whose whole interval lies above the truth's
        claim = next((f for f in sig if f.key == sc.expect), None)
        if claim is not None:
            lo = (claim.cost_interval_ms or (claim.cost_ms, claim.cost_ms))[0]
            if lo is not None and lo <= truth_iv[1]:
                allowed.add(claim.key)
    if truths["contended"]:
        allowed.add("cpu_contention")
    if truths.get("neighbour"):
        allowed.add("noisy_neighbour")
    if truths.get("cycles"):
        allowed.add("second_cycles")

    def true_claim(f: Any) -> bool:
        if f.key == "late_ranks":  # true only of the rank the job's clocks single out
            rank = f.numbers.get("rank")
            if truths["late_rank"] is not None:
                return bool(rank == truths["late_rank"])
            # the job's clocks, on their own steps, make the same rank last at
            # p < CORROBORATE (not at the finding's bar): not contradicted
            p = truths.get("late_p")
            return (truths.get("late_candidate") == rank and p is not None
                    and p < CORROBORATE)
        return f.key in allowed

    false = [f.key for f in sig if not true_claim(f)]
    matching = sum(1 for f in sig if true_claim(f))
    res = Result(scenario=sc.name, run=run, expected=sc.expect,
                 first=first.key if first else None,
                 cost_ms=first.cost_ms if first is not None else None,
                 truth_ms=truth, false=false, matching=matching, significant=len(sig),
                 sum_error=sum_error, ok=False, note=note,
                 findings=[{"key": f.key, "headline": f.headline, "cost_ms": f.cost_ms,
                            "interval_ms": f.cost_interval_ms,
                            "significant": f.significant,
                            "late_by": f.numbers.get("late_by")} for f in a.findings],
                 job=truths, truth_interval=truth_iv, no_effect=no_effect, step_ms=step_ms)
    if expect is None:
        res.ok = not false and not any(f.key in NAMING and not true_claim(f) for f in sig)
    else:
        res.ok = res.first == sc.expect and res.cost_ok() and not false
    return res


def rejudge(path: Path, work: Path) -> list[Result]:
    """The runs of a --json file judged again with the installed profiler: each
    run's trace (and replay) from `work`, its truth and the job's measurements
    from the file; nothing is rerun.  For analysis changes between sittings."""
    from profiler.analysis.findings import advise

    out = []
    for d in json.loads(path.read_text()):
        sc = BY_NAME[d["scenario"]]
        folder = work / f"{sc.name}-{d['run']}"
        replay = folder / "confirm" / "trace.json"
        bench = folder / "bench" / "trace.json"
        a = advise(folder / "trace.json", replay=replay if replay.is_file() else None,
                   bench=bench if sc.bench and bench.is_file() else None)
        iv = d.get("truth_interval")
        r = judge(sc, int(d["run"]), a, truth=d.get("truth_ms"),
                  truth_iv=tuple(iv) if iv else None, step_ms=d.get("step_ms"),
                  truths=d.get("job") or {}, note=d.get("note", ""))
        if d.get("step_ms") is None:  # a file from before step_ms: its own figure
            r.sum_error = float(d.get("sum_error", float("nan")))
        r.twin_ms = d.get("twin_ms")
        out.append(r)
    return out


def _fmt(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.2f}"


def table(results: Sequence[Result]) -> str:
    rows = [("scenario", "run", "expected", "ranked first", "cost ms", "truth ms", "false",
             "sum err", "job: cpu wait", "job: late", "ok")]
    for r in results:
        cw = r.job.get("contended_share")
        truth = _fmt(r.truth_ms) + (f" [{r.truth_interval[0]:.1f}, {r.truth_interval[1]:.1f}]"
                                    if r.truth_interval else "")
        rows.append((r.scenario, str(r.run),
                     (r.expected or "(none)") + (" (no effect)" if r.no_effect else ""),
                     r.first or "(none)", _fmt(r.cost_ms), truth, ",".join(r.false) or "-",
                     f"{100 * r.sum_error:.1f}%", "-" if cw is None else f"{100 * cw:.0f}%",
                     "-" if r.job.get("late_rank") is None else f"rank {r.job['late_rank']}",
                     "yes" if r.ok else "NO"))
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    sig = sum(r.significant for r in results)
    match = sum(r.matching for r in results)
    caused = [r for r in results if r.expected and not r.no_effect]
    absent = [r for r in results if r.no_effect]
    recall = sum(1 for r in caused if r.first == r.expected and r.cost_ok())
    lines.append("")
    lines.append(f"precision: {match}/{sig} significant findings match their scenario"
                 + (f" ({match / sig:.0%})" if sig else ""))
    lines.append(f"recall: {recall}/{len(caused)} injected causes ranked first with their "
                 f"cost within {TOLERANCE:.0%}" + (f" ({recall / len(caused):.0%})"
                                                   if caused else ""))
    if absent:
        lines.append(f"left out of recall: {len(absent)} runs whose injected cause made no "
                     "measurable difference (twin interval holds 0): "
                     + ", ".join(f"{r.scenario} {r.run}" for r in absent))
    worst = max((r.sum_error for r in results if r.sum_error == r.sum_error), default=0.0)
    lines.append(f"breakdown total against the job's own step time: worst {worst:.1%}")
    return "\n".join(lines)


def _report(results: Sequence[Result], json_path: str | None) -> int:
    """Print the table, write the results as JSON when asked; the exit status."""
    print(table(results))
    if json_path:
        Path(json_path).write_text(json.dumps([r.__dict__ for r in results], indent=1,
                                              default=str))
    return 0 if all(r.ok for r in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="scenarios to run (default: all)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--fast", action="store_true", help="the test suite's subset")
    p.add_argument("--list", action="store_true")
    p.add_argument("--work", default=None, help="folder for the runs (default: a temp dir)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--rejudge", default=None, metavar="JSON",
                   help="judge the runs of an earlier --json again (with its --work folder) "
                        "with the installed profiler; nothing is rerun")
    a = p.parse_args(argv)
    if a.rejudge:
        if not a.work:
            p.error("--rejudge needs the --work folder of those runs")
        return _report(rejudge(Path(a.rejudge), Path(a.work)), a.json)
    if a.list:
        for s in SCENARIOS:
            print(f"{s.name:15} expects {s.expect or '(nothing)':15} {s.cause}")
        return 0
    chosen = [BY_NAME[n] for n in a.names] if a.names else [
        s for s in SCENARIOS if s.fast or not a.fast]
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="hvprof-scenarios-"))
    work.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    t0 = time.monotonic()
    total = len(chosen) * a.runs
    for run in range(1, a.runs + 1):
        for sc in chosen:
            done = len(results)
            print(f"[{done + 1}/{total}] {sc.name} (run {run}): {sc.cause} "
                  f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
            try:
                results.append(evaluate(sc, run, work))
            except Exception as exc:  # one broken scenario does not stop the table
                print(f"  failed: {exc}", file=sys.stderr)
                results.append(Result(sc.name, run, sc.expect, None, None, None,
                                      ["(run failed)"], 0, 0, float("nan"), False,
                                      note=str(exc)[:200]))
            r = results[-1]
            print(f"  first: {r.first}, cost {_fmt(r.cost_ms)} ms against {_fmt(r.truth_ms)}"
                  f" ms, false: {r.false or '-'}", file=sys.stderr, flush=True)
    print(f"\nwork folder: {work} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return _report(results, a.json)


if __name__ == "__main__":
    sys.exit(main())
