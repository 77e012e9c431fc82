#!/usr/bin/env python3
"""The profiler's cost per call as a user's program sees it (benchmarks/, not a test).

Entry point: ``python benchmarks/overhead/separate.py [--mpip PATH/libmpiP.so]``
(with the venv's python, from any directory; it uses the installed package's
libhvprof.so unless --lib says otherwise).

A tiny C program (separate_loop.c: N calls of MPI_Allreduce, MPI_FLOAT/MPI_SUM,
in a plain loop) is built with mpicc and run as separate processes under
mpirun (Open MPI), one process per measurement:

  unprofiled   nothing preloaded
  full         LD_PRELOAD=libhvprof.so, HOROVOD_PROFILE=1 (one record per call)
  summary      LD_PRELOAD=libhvprof.so, HOROVOD_PROFILE=summary
  mpip         LD_PRELOAD=libmpiP.so, MPIP="-k 0" (only with --mpip)
  full-base,   the same with another build of libhvprof.so (only with
  summary-base --baseline PATH: a before/after in the same rounds)

at 0 B, 8 B, 4 KiB and 1 MiB, 1 and 2 ranks.  Each round runs every cell
(size, ranks) once in every configuration, in an order that rotates from
round to round; the added cost of a configuration in a round is its per-call
time minus the unprofiled one of the same round and cell, and the table
gives the median over rounds with the 25th and 75th percentiles.  The
per-call time is the loop's (MPI_Barrier, then the calls; the slowest rank),
so MPI_Init and MPI_Finalize, where profilers set up and write reports, are
apart: their added milliseconds are printed after the tables.  Also printed:
where the added time goes (CPU per call of the calling thread, and of the
process's other threads: the profiler's helper thread), what the profiler
says of itself (the raw file header's call_cost_ns and helper_cpu_ns), and
any dropped record (a fast run that dropped records would be no result).
Before each run it waits (up to --max-wait seconds) for the machine to be
idle (--idle: the share of CPUs other work may use), and says how many runs
started busy anyway.

Open MPI's defaults are kept (at 1 or 2 ranks each rank is bound to a core,
as a user's job is) except that root is allowed; --bind none passes
--bind-to none.  HOROVOD_PROFILE_* variables of the caller (other than
HOROVOD_PROFILE and HOROVOD_PROFILE_DIR) are passed to the profiled ranks.

Usage:
  separate.py [--rounds 5] [--sizes 0,8,4096,1048576] [--ranks 1,2]
              [--calls N] [--mpip PATH] [--lib PATH] [--baseline PATH]
              [--bind default|none]
              [--dir DIR] [--json OUT] [--idle 0.25] [--max-wait 20]

mpiP is not part of this repository: build it in a scratch folder (see
docs/ or DESIGN notes: ``CC=mpicc ./configure --disable-libunwind
--disable-bfd && LOGNAME=root make shared``) and pass --mpip.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}
SIZES = (0, 8, 4096, 1 << 20)
LABELS = {"unprofiled": "unprofiled", "full": "+ full trace", "summary": "+ summary mode",
          "full-base": "+ full (--baseline)", "summary-base": "+ summary (--baseline)",
          "mpip": "+ mpiP"}
PROFILED = ("full", "summary", "full-base", "summary-base")


def default_calls(nbytes: int) -> int:
    """Calls per run: about 20-150 ms of loop at 2 ranks on this machine kind."""
    if nbytes <= 64:
        return 300_000
    if nbytes <= 64 << 10:
        return 50_000
    return 400


def library() -> str:
    from profiler.collect import native

    return native.library_path()


def fmt_ns(ns: float) -> str:
    """Nanoseconds with one decimal below 1 us, else in the project's units."""
    if ns != ns:  # NaN
        return "-"
    if abs(ns) < 1000:
        return f"{ns:.1f} ns"
    from profiler.units import fmt_ns as units_ns

    return units_ns(ns)


def fmt_size(n: int) -> str:
    from profiler.units import fmt_bytes

    return fmt_bytes(n)


def quantile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def interval(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{fmt_ns(statistics.median(xs))} [{quantile(xs, 0.25):.1f}, {quantile(xs, 0.75):.1f}]"


def busy_fraction(interval: float = 0.3) -> float:
    """Share of all CPUs busy over `interval` seconds (from /proc/stat; 0 if unknown)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v), idle
    try:
        t0, i0 = sample()
        time.sleep(interval)
        t1, i1 = sample()
    except (OSError, ValueError):
        return 0.0
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def wait_idle(limit: float, max_wait: float) -> bool:
    """Wait (up to max_wait s) until at most `limit` of the CPUs are busy; False if
    the run starts on a busy machine anyway."""
    deadline = time.monotonic() + max_wait
    while True:
        if busy_fraction() <= limit:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def run_once(exe: Path, nbytes: int, calls: int, np_: int, config: str, args: argparse.Namespace,
             scratch: Path) -> dict[str, Any]:
    """One mpirun; returns the RESULT fields (+ the profiler's header fields)."""
    work = Path(tempfile.mkdtemp(prefix=f"{config}-", dir=scratch))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HOROVOD_PROFILE") and k not in ("LD_PRELOAD", "MPIP")}
    env.update(MPI_ENV)
    cmd = ["mpirun", "-n", str(np_)]
    if args.bind == "none":
        cmd += ["--bind-to", "none"]
    prof = work / "prof"
    if config in PROFILED:
        env["HOROVOD_PROFILE"] = "summary" if config.startswith("summary") else "1"
        env["HOROVOD_PROFILE_DIR"] = str(prof)
        lib = args.baseline if config.endswith("-base") else args.lib
        cmd += ["-x", f"LD_PRELOAD={lib}", "-x", "HOROVOD_PROFILE",
                "-x", "HOROVOD_PROFILE_DIR"]
        for k, v in os.environ.items():
            if k.startswith("HOROVOD_PROFILE_") and k != "HOROVOD_PROFILE_DIR":
                env[k] = v
                cmd += ["-x", k]
    elif config == "mpip":
        env["MPIP"] = "-k 0"
        cmd += ["-x", f"LD_PRELOAD={args.mpip}", "-x", "MPIP"]
    try:
        p = subprocess.run([*cmd, str(exe), str(nbytes), str(calls)], env=env, cwd=work,
                           capture_output=True, text=True, timeout=600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"separate.py: {config} at {nbytes} B, {np_} rank(s) failed "
                             f"(exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        parts = lines[0].split()[1:]
        out: dict[str, Any] = {k: float(v) for k, v in zip(parts[::2], parts[1::2])}
        if config in PROFILED:
            out.update(profiler_says(prof, np_))
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def profiler_says(prof: Path, np_: int) -> dict[str, Any]:
    """Dropped records and the profiler's own cost figures, from the raw headers."""
    from profiler.formats.raw import read_header

    dropped = 0
    cost: list[float] = []
    helper = 0.0
    for f in sorted((prof / "raw").glob("rank-*.hvprof")):
        h = read_header(f)
        dropped += int(h["dropped_records"])
        if float(h.get("call_cost_ns", 0) or 0) > 0:
            cost.append(float(h["call_cost_ns"]))
        helper += float(h.get("helper_cpu_ns", 0) or 0)
    return {"dropped": dropped, "call_cost_ns": statistics.median(cost) if cost else 0.0,
            "helper_cpu_ns_total": helper / max(np_, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes, comma-separated")
    ap.add_argument("--ranks", default="1,2", help="rank counts, comma-separated")
    ap.add_argument("--calls", type=int, default=0, help="calls per run (default: by size)")
    ap.add_argument("--mpip", help="path of libmpiP.so (adds the mpiP column)")
    ap.add_argument("--lib", help="profiler library to preload (default: the installed one)")
    ap.add_argument("--baseline", help="another build of the library, measured in the same "
                    "rounds (before/after columns)")
    ap.add_argument("--bind", choices=("default", "none"), default="default")
    ap.add_argument("--dir", type=Path, help="scratch folder for the runs (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="write every sample here")
    ap.add_argument("--idle", type=float, default=0.25,
                    help="before each run, wait until at most this share of the CPUs is busy "
                         "(other people's work; 1 = never wait)")
    ap.add_argument("--max-wait", type=float, default=20.0,
                    help="seconds to wait for that before running anyway")
    args = ap.parse_args()
    args.lib = args.lib or library()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    ranks = [int(r) for r in args.ranks.split(",") if r]
    configs = ["unprofiled", "full", "summary"]
    configs += ["full-base", "summary-base"] if args.baseline else []
    configs += ["mpip"] if args.mpip else []
    if args.mpip and not Path(args.mpip).is_file():
        raise SystemExit(f"separate.py: --mpip {args.mpip}: no such file")
    cells = [(b, n) for b in sizes for n in ranks]
    samples: dict[tuple[int, int, str], list[dict[str, Any]]] = {
        (b, n, c): [] for b, n in cells for c in configs}
    scratch = Path(tempfile.mkdtemp(prefix="hvprof-separate-", dir=args.dir))
    tty = sys.stderr.isatty()
    total = args.rounds * len(cells) * len(configs)
    done = 0
    busy_runs = 0
    t_start = time.monotonic()
    try:
        exe = scratch / "separate_loop"
        subprocess.run(["mpicc", "-O2", str(HERE / "separate_loop.c"), "-o", str(exe)], check=True)
        for r in range(args.rounds):
            for k, (b, n) in enumerate(cells):
                shift = (r + k) % len(configs)
                order = configs[shift:] + configs[:shift]
                if r % 2:
                    order.reverse()
                for c in order:
                    done += 1
                    eta = (time.monotonic() - t_start) / done * (total - done)
                    msg = (f"round {r + 1}/{args.rounds}  {fmt_size(b)}, {n} rank(s), {c:<10}"
                           f" [{done}/{total}, ~{eta:.0f} s left]")
                    print(msg.ljust(72), end="\r" if tty else "\n", file=sys.stderr, flush=True)
                    calls = args.calls or default_calls(b)
                    if args.idle < 1 and not wait_idle(args.idle, args.max_wait):
                        busy_runs += 1
                    samples[(b, n, c)].append(run_once(exe, b, calls, n, c, args, scratch))
        if tty:
            print(" " * 72, end="\r", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(cells, configs, samples, args)
    if busy_runs:
        print(f"\n{busy_runs} of {total} runs started while more than {args.idle:.0%} of the "
              f"CPUs were busy with other work (waited {args.max_wait:.0f} s each)")
    if args.json:
        args.json.write_text(json.dumps({
            "library": args.lib, "baseline": args.baseline, "mpip": args.mpip,
            "rounds": args.rounds, "bind": args.bind,
            "samples": [{"bytes": b, "ranks": n, "config": c, "runs": v}
                        for (b, n, c), v in samples.items()]}, indent=1))
    return 0


def added(samples: dict[tuple[int, int, str], list[dict[str, Any]]], b: int, n: int, c: str,
          key: str = "loop_ns") -> list[float]:
    base = samples[(b, n, "unprofiled")]
    return [x[key] - y[key] for x, y in zip(samples[(b, n, c)], base)]


def report(cells: list[tuple[int, int]], configs: list[str],
           samples: dict[tuple[int, int, str], list[dict[str, Any]]],
           args: argparse.Namespace) -> None:
    rounds = len(samples[(cells[0][0], cells[0][1], "unprofiled")])
    print(f"Per call, MPI_Allreduce, separate processes (LD_PRELOAD), median of {rounds} rounds "
          f"[p25, p75] in ns; bind: {args.bind}")
    head = ["size", "ranks", *(LABELS[c] for c in configs)]
    rows = []
    for b, n in cells:
        row = [fmt_size(b), str(n), interval([x["loop_ns"] for x in samples[(b, n, "unprofiled")]])]
        row += [interval(added(samples, b, n, c)) for c in configs[1:]]
        rows.append(row)
    table(head, rows)

    def pair_table(title: str, names: str, first: str, second: str) -> None:
        """One table of "median added first / median added second" per cell and
        profiled configuration."""
        print(title)
        head = ["size", "ranks", *(f"{LABELS[c]}: {names}" for c in configs[1:])]
        rows = []
        for b, n in cells:
            row = [fmt_size(b), str(n)]
            for c in configs[1:]:
                x = statistics.median(added(samples, b, n, c, first))
                y = statistics.median(added(samples, b, n, c, second))
                row.append(f"{x:.1f} / {y:.1f}")
            rows.append(row)
        table(head, rows)

    pair_table("\nWhere the added time goes: CPU per call added on the calling thread / used "
               "by the process's other threads (the profiler's helper), median ns",
               "caller / others", "main_cpu_ns", "other_cpu_ns")
    pair_table("\nAdded per run (set-up in MPI_Init, reports in MPI_Finalize), median ms",
               "init / finalize", "init_ms", "finalize_ms")

    says = []
    for b, n in cells:
        for c in (x for x in configs if x in PROFILED):
            runs = samples[(b, n, c)]
            cost = [x["call_cost_ns"] for x in runs if x.get("call_cost_ns")]
            dropped = sum(int(x.get("dropped", 0)) for x in runs)
            calls = args.calls or default_calls(b)
            helper = [x["helper_cpu_ns_total"] / calls for x in runs]
            if dropped:
                print(f"warning: {c} at {fmt_size(b)}, {n} rank(s): {dropped} records dropped",
                      file=sys.stderr)
            if cost:
                says.append(f"{c} {fmt_size(b)} {n}r: call_cost_ns {statistics.median(cost):.1f}, "
                            f"helper {statistics.median(helper):.1f} ns/call")
    if says:
        print("\nThe profiler's own figures (raw header: call_cost_ns; helper_cpu_ns / calls):")
        for s in says:
            print("  " + s)


def table(head: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


if __name__ == "__main__":
    sys.exit(main())
