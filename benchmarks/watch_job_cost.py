"""The job's images/sec with and without `profiler watch` running, inside one run.

One profiled 2-rank training job (the bundled benchmark,
profiler.workloads.train_bench, HOROVOD_PROFILE=1) and one watcher,
`profiler watch DIR --interval 1` without a terminal (a text frame per
refresh, into a pipe this script reads), started once the ranks' raw files
exist.  While the job trains, the watcher is alternately running and stopped
(SIGSTOP / SIGCONT) in phases of --phase seconds, so that watched and
unwatched stretches share the run's machine state (the same processes,
cores, page cache and neighbours): the run-to-run variation that makes
separate runs differ by 25-50% on this project's machine cancels out of each
pair, as in benchmarks/ab_driver.py.

Phases come in pairs: "ab" pairs (one phase watched, one not, the order
drawn at random: a drift within the run cancels out, and so does anything
periodic) and, one pair in every three, "aa" pairs, the control (both
phases unwatched: what the method reads where there is no difference), in an
order drawn at random (--seed).  A stopped watcher keeps its memory and open files and
uses no CPU; when continued, its first refresh reads what the ranks appended
while it was stopped, so a watched phase carries the catch-up of the phase
before it: if anything the cost is over-stated.

Images/sec per phase comes from the job's own step records (op "step",
count = images, t_start/t_end; read from raw/rank-R.hvprof, the records
trace.json's step events are made of, on CLOCK_MONOTONIC, the clock the
phases are timed with): per rank, the images over the time in the timed steps
that lie wholly inside the phase; the job's is the sum over the ranks (as
trace.json's metadata computes it).  Per pair, watched / unwatched (control:
first / second).  Reported: the median of the pairs' ratios with a 95%
bootstrap interval of the median, the geometric mean with a 95% moving-block
bootstrap interval (blocks of BLOCK consecutive pairs: neighbouring pairs share
the machine's slow and fast stretches), the same for the control, and the
watcher's CPU (its utime + stime from /proc) per refresh and as a share of one
core while it runs.  Not a test.

    .venv/bin/python benchmarks/watch_job_cost.py [--phase 3] [--steps 3600]
        [--model cnn] [--interval 1] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# the launcher settings of the sibling benchmarks (run as a script: its folder is on sys.path)
from timeline_cost import MPI_ENV  # noqa: E402

#: pairs per block of the geometric mean's bootstrap
BLOCK = 4
#: steps a rank needs inside a phase for the phase to count
MIN_STEPS = 5


def pair_plan(n_pairs: int, seed: int) -> list[tuple[str, str]]:
    """n_pairs pairs of phase states ("watched"/"unwatched"): in every three
    pairs, two "ab" pairs (order at random) and one "aa" control pair, in an
    order drawn at random (so any prefix of the plan, whatever the job's
    length, holds them two to one)."""
    rng = random.Random(seed)
    kinds: list[str] = []
    while len(kinds) < n_pairs:
        block = ["ab", "ab", "aa"]
        rng.shuffle(block)
        kinds += block
    kinds = kinds[:n_pairs]
    out: list[tuple[str, str]] = []
    for k in kinds:
        if k == "aa":
            out.append(("unwatched", "unwatched"))
        elif rng.random() < 0.5:
            out.append(("watched", "unwatched"))
        else:
            out.append(("unwatched", "watched"))
    return out


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds (/proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Frames:
    """Counts the watcher's text frames (a line "profiler watch  DIR" opens each)."""

    def __init__(self, stream: Any) -> None:
        self.count = 0
        self.last: list[str] = []
        self._t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._t.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            if line.startswith("profiler watch "):
                self.count += 1
                self.last = []
            self.last.append(line.rstrip("\n"))


def step_records(prof: Path) -> tuple[dict[int, tuple[Any, Any, Any]], float]:
    """rank -> (t_start mono ns, t_end mono ns, images) of its timed steps, and
    the records a rank wrote per second over the timed steps (mean of ranks:
    what each refresh of the watcher has to read)."""
    import numpy as np

    from profiler.formats import record as F
    from profiler.formats.clock import ticks_to_mono_ns
    from profiler.formats.raw import read_raw

    out = {}
    rates = []
    for path in sorted((prof / "raw").glob("rank-*.hvprof")):
        raw = read_raw(path)
        rec = raw.records[(raw.records["op"] == F.OP_APP_STEP) & (raw.records["count"] > 0)]
        t0 = ticks_to_mono_ns(rec["t_start"], raw.header)
        t1 = ticks_to_mono_ns(rec["t_end"], raw.header)
        out[int(raw.header["rank"])] = (t0, t1, rec["count"].astype(np.int64))
        if len(rec):
            every = ticks_to_mono_ns(raw.records["t_start"], raw.header)
            n = int(((every >= t0.min()) & (every <= t1.max())).sum())
            rates.append(n / ((int(t1.max()) - int(t0.min())) / 1e9))
    return out, float(np.mean(rates)) if rates else float("nan")


def trace_steps(prof: Path) -> int | None:
    """Step events with images in trace.json (a cross-check of the raw records)."""
    trace = prof / "trace.json"
    if not trace.is_file():
        return None
    doc = json.loads(trace.read_bytes())
    return sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == "step"
               and int((e.get("args") or {}).get("count") or 0) > 0)


def phase_rate(steps: dict[int, tuple[Any, Any, Any]], a: int, b: int) -> float | None:
    """The job's images/sec over the steps wholly inside [a, b) (None: too few)."""
    total = 0.0
    for t0, t1, imgs in steps.values():
        inside = (t0 >= a) & (t1 <= b)
        if int(inside.sum()) < MIN_STEPS:
            return None
        ns = float((t1[inside] - t0[inside]).sum())
        total += float(imgs[inside].sum()) / (ns / 1e9)
    return total


def phase_spread(phases: list[dict[str, Any]]) -> dict[str, float] | None:
    """The unwatched phases' images/sec: median and 10th-90th percentiles
    over the median (how much 3-second stretches of the job differ)."""
    vals = sorted(p["images_per_sec"] for p in phases
                  if p["state"] == "unwatched" and p["images_per_sec"] is not None)
    if len(vals) < 3:
        return None
    med = statistics.median(vals)
    q = statistics.quantiles(vals, n=10)
    return {"median": med, "p10": q[0] / med, "p90": q[-1] / med}


def median_interval(values: list[float], n_boot: int = 4000) -> tuple[float, float, float]:
    """The median and a 95% bootstrap interval of it."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n_boot))
    return statistics.median(values), meds[int(0.025 * n_boot)], meds[int(0.975 * n_boot) - 1]


def geomean_interval(values: list[float], n_boot: int = 4000) -> tuple[float, float, float]:
    """Geometric mean and a 95% moving-block bootstrap interval (blocks of BLOCK pairs)."""
    logs = [math.log(x) for x in values]
    m, b = len(logs), min(BLOCK, len(logs))
    rng = random.Random(0)
    boots = []
    for _ in range(n_boot):
        tot, got = 0.0, 0
        while got < m:
            s = rng.randrange(m - b + 1)
            take = min(b, m - got)
            tot += sum(logs[s:s + take])
            got += take
        boots.append(tot / m)
    boots.sort()
    return (math.exp(statistics.fmean(logs)), math.exp(boots[int(0.025 * n_boot)]),
            math.exp(boots[int(0.975 * n_boot) - 1]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="hvprof-watchjob-"))
    prof = work / "prof"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_PROFILE", "HOROVOD_TIMELINE"))}
    env.update(MPI_ENV)
    env.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof),
               HOROVOD_PROFILE_MERGE_TIMEOUT="20")
    iters = max(2, args.steps // 10)
    bench = ["--model", args.model, "--batch-size", str(args.batch_size), "--image-size", "32",
             "--num-warmup-batches", "5", "--num-batches-per-iter", "10",
             "--num-iters", str(iters), "--quiet"]
    load0 = os.getloadavg()[0]
    t_start = time.monotonic()
    # the job's output into a file, read at its end: a pipe read only then
    # fills (64 KiB) in a long run and blocks mpirun, which then never ends
    out_path = work / "job.out"
    with open(out_path, "w") as job_out:
        job = subprocess.Popen(["mpirun", "-n", str(args.ranks), sys.executable, "-m",
                                "profiler.workloads.train_bench", *bench],
                               env=env, cwd=work, stdout=job_out, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    watcher: subprocess.Popen[str] | None = None
    err_path = work / "watch.err"
    phases: list[dict[str, Any]] = []
    try:
        while len(list((prof / "raw").glob("rank-*.hvprof"))) < args.ranks:
            if job.poll() is not None:
                raise SystemExit("watch_job_cost: the job ended early:\n"
                                 f"{out_path.read_text()[-3000:]}")
            time.sleep(0.1)
        with open(err_path, "w") as err:
            watcher = subprocess.Popen(
                [sys.executable, "-P", "-m", "profiler.cli", "watch", str(prof),
                 "--interval", str(args.interval)],
                stdout=subprocess.PIPE, stderr=err, text=True, cwd=work)
        assert watcher.stdout is not None
        frames = Frames(watcher.stdout)
        while frames.count < 1 and watcher.poll() is None:  # its start-up: not measured
            time.sleep(0.05)
        cpu0, frames0 = proc_cpu_s(watcher.pid), frames.count
        state = "watched"
        for pair in pair_plan(10_000, args.seed):
            for want in pair:
                if job.poll() is not None:
                    break
                if want != state:
                    os.kill(watcher.pid, signal.SIGCONT if want == "watched" else signal.SIGSTOP)
                    state = want
                p: dict[str, Any] = {"state": want, "t0": time.monotonic_ns(),
                                     "frames0": frames.count, "cpu0": proc_cpu_s(watcher.pid)}
                deadline = time.monotonic() + args.phase
                while time.monotonic() < deadline and job.poll() is None:
                    time.sleep(0.05)
                p.update(t1=time.monotonic_ns(), frames1=frames.count,
                         cpu1=proc_cpu_s(watcher.pid))
                phases.append(p)
            if job.poll() is not None:
                break
        cpu1, frames1 = proc_cpu_s(watcher.pid), frames.count
        job.wait(timeout=600)
        out = out_path.read_text()
        if job.returncode != 0:
            raise SystemExit(f"watch_job_cost: the job failed ({job.returncode}):\n{out[-3000:]}")
        result = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
        wall = time.monotonic() - t_start
        os.kill(watcher.pid, signal.SIGCONT)
        try:
            watcher.wait(timeout=60)  # it shows the final state and exits
        except subprocess.TimeoutExpired:
            watcher.kill()
        deadline = time.monotonic() + 60
        while not (prof / "trace.json").is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        steps, records_per_s = step_records(prof)
        n_trace = trace_steps(prof)
    finally:
        if watcher is not None and watcher.poll() is None:
            os.kill(watcher.pid, signal.SIGCONT)
            watcher.kill()
            watcher.wait()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    load1 = os.getloadavg()[0]
    watch_err = err_path.read_text()
    shutil.rmtree(work, ignore_errors=True)

    for p in phases:
        p["images_per_sec"] = phase_rate(steps, p["t0"], p["t1"])
    ratios: list[float] = []
    control: list[float] = []
    for k in range(0, len(phases) - 1, 2):
        a, b = phases[k], phases[k + 1]
        if a["images_per_sec"] is None or b["images_per_sec"] is None:
            continue
        if a["state"] == b["state"]:
            control.append(a["images_per_sec"] / b["images_per_sec"])
        else:
            w, u = (a, b) if a["state"] == "watched" else (b, a)
            ratios.append(w["images_per_sec"] / u["images_per_sec"])
    watched = [p for p in phases if p["state"] == "watched"]
    watched_s = sum(p["t1"] - p["t0"] for p in watched) / 1e9
    n_raw = sum(len(v[0]) for v in steps.values())
    refreshes = frames1 - frames0
    cpu = cpu1 - cpu0
    return {
        "args": vars(args), "job": result, "wall_s": wall, "load": [load0, load1],
        "timed_steps_raw": n_raw, "timed_steps_trace": n_trace,
        "records_per_rank_per_s": records_per_s,
        "phase_rate_spread": phase_spread(phases),
        "phases": phases, "ratios": ratios, "control": control,
        "watched_s": watched_s, "refreshes": refreshes, "watcher_cpu_s": cpu,
        "watcher_cpu_per_refresh_ms": 1e3 * cpu / refreshes if refreshes else None,
        "watcher_core_share": cpu / watched_s if watched_s else None,
        "watcher_stderr": watch_err[-2000:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="cnn", help="train_bench's model (default cnn)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3600,
                    help="timed optimizer steps per rank (the job's length; default 3600)")
    ap.add_argument("--phase", type=float, default=3.0, help="seconds per phase (default 3)")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="the watcher's --interval (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="the pairs' kinds and order")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if shutil.which("mpirun") is None:
        print("watch_job_cost: mpirun not found", file=sys.stderr)
        return 2
    r = run(args)
    job = r["job"]
    print(f"job: {args.model}, {args.ranks} ranks, batch {args.batch_size}: "
          f"{r['timed_steps_raw']} timed steps (all ranks; trace.json: "
          f"{r['timed_steps_trace']}) in {r['wall_s']:.0f} s, "
          f"{job['images_per_sec']:.1f} img/s (train_bench), load {r['load'][0]:.1f} -> "
          f"{r['load'][1]:.1f}")
    print(f"phases of {args.phase:g} s: {len(r['ratios'])} watched/unwatched pairs, "
          f"{len(r['control'])} control pairs (both unwatched); "
          f"{r['records_per_rank_per_s']:.0f} records per rank per second")
    sp = r["phase_rate_spread"]
    if sp:
        print(f"unwatched phases: {sp['median']:.0f} img/s (median), 10th-90th percentile "
              f"{100 * sp['p10']:.0f}-{100 * sp['p90']:.0f}% of it")
    print(f"{'':22s} {'pairs':>5s} {'median':>8s} {'95% interval':>16s} "
          f"{'geo. mean':>9s} {'95% interval':>16s}")
    for label, vals in (("watched / unwatched", r["ratios"]), ("control (A/A)", r["control"])):
        if len(vals) < 2:
            print(f"{label:22s} {len(vals):5d}  (too few pairs)")
            continue
        m, lo, hi = median_interval(vals)
        g, glo, ghi = geomean_interval(vals)
        r[label] = {"median": m, "median_ci95": [lo, hi], "geomean": g, "geomean_ci95": [glo, ghi]}
        print(f"{label:22s} {len(vals):5d} {100 * m:7.1f}% [{100 * lo:5.1f}, {100 * hi:5.1f}]% "
              f"{100 * g:8.1f}% [{100 * glo:5.1f}, {100 * ghi:5.1f}]%")
    if r["watcher_cpu_per_refresh_ms"] is not None:
        print(f"watcher: {r['refreshes']} refreshes while running ({r['watched_s']:.0f} s), "
              f"{r['watcher_cpu_per_refresh_ms']:.1f} ms CPU per refresh (utime + stime, "
              f"rendering included), {100 * r['watcher_core_share']:.1f}% of one core")
    if r["watcher_stderr"].strip():
        print("watcher stderr:", r["watcher_stderr"].strip()[-500:])
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
