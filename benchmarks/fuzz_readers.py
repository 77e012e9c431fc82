"""Fuzz every reader of the profiler with hostile inputs.

    python benchmarks/fuzz_readers.py                 # every reader, many cases
    python benchmarks/fuzz_readers.py --reader raw --cases 2000 --seed 7
    python benchmarks/fuzz_readers.py --quick --json out.json   # the CI subset

Seed files are real: a tiny mpi4py job runs once under mpirun with
HOROVOD_PROFILE=1 (and once with HOROVOD_PROFILE=summary); the raw file is
repacked with small table capacities so that truncating it at every byte
boundary stays cheap.  The Horovod timeline is the real fixture of
tests/data; the bench plan is written by profiler.bench.write_plan.

Readers (what `profiler merge`, `summarize` and the analysis API run):

    raw       raw/rank-R.hvprof   -> convert_raw (read_raw, raw_to_frame, parquet)
    header    raw/rank-R.hvprof   -> read_header
    agg       raw/rank-R.agg      -> convert_raw of a summary-mode rank
    meta      ranks/rank-R.json   -> merge(profile dir)
    parquet   ranks/rank-R.parquet-> merge(profile dir), read_dataset
    trace     trace.json          -> profiler.analysis.load_meta + load
    timeline  Horovod timeline    -> timeline.parse + tensor_ops
    plan      bench plan          -> profiler.bench.sweep.read_plan
    tensors   raw/rank-R.tensors  -> merge(profile dir): names of the tensor records
    hang      raw/rank-R.hvprof   -> profiler.analysis.hang.diagnose (flight recorder,
                                     tensor records): never refuses, says what it
                                     could not read

Mutations: truncation at every byte boundary (strided for big files), seeded
random bit flips and byte splats, every header field set to extreme values
(raw, agg, chunk headers), wrong versions, huge counts, JSON type swaps,
deep and enormous JSON, invalid UTF-8; and path kinds: a directory, a FIFO
(must not hang), an unreadable file (/proc/self/mem reads fail with EIO), a
dangling symlink, an empty file.

Every case must end in one of: accepted (the reader returned), or refused
with a profiler.errors.ProfilerError; anything else (another exception, a
case over --case-timeout seconds, memory over --max-rss-mb) is a finding.
A sample of cases also goes through the CLI entry point in-process
(profiler.cli.main): exit status 0, or 2 with exactly one line
`profiler: error: ...` on stderr; never an escaping exception, never a
control character on stdout or stderr (names and paths come from the file).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fuzz_targets (also under -P)

from conftest import base_env  # noqa: E402  (Open MPI test settings, one place)
from fuzz_targets import TARGETS, cases_for  # noqa: E402  (the readers and their cases)

from profiler.errors import ProfilerError  # noqa: E402
from profiler.formats import record as F  # noqa: E402

SEED_JOB = r"""
import numpy as np
from mpi4py import MPI
import profiler
c = MPI.COMM_WORLD
c.Set_name("world\x1b[31m")
a = np.arange(8, dtype=np.float32); b = np.empty_like(a)
for i in range(3):
    profiler.step(images=4)
    c.Allreduce(a, b); c.Bcast(a); c.Allreduce(MPI.IN_PLACE, b, op=MPI.MAX)
profiler.step(images=4)
c.Barrier()
"""



# ---------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------
def make_seeds(work: Path) -> dict[str, Path]:
    """Real seed files (two tiny mpirun jobs, about 3 s) -> name: path."""
    work.mkdir(parents=True, exist_ok=True)
    script = work / "seed_job.py"
    script.write_text(SEED_JOB)
    seeds: dict[str, Path] = {}
    for mode in ("1", "summary"):
        prof = work / f"seed-{mode}"
        env = base_env(HOROVOD_PROFILE=mode, HOROVOD_PROFILE_DIR=str(prof),
                       HOROVOD_PROFILE_CHUNK_KB="4")
        p = subprocess.run(["mpirun", "-n", "1", sys.executable, str(script)], env=env,
                           cwd=work, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"seed job failed: {p.stderr[-2000:]}")
        if mode == "1":
            raw = prof / "raw" / "rank-00000.hvprof"
            small = work / "seed.hvprof"
            small.write_bytes(compact_raw(raw.read_bytes()))
            seeds["raw"] = seeds["header"] = small
            seeds["meta"] = prof / "ranks" / "rank-00000.json"
            seeds["parquet"] = prof / "ranks" / "rank-00000.parquet"
            seeds["trace"] = prof / "trace.json"
            seeds["_full_dir"] = prof
        else:
            seeds["agg"] = prof / "raw" / "rank-00000.agg"
            seeds["_summary_raw"] = prof / "raw" / "rank-00000.hvprof"
    seeds["timeline"] = ROOT / "tests" / "data" / "horovod_timeline_fused.json"
    names = work / "seed.tensors"
    names.write_bytes(b"".join(json.dumps(n).encode() + b"\n" for n in (
        "allreduce.conv1.weight", "allreduce.fc.bias", "broadcast.0.weight",
        "grouped_allreduce.noname.3_1of2")))
    seeds["tensors"] = names
    seeds["hang"] = seeds["raw"]
    from profiler.bench import write_plan

    plan = work / "plan.json"
    write_plan([{"op": "allreduce", "count": 256, "dtype_size": 4, "calls": 3,
                 "dtype": "MPI_FLOAT", "comm_size": 2}], plan, "seed")
    seeds["plan"] = plan
    return seeds


def compact_raw(data: bytes, capacity: int = 4) -> bytes:
    """The same raw file with comm/track tables of `capacity` entries (the library
    reserves 1024 of each: 128 KiB of mostly zeros)."""
    h = np.frombuffer(data[:F.HEADER_BYTES], dtype=F.HEADER_DTYPE).copy()
    n_comms, n_tracks = int(h["n_comms"][0]), int(h["n_tracks"][0])
    cap = max(capacity, n_comms, n_tracks)
    comm_off, track_off = int(h["comm_table_offset"][0]), int(h["track_table_offset"][0])
    first, chunk = int(h["first_chunk_offset"][0]), int(h["chunk_bytes"][0])
    n_chunks = int(h["n_chunks"][0])
    comms = data[comm_off:comm_off + 64 * cap]
    tracks = data[track_off:track_off + 64 * cap]
    chunks = data[first:first + n_chunks * chunk]
    new_comm = F.HEADER_BYTES
    new_track = new_comm + 64 * cap
    new_first = new_track + 64 * cap
    h["comm_table_offset"] = new_comm
    h["comm_table_capacity"] = cap
    h["track_table_offset"] = new_track
    h["track_table_capacity"] = cap
    h["first_chunk_offset"] = new_first
    return h.tobytes() + comms + tracks + chunks


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------
class CaseTimeout(BaseException):
    """Not an Exception: a reader's `except Exception` must not swallow it."""


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout()


@dataclass
class Finding:
    reader: str
    case: str
    where: str  # api | cli
    what: str

    def line(self) -> str:
        return f"{self.reader} [{self.where}] {self.case}: {self.what}"


@dataclass
class Report:
    cases: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    cli_cases: dict[str, int] = field(default_factory=dict)
    slowest_s: dict[str, float] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    max_rss_mb: float = 0.0
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"cases": self.cases, "refused": self.refused, "accepted": self.accepted,
                "cli_cases": self.cli_cases, "slowest_s": self.slowest_s,
                "max_rss_mb": self.max_rss_mb, "seconds": self.seconds,
                "findings": [f.__dict__ for f in self.findings]}


def _materialize(target: Path, payload: bytes | str) -> None:
    if target.exists() or target.is_symlink():
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(payload, bytes):
        target.write_bytes(payload)
    elif payload == "directory":
        target.mkdir()
    elif payload == "fifo":
        os.mkfifo(target)
    elif payload == "unreadable":
        target.symlink_to("/proc/self/mem")  # open works, every read fails (EIO)
    elif payload == "dangling-symlink":
        target.symlink_to(target.parent / "nowhere")
    elif payload == "empty":
        target.write_bytes(b"")


@contextlib.contextmanager
def fifo_watchdog(fifo: Path | None, timeout: float) -> Iterator[list[bool]]:
    """A reader blocked in C on a FIFO's open() never sees SIGALRM: after the
    timeout a thread opens the FIFO for writing, which lets the open return
    (the case is then counted as a hang)."""
    fired = [False]
    if fifo is None:
        yield fired
        return
    import threading

    stop = threading.Event()

    def watch() -> None:
        if stop.wait(timeout):
            return
        while not stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader blocked (yet): try again
                stop.wait(0.2)
                continue
            fired[0] = True
            os.close(fd)
            stop.wait(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        yield fired
    finally:
        stop.set()
        t.join()


def _one(fn: Callable[[], Any], timeout: float) -> tuple[str, float, BaseException | None]:
    t0 = time.perf_counter()
    exc: BaseException | None = None
    signal.setitimer(signal.ITIMER_REAL, timeout, 0.5)  # again every 0.5 s if swallowed
    try:
        fn()
        outcome = "accepted"
    except ProfilerError as e:
        outcome, exc = "refused", e
    except CaseTimeout as e:
        outcome, exc = "timeout", e
    except BaseException as e:  # noqa: BLE001 - every other exception is a finding
        outcome, exc = "bug", e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return outcome, time.perf_counter() - t0, exc


def _cli(argv: list[str], timeout: float) -> tuple[str, str]:
    """profiler.cli.main in-process: (outcome, detail)."""
    from profiler.cli import main

    err = io.StringIO()
    out = io.StringIO()
    rc: int | None = None

    def run() -> None:
        nonlocal rc
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(argv)

    outcome, _, exc = _one(run, timeout)
    lines = err.getvalue().splitlines()
    if outcome == "timeout":
        return "timeout", ""
    if exc is not None:
        return "bug", f"exception escaped main: {type(exc).__name__}: {exc}"[:300]
    errors = [x for x in lines if x.startswith("profiler: error: ")]
    said = out.getvalue() + err.getvalue()
    if any(ord(ch) < 0x20 and ch not in "\n\t" or 0x7F <= ord(ch) < 0xA0 for ch in said):
        return "bug", f"a control character reached the terminal: {said[-200:]!r}"
    if rc == 2 and len(errors) == 1 and "Traceback" not in err.getvalue():
        return "refused", errors[0]
    if rc == 0 and not errors:
        return "accepted", ""
    return "bug", f"exit {rc}, stderr {err.getvalue()[-300:]!r}"


def run(readers: list[str], *, n_random: int, trunc_budget: int, cli_every: int,
        seed: int, case_timeout: float, work: Path, log: Callable[[str], None] = print,
        full_every: int = 64, seeds: dict[str, Path] | None = None) -> Report:
    """Run the cases; a truncation runs the whole reader every `full_every` cases
    and the parser alone (read_raw) for the others."""
    signal.signal(signal.SIGALRM, _alarm)
    t_start = time.perf_counter()
    rep = Report()
    if seeds is None:
        seeds = make_seeds(work / "seeds")
    for name in readers:
        target = TARGETS[name]
        rng = random.Random(f"{seed}:{name}")
        seed_bytes = seeds[name].read_bytes()
        n = refused = accepted = cli_n = 0
        slowest = 0.0
        for k, (label, payload) in enumerate(cases_for(name, seed_bytes, rng, n_random,
                                                         trunc_budget)):
            case = Path(tempfile.mkdtemp(dir=work, prefix=f"{name}-"))
            try:
                f = target.place(case, seeds)
                _materialize(f, payload)
                api = target.api
                if (target.parse is not None and label.startswith("truncate@")
                        and k % full_every):
                    api = target.parse
                fifo = f if payload == "fifo" else None
                with fifo_watchdog(fifo, case_timeout) as hung:
                    outcome, secs, exc = _one(functools.partial(api, f, case), case_timeout)
                if hung[0]:
                    outcome = "timeout"
                slowest = max(slowest, secs)
                n += 1
                if n % 2000 == 0:
                    log(f"{name}: {n} cases, {len(rep.findings)} findings so far")
                if outcome == "refused":
                    refused += 1
                elif outcome == "accepted":
                    accepted += 1
                else:
                    detail = ("over the time limit" if outcome == "timeout" else
                              f"{type(exc).__name__}: {exc}"[:300])
                    if outcome == "bug":
                        tb = traceback.extract_tb(exc.__traceback__)  # type: ignore[union-attr]
                        if tb:
                            fr = tb[-1]
                            detail += f" (at {Path(fr.filename).name}:{fr.lineno}"
                            ours = [x for x in tb if "/profiler/" in x.filename]
                            if ours and ours[-1] is not fr:
                                o = ours[-1]
                                detail += (f", from {Path(o.filename).parent.name}/"
                                           f"{Path(o.filename).name}:{o.lineno}")
                            detail += ")"
                    rep.findings.append(Finding(name, label, "api", detail))
                argv = target.cli(f, case)
                if argv and (k % cli_every == 0 or label.startswith("path:")):
                    # a fresh copy: the API call above may have converted files
                    shutil.rmtree(case)
                    case.mkdir()
                    f = target.place(case, seeds)
                    _materialize(f, payload)
                    cli_n += 1
                    with fifo_watchdog(f if payload == "fifo" else None,
                                       case_timeout) as hung:
                        c_out, detail = _cli(argv, case_timeout)
                    if hung[0]:
                        c_out, detail = "timeout", "blocked on the FIFO (open never returned)"
                    if c_out in ("bug", "timeout"):
                        rep.findings.append(Finding(name, label, "cli", detail or c_out))
            finally:
                shutil.rmtree(case, ignore_errors=True)
        rep.cases[name] = n
        rep.refused[name] = refused
        rep.accepted[name] = accepted
        rep.cli_cases[name] = cli_n
        rep.slowest_s[name] = round(slowest, 3)
        log(f"{name}: {n} cases ({refused} refused, {accepted} accepted), {cli_n} through "
            f"the CLI, slowest {slowest:.2f} s, findings so far {len(rep.findings)}")
    rep.max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rep.seconds = round(time.perf_counter() - t_start, 1)
    return rep


# Rough share of a --quick run's time per reader (measured), to split the
# readers over --jobs processes evenly; an unknown reader counts as 1.
WEIGHT = {"raw": 30, "header": 14, "trace": 8, "timeline": 9, "tensors": 8, "parquet": 6,
          "agg": 4, "hang": 4, "meta": 3, "plan": 1}


def split(readers: list[str], jobs: int) -> list[list[str]]:
    """Readers into `jobs` groups of about equal weight (largest first, each to
    the lightest group)."""
    groups: list[list[str]] = [[] for _ in range(max(1, jobs))]
    load = [0] * len(groups)
    for r in sorted(readers, key=lambda r: -WEIGHT.get(r, 1)):
        i = load.index(min(load))
        groups[i].append(r)
        load[i] += WEIGHT.get(r, 1)
    return [g for g in groups if g]


def run_parallel(readers: list[str], jobs: int, work: Path, **kw: Any) -> Report:
    """`run` over groups of readers in `jobs` forked processes, sharing one set
    of seeds; the reports are added up (RSS: the largest process)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    base = work / "seeds"
    seeds = make_seeds(base)
    t0 = time.perf_counter()
    total = Report()
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
        futs = []
        for i, group in enumerate(split(readers, jobs)):
            sub = work / f"job{i}"
            # each process its own copy of the seeds: some readers convert
            # what they are given in place (a summary-mode rank's files)
            shutil.copytree(base, sub / "seeds", symlinks=True)
            own = {k: (sub / "seeds" / v.relative_to(base) if v.is_relative_to(base) else v)
                   for k, v in seeds.items()}
            futs.append(pool.submit(run, group, work=sub, seeds=own, **kw))
        for f in futs:
            rep = f.result()
            for name in ("cases", "refused", "accepted", "cli_cases", "slowest_s"):
                getattr(total, name).update(getattr(rep, name))
            total.findings.extend(rep.findings)
            total.max_rss_mb = max(total.max_rss_mb, rep.max_rss_mb)
    total.seconds = round(time.perf_counter() - t0, 1)
    return total


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reader", action="append", choices=sorted(TARGETS),
                   help="only this reader (repeatable; default all)")
    p.add_argument("--cases", type=int, default=2000,
                   help="random bit-flip and JSON cases per reader (default 2000)")
    p.add_argument("--trunc-budget", type=int, default=200_000,
                   help="truncation points per file (every byte up to this size)")
    p.add_argument("--cli-every", type=int, default=25,
                   help="every Nth case also through the CLI (path kinds always)")
    p.add_argument("--full-every", type=int, default=64,
                   help="truncations: the whole reader every Nth case, the parser alone "
                        "for the others (default 64)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--case-timeout", type=float, default=20.0)
    p.add_argument("--max-rss-mb", type=float, default=2048.0)
    p.add_argument("--quick", action="store_true",
                   help="the CI subset: 20 random cases per reader, 120 truncation "
                        "points per file, every 300th case through the CLI")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes, each fuzzing some of the readers (default 1)")
    args = p.parse_args(argv)
    if args.quick:
        args.cases, args.trunc_budget, args.cli_every, args.full_every = 20, 120, 300, 256
    readers = args.reader or sorted(TARGETS)
    kw: dict[str, Any] = dict(n_random=args.cases, trunc_budget=args.trunc_budget,
                              cli_every=args.cli_every, seed=args.seed,
                              case_timeout=args.case_timeout, full_every=args.full_every,
                              log=_say)
    with tempfile.TemporaryDirectory(prefix="hvprof-fuzz-") as tmp:
        if args.jobs > 1:
            rep = run_parallel(readers, args.jobs, Path(tmp), **kw)
        else:
            rep = run(readers, work=Path(tmp), **kw)
    if rep.max_rss_mb > args.max_rss_mb:
        rep.findings.append(Finding("*", "*", "api", f"max RSS {rep.max_rss_mb:.0f} MB over "
                                    f"{args.max_rss_mb:.0f} MB"))
    print(f"{sum(rep.cases.values())} cases in {rep.seconds} s, max RSS "
          f"{rep.max_rss_mb:.0f} MB, {len(rep.findings)} findings")
    seen: set[tuple[str, str, str]] = set()
    for f in rep.findings:
        key = (f.reader, f.where, f.what.split(":")[0] + f.what[-40:])
        if key not in seen:
            seen.add(key)
            print("  " + f.line())
    if args.json:
        Path(args.json).write_text(json.dumps(rep.as_json(), indent=1))
    return 1 if rep.findings else 0


if __name__ == "__main__":
    sys.exit(main())
