"""Faults around a profiled job, each one real: an unwritable profile directory
(a path under a regular file; a read-only tmpfs), a disk that fills mid-run (a
400 KiB tmpfs; a per-process file size limit as the fallback that needs no
mount), the directory removed mid-run, a rank that crashes (SIGSEGV from
ctypes, MPI_Abort), SIGTERM and SIGINT, and MPI errors returned to the
application (MPI_ERRORS_RETURN, invalid arguments).

In every case the job's results and exit status are those of the same job
without profiling; rank 0 says once what was lost; what was recorded stays
readable and `profiler merge` reports dropped records and missing or partial
ranks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from conftest import mpirun, profiler_cli, requires_mpi

from profiler.formats.raw import read_header, read_raw

pytestmark = [requires_mpi, pytest.mark.mpi, pytest.mark.timeout(200)]

JOB = r'''
import hashlib, json, os, shutil, sys, time
import numpy as np
from mpi4py import MPI

mode, n_calls, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = MPI.COMM_WORLD
r = c.Get_rank()
prof = os.environ.get("HOROVOD_PROFILE_DIR", "")
a = np.arange(16, dtype=np.float64) + r
b = np.empty_like(a)
h = hashlib.sha256()


def calls(n):
    for i in range(n):
        c.Allreduce(a, b)
        h.update(b.tobytes())
        a[0] = i


if mode == "work":                      # plain work; the directory may vanish midway
    calls(n_calls // 2)
    if os.environ.get("REMOVE_DIR") == "1":
        c.Barrier()
        if r == 0:
            shutil.rmtree(prof)
        c.Barrier()
    calls(n_calls - n_calls // 2)
    with open(os.path.join(out, f"result-{r}"), "w") as f:
        f.write(h.hexdigest())
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))

if mode == "segv":                      # rank 1 crashes in the application
    calls(n_calls)
    time.sleep(0.5)                     # five of the helper's 100 ms flush periods
    calls(n_calls)
    if r == 1:
        import ctypes
        ctypes.string_at(0)             # SIGSEGV
    c.Barrier()                         # rank 0 waits here until mpirun kills it

if mode == "abort":
    calls(n_calls)
    time.sleep(0.1)
    if r == 1:
        c.Abort(5)
    c.Barrier()

if mode == "sigterm":                   # np=1: killed by SIGTERM right after a burst
    import signal
    calls(n_calls)
    time.sleep(0.1)
    t0 = time.monotonic()
    burst = 0
    while time.monotonic() - t0 < 0.05:
        c.Allreduce(a, b)
        burst += 1
    with open(os.path.join(out, "burst"), "w") as f:
        f.write(str(burst))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)

if mode == "sigint":                    # np=1: KeyboardInterrupt through the application
    import signal
    calls(n_calls)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)

if mode in ("threading", "futures"):    # the exit work after Python's shutdown began
    import threading                    # marks threading as shutting down at exit
    if mode == "futures":
        import concurrent.futures.thread  # its exit hook refuses new pool work at exit
    calls(n_calls)

if mode == "errors":                    # MPI_ERRORS_RETURN and invalid arguments
    c.Set_errhandler(MPI.ERRORS_RETURN)
    got = []

    def attempt(name, fn):
        try:
            fn()
            got.append([name, 0, 0, ""])
        except MPI.Exception as e:
            got.append([name, e.Get_error_code(), e.Get_error_class(), e.Get_error_string()])

    attempt("bcast", lambda: c.Bcast(a, root=99))
    attempt("reduce", lambda: c.Reduce(a, b, root=-5))
    attempt("allreduce", lambda: c.Allreduce(a, b, op=MPI.OP_NULL))
    attempt("gather", lambda: c.Gather(a, None, root=7))
    attempt("allreduce", lambda: c.Allreduce(a, b))
    with open(os.path.join(out, f"errors-{r}.json"), "w") as f:
        json.dump(got, f)
'''


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("faultjob") / "job.py"
    p.write_text(JOB)
    return p


def job(script: Path, mode: str, n: int, out: Path, *, np_: int = 2,
        prof: Path | None, extra: dict[str, str] | None = None,
        fsize_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """The job with (prof set) or without profiling; never raises on its exit status.
    fsize_limit: every file a rank writes stops growing there (RLIMIT_FSIZE, with
    SIGXFSZ ignored: writes past it fail with EFBIG); mpirun itself is not limited."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(extra or {})
    if prof is not None:
        env.update({"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                    "HOROVOD_PROFILE_MERGE_TIMEOUT": "20"})
    argv = [sys.executable, str(script), mode, str(n), str(out)]
    if fsize_limit is not None:
        argv = [sys.executable, "-c", LIMITED, str(fsize_limit), *argv]
    return mpirun(np_, argv, env=env, cwd=out, check=False, timeout=150)


# exec the rank under a file size limit (the start-up hook runs in the exec'd process)
LIMITED = ("import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
           "os.execv(sys.argv[2], sys.argv[2:])")


def results(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(out.glob("result-*"))}


def ours(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("horovod-profiler")]


@pytest.fixture(scope="module")
def reference(script: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The unprofiled job: results per rank and exit status (3 passed through)."""
    out = tmp_path_factory.mktemp("ref")
    p = job(script, "work", N_WORK, out, prof=None, extra={"EXIT_CODE": "3"})
    assert p.returncode == 3, p.stderr
    return {"rc": p.returncode, "results": results(out)}


N_WORK = 20000


@contextlib.contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path | None]:
    """A tmpfs mounted at `where` (None when this machine does not allow mount)."""
    where.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)
        if os.path.ismount(where):
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


# ---------------------------------------------------------------------------
# the profile directory cannot be written
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["under-a-file", "read-only-tmpfs"])
def test_unwritable_directory(script: Path, reference: dict, tmp_path: Path, how: str) -> None:
    with contextlib.ExitStack() as stack:
        if how == "under-a-file":
            (tmp_path / "a-file").write_text("x")  # root ignores modes: ENOTDIR does not
            prof = tmp_path / "a-file" / "prof"
        else:
            mnt = stack.enter_context(tmpfs(tmp_path / "ro", "size=64k,ro"))
            if mnt is None:
                pytest.skip("mount is not permitted here (the under-a-file case covers it)")
            prof = mnt / "prof"
        out = tmp_path / "out"
        p = job(script, "work", N_WORK, out, prof=prof, extra={"EXIT_CODE": "3"})
        assert p.returncode == reference["rc"]
        assert results(out) == reference["results"]
        assert "Traceback" not in p.stderr
        # one line for the job, from rank 0: the reason and how many ranks lost
        lines = ours(p.stderr)
        assert len(lines) == 1, p.stderr
        assert lines[0].startswith(f"horovod-profiler: cannot create {prof}/raw (")
        assert lines[0].endswith("): profiling is off for every rank (2)"), lines[0]
        assert not prof.exists()


@pytest.mark.parametrize("bad_rank", [1, 0])
def test_one_rank_cannot_open_its_file(script: Path, reference: dict, tmp_path: Path,
                                       bad_rank: int) -> None:
    """The directory is fine but one rank's raw file cannot be created (a directory
    stands in its place): the job neither hangs (the ranks that record and the one
    that does not meet in the same collectives at MPI_Init and MPI_Finalize) nor
    changes; rank 0 names the rank once; the other rank records every call."""
    prof = tmp_path / "prof"
    blocker = prof / "raw" / f"rank-{bad_rank:05d}.hvprof"
    blocker.mkdir(parents=True)
    out = tmp_path / "out"
    p = job(script, "work", N_WORK, out, prof=prof, extra={"EXIT_CODE": "3"})
    assert p.returncode == reference["rc"], p.stderr
    assert results(out) == reference["results"]
    assert "Traceback" not in p.stderr
    lines = ours(p.stderr)
    said = [x for x in lines if "profiling is off" in x]
    assert said == [f"horovod-profiler: cannot write {blocker} (Is a directory): profiling is "
                    f"off for rank {bad_rank}"], p.stderr
    good = 1 - bad_rank
    raw = read_raw(prof / "raw" / f"rank-{good:05d}.hvprof")
    assert len(raw.records) == N_WORK + 2 and raw.header["dropped_records"] == 0
    assert blocker.is_dir() and not any(blocker.iterdir())  # nothing written into it


# ---------------------------------------------------------------------------
# the disk fills mid-run
# ---------------------------------------------------------------------------
def check_drops(prof: Path, stderr: str, reason: str) -> dict[int, int]:
    """Every call is recorded or counted as dropped, exactly; rank 0 said so once."""
    dropped = {}
    for r in (0, 1):
        raw = read_raw(prof / "raw" / f"rank-{r:05d}.hvprof")
        h = raw.header
        assert "truncated" in h["state_names"], h["state_names"]
        recorded = len(raw.records)
        # init + N_WORK allreduces + finalize: nothing silently lost
        assert recorded + h["dropped_records"] == N_WORK + 2, (r, recorded, h)
        assert h["dropped_records"] > 0
        dropped[r] = h["dropped_records"]
    said = [x for x in ours(stderr) if "records were dropped" in x]
    assert len(said) == 1, stderr
    m = re.search(r"(\d+) records were dropped: 2 of 2 rank\(s\) could not write \((.*)\); "
                  r"see ", said[0])
    assert m is not None, said[0]
    n = int(m.group(1))
    total = sum(dropped.values())
    # counted at MPI_Finalize: each rank's finalize record may still be in flight
    assert total - 2 <= n <= total, (n, total)
    assert m.group(2) == reason, said[0]  # the real errno, not a guess
    # the moment it happens only rank 0 says so: one line, not one per rank
    at_once = [x for x in ours(stderr) if "further records are dropped" in x]
    assert len(at_once) == 1 and at_once[0].startswith("horovod-profiler: rank 0: cannot "
                                                       f"write {prof}/raw/rank-00000.hvprof "
                                                       f"({reason})"), stderr
    return dropped


def running(pid: int) -> bool:
    """The process exists and is not a zombie (its parent may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def merge_reports_drops(prof: Path, dropped: dict[int, int], *, converts: bool) -> None:
    p = profiler_cli("merge", str(prof))
    assert p.returncode == 0, p.stderr
    total = sum(dropped.values())
    assert f"{total} records dropped" in p.stdout, p.stdout
    for r, n in dropped.items():  # said per rank when merge converts the raw files
        assert (f"rank {r}: {n} record(s) dropped by the writer" in p.stderr) == converts
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    assert {m["rank"]: m["dropped"] for m in meta["ranks"]} == dropped
    s = profiler_cli("summarize", str(prof / "trace.json"))
    assert s.returncode == 0, s.stderr
    assert f"dropped records: {total} calls not recorded" in s.stdout, s.stdout


def test_disk_full_tmpfs(script: Path, reference: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with tmpfs(tmp_path / "small", "size=400k") as mnt:
        if mnt is None:
            pytest.skip("mount is not permitted here (test_disk_full_fsize_limit covers it)")
        prof = mnt / "prof"
        p = job(script, "work", N_WORK, out, prof=prof, extra={"EXIT_CODE": "3"})
        assert p.returncode == reference["rc"]
        assert results(out) == reference["results"]
        assert "Traceback" not in p.stderr
        dropped = check_drops(prof, p.stderr, "No space left on device")
        # nothing fits for the dataset: rank 0 alone says what is kept, at once
        kept = [x for x in ours(p.stderr) if "raw files are kept" in x]
        assert len(kept) == 1 and "No space left on device" in kept[0], p.stderr
        assert "gave up waiting" not in p.stderr
        copy = tmp_path / "copy"
        shutil.copytree(prof, copy)
    merge_reports_drops(copy, dropped, converts=True)


@pytest.mark.horovod
@pytest.mark.full  # test_disk_full_tmpfs and _fsize_limit take the same write path
def test_horovod_training_on_a_full_disk(tmp_path: Path) -> None:
    """A real Horovod job (the bundled benchmark, Horovod's timeline written into
    the profile directory too) whose profile directory fills up: it trains to
    the same final weights as without profiling, exits 0, and the profiler
    speaks through rank 0 only."""
    pytest.importorskip("horovod.torch")
    torch = pytest.importorskip("torch")
    bench = [sys.executable, "-m", "profiler.workloads.train_bench", "--model", "cnn",
             "--batch-size", "8", "--image-size", "32", "--num-warmup-batches", "1",
             "--num-batches-per-iter", "4", "--num-iters", "3", "--quiet"]
    weights = {}
    with tmpfs(tmp_path / "small", "size=400k") as mnt:
        if mnt is None:
            pytest.skip("mount is not permitted here")
        for name, env in (("plain", {}), ("profiled", {
                "HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(mnt / "prof"),
                "HOROVOD_PROFILE_MERGE_TIMEOUT": "20"})):
            path = tmp_path / f"{name}-{{rank}}.pt"
            p = mpirun(2, [*bench, "--save-weights", str(path)], env=env, cwd=tmp_path,
                       check=False, timeout=240)
            assert p.returncode == 0, p.stderr[-3000:]
            assert "Traceback" not in p.stderr
            weights[name] = [torch.load(str(path).format(rank=r)) for r in (0, 1)]
            if name == "profiled":
                lines = ours(p.stderr)
                assert lines, p.stderr[-3000:]
                # at once by rank 0 (if its own file filled), then once for the job
                assert all(x.startswith(("horovod-profiler: rank 0: ",
                                         "horovod-profiler: error: cannot write the dataset"))
                           or "records were dropped:" in x for x in lines), lines
                assert sum("records were dropped:" in x for x in lines) == 1, lines
                total = sum(read_header(mnt / "prof" / "raw" / f"rank-{r:05d}.hvprof")
                            ["dropped_records"] for r in (0, 1))
                assert total > 0
    for r in (0, 1):
        a, b = weights["plain"][r], weights["profiled"][r]
        assert list(a) == list(b)
        for k in a:
            assert a[k].numpy().tobytes() == b[k].numpy().tobytes(), (r, k)


def test_disk_full_fsize_limit(script: Path, reference: dict, tmp_path: Path) -> None:
    """No mount needed: every file the ranks write is limited to 320 KiB (RLIMIT_FSIZE,
    SIGXFSZ ignored: writes past it fail with EFBIG, like a full disk)."""
    out = tmp_path / "out"
    prof = tmp_path / "prof"
    # a small trace.json fits under the limit: rank 0's exit work completes
    p = job(script, "work", N_WORK, out, prof=prof, fsize_limit=320 << 10,
            extra={"EXIT_CODE": "3", "HOROVOD_PROFILE_TRACE_EVENTS": "100"})
    assert p.returncode == reference["rc"], p.stderr
    assert results(out) == reference["results"]
    assert "Traceback" not in p.stderr
    dropped = check_drops(prof, p.stderr, "File too large")
    # rank 1's status 3 makes mpirun end the job: rank 0 is either done merging
    # or ended while its merge (its own session) goes on, and the line says which
    line = [x for x in ours(p.stderr) if "trace written to" in x or "left running" in x]
    assert len(line) == 1, p.stderr
    if "left running" in line[0]:
        m = re.search(r"\(pid (\d+), left running\): (\S+) appears when it ends", line[0])
        assert m is not None and m.group(2) == f"{prof}/trace.json", line[0]
        deadline = time.time() + 90
        while running(int(m.group(1))) and time.time() < deadline:
            time.sleep(0.2)
        assert (prof / "trace.json").is_file(), line[0]
    else:
        assert f"{sum(dropped.values())} records dropped" in line[0], line[0]
    merge_reports_drops(prof, dropped, converts=False)


def test_summarize_reports_dropped_records(tmp_path: Path) -> None:
    from rawgen import simple_rank

    prof = tmp_path / "prof"
    simple_rank(n=10, dropped=1234).write(prof / "raw" / "rank-00000.hvprof")
    assert profiler_cli("merge", str(prof)).returncode == 0
    p = profiler_cli("summarize", str(prof / "trace.json"))
    assert p.returncode == 0
    assert "1234" in p.stdout and "dropped" in p.stdout


# ---------------------------------------------------------------------------
# the directory is removed mid-run
# ---------------------------------------------------------------------------
def test_directory_removed_mid_run(script: Path, reference: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prof = tmp_path / "prof"
    p = job(script, "work", N_WORK, out, prof=prof,
            extra={"EXIT_CODE": "3", "REMOVE_DIR": "1"})
    assert p.returncode == reference["rc"]
    assert results(out) == reference["results"]
    assert "Traceback" not in p.stderr
    assert ours(p.stderr) == [
        f"horovod-profiler: warning: the profile directory {prof} was removed while the job "
        "ran: the records of this job are lost (no dataset, no trace)"]
    assert not prof.exists()


# ---------------------------------------------------------------------------
# crashes and signals
# ---------------------------------------------------------------------------
N_CRASH = 300


def allreduce_seqs(prof: Path, rank: int) -> list[int]:
    raw = read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof")
    assert raw.problems == []
    ops = raw.records["op"]
    return sorted(int(s) for s in raw.records["seq"][ops == 1])


@pytest.mark.parametrize("mode", ["segv", "abort"])
def test_crashed_rank_leaves_readable_records(script: Path, tmp_path: Path, mode: str) -> None:
    ref = job(script, mode, N_CRASH, tmp_path / "ref", prof=None)
    prof = tmp_path / "prof"
    p = job(script, mode, N_CRASH, tmp_path / "out", prof=prof)
    assert p.returncode == ref.returncode != 0  # the same failure, passed through
    n_calls = N_CRASH * (2 if mode == "segv" else 1)
    recorded = 0
    for r in (0, 1):
        seqs = allreduce_seqs(prof, r)
        assert seqs == list(range(1, len(seqs) + 1))  # a gap-free prefix of the calls
        if mode == "segv" and r == 1:
            # crashed right after its last burst: what came before the pause is
            # there; of the burst, at most the last flush period's worth is lost
            assert N_CRASH <= len(seqs) <= n_calls
        else:  # it sat in a barrier (or slept) long enough for the helper to flush
            assert len(seqs) == n_calls
        recorded += len(seqs) + 1  # + MPI_Init
        h = read_header(prof / "raw" / f"rank-{r:05d}.hvprof")
        assert not {"finalized", "closed"} & set(h["state_names"])
    m = profiler_cli("merge", str(prof))
    assert m.returncode == 0, m.stderr
    assert "partial ranks (killed): 0-1" in m.stdout
    assert f"(2 ranks, {recorded} calls" in m.stdout, m.stdout
    # a missing rank is reported too
    (prof / "raw" / "rank-00001.hvprof").unlink()
    for f in (prof / "ranks").glob("rank-00001.*"):
        f.unlink()
    m = profiler_cli("merge", str(prof))
    assert m.returncode == 0 and "missing ranks: 1" in m.stdout, m.stdout


def test_sigterm_keeps_records_up_to_the_signal(script: Path, tmp_path: Path) -> None:
    ref = job(script, "sigterm", 2000, tmp_path / "ref", np_=1, prof=None)
    prof = tmp_path / "prof"
    out = tmp_path / "out"
    p = job(script, "sigterm", 2000, out, np_=1, prof=prof)
    assert p.returncode == ref.returncode != 0
    burst = int((out / "burst").read_text())
    seqs = allreduce_seqs(prof, 0)
    n = len(seqs)
    assert seqs == list(range(1, n + 1))  # a prefix of the calls, no holes
    # every call made before the 100 ms pause is on disk; of the 50 ms burst right
    # before the signal, at most the last flush period's worth is lost
    assert 2000 <= n <= 2000 + burst
    lost = 2000 + burst - n
    assert lost <= burst
    m = profiler_cli("merge", str(prof))
    assert m.returncode == 0 and "partial ranks (killed): 0" in m.stdout, m.stdout


def test_sigint_flushes_everything(script: Path, tmp_path: Path) -> None:
    ref = job(script, "sigint", 500, tmp_path / "ref", np_=1, prof=None)
    prof = tmp_path / "prof"
    p = job(script, "sigint", 500, tmp_path / "out", np_=1, prof=prof)
    assert p.returncode == ref.returncode != 0
    assert "KeyboardInterrupt" in p.stderr  # the application's own traceback
    # Python's exit path ran: every call recorded, MPI finalized, trace written
    assert allreduce_seqs(prof, 0) == list(range(1, 501))
    h = read_header(prof / "raw" / "rank-00000.hvprof")
    assert "closed" in h["state_names"]
    assert any("trace written to" in x for x in ours(p.stderr))


# ---------------------------------------------------------------------------
# MPI errors returned to the application
# ---------------------------------------------------------------------------
def test_ctrl_c_during_the_exit_work_still_gives_one_line_and_the_trace(
        tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) after the job's last call, while its exit work
    converts 300,000 calls: the exit status is the job's (0), the library's
    own exit work still builds the trace with every call, and the one line
    is its "trace written" (before, "error: KeyboardInterrupt" came first)."""
    calls = 300_000
    code = ("import numpy as np\n"
            "from mpi4py import MPI\n"
            "a = np.zeros(1); b = np.zeros(1)\n"
            f"for _ in range({calls}): MPI.COMM_SELF.Allreduce(a, b)\n")
    prof = tmp_path / "prof"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_PROFILE")}
    env.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof))
    p = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    raw = prof / "raw" / "rank-00000.hvprof"
    deadline = time.time() + 120
    closed = False
    while not closed and time.time() < deadline and p.poll() is None:
        with contextlib.suppress(Exception):
            closed = "closed" in read_header(raw)["state_names"]
        time.sleep(0.01)
    assert closed, "the exit work never started"
    time.sleep(0.3)  # into the conversion (past the rank's facts, which take anything)
    assert not (prof / "ranks" / "rank-00000.parquet").exists()  # still converting
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=150)
    assert p.returncode == 0, err[-3000:]
    assert ours(err) == [f"horovod-profiler: trace written to {prof}/trace.json (1 ranks, "
                         f"{calls + 2} calls)"], \
        err[-3000:]
    assert allreduce_seqs(prof, 0) == list(range(calls))  # COMM_SELF numbers from 0


def test_mpi_errors_pass_through_and_are_recorded(script: Path, tmp_path: Path) -> None:
    ref_out, out, prof = tmp_path / "ref", tmp_path / "out", tmp_path / "prof"
    ref = job(script, "errors", 0, ref_out, prof=None)
    p = job(script, "errors", 0, out, prof=prof)
    assert ref.returncode == p.returncode == 0, p.stderr
    for r in (0, 1):
        want = json.loads((ref_out / f"errors-{r}.json").read_text())
        got = json.loads((out / f"errors-{r}.json").read_text())
        assert got == want  # codes, classes and strings exactly as without profiling
        assert [g[1] != 0 for g in got] == [True, True, True, True, False]
        df = pd.read_parquet(prof / "ranks" / f"rank-{r:05d}.parquet")
        calls = df[df["op"].isin(["bcast", "reduce", "allreduce", "gather"])]
        assert calls["op"].astype(str).tolist() == [g[0] for g in got]
        assert calls["rc"].tolist() == [g[1] for g in got]  # the call's own error code
        assert calls["seq"].tolist() == [1, 2, 3, 4, 5]
        assert calls["root"].tolist()[:2] == [99, -5]


# ---------------------------------------------------------------------------
# the exit work itself, in jobs that imported threading / concurrent.futures
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["threading", "futures"])
def test_exit_work_survives_interpreter_shutdown(script: Path, tmp_path: Path,
                                                 mode: str) -> None:
    prof = tmp_path / "prof"
    n = 6000  # a frame large enough for pyarrow to want a thread pool
    p = job(script, mode, n, tmp_path / "out", np_=1, prof=prof)
    assert p.returncode == 0, p.stderr
    assert ours(p.stderr) == [f"horovod-profiler: trace written to {prof}/trace.json "
                              f"(1 ranks, {n + 2} calls)"], p.stderr
