"""trace.json at exit for programs without Python (hooks/exitmerge.c): a C
program under LD_PRELOAD and real mpirun leaves a merged trace with its exact
counts and one line on stderr, keeps its exit status (also 3, after
MPI_Finalize), waits for a rank that ends later; a Python job still merges
once; a merge that fails (unwritable output, a broken interpreter) says one
line and keeps the raw files."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, base_env, mpich_library, profiler_cli, requires_mpi

from profiler.collect import native
from profiler.formats import record as F
from profiler.formats.raw import read_raw

pytestmark = [requires_mpi, pytest.mark.mpi, pytest.mark.timeout(180)]

N = 7  # allreduces per rank (8 bytes each), then one barrier
PREFIX = "horovod-profiler: "


@pytest.fixture(scope="module")
def prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = "mpicc.openmpi" if shutil.which("mpicc.openmpi") else "mpicc"
    exe = tmp_path_factory.mktemp("exitmerge") / "exit_status"
    subprocess.run([cc, "-O1", "-Wall", "-Wextra", "-Werror",
                    str(ROOT / "tests" / "c" / "exit_status.c"), "-o", str(exe)], check=True)
    return exe


def run_c(prog: Path, prof: Path, cwd: Path, status: int = 0, late_ms: int = 0, *,
          lib: str | None = None, run: str = "mpirun",
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mpirun -n 2 prog N STATUS LATE_MS` with the library preloaded into the ranks."""
    lib = lib or native.library_path()
    ranks_env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof), **(env or {})}
    if run == "mpirun.mpich":
        fwd = ["-genvlist", ",".join([*ranks_env, "LD_PRELOAD"])]
        full = base_env(**ranks_env, LD_PRELOAD=lib)
    else:  # Open MPI: only the ranks get LD_PRELOAD, not the launcher
        fwd = ["-x", f"LD_PRELOAD={lib}"] + [a for k in ranks_env for a in ("-x", k)]
        full = base_env(**ranks_env)
    cmd = [run, "-n", "2", *fwd, str(prog), str(N), str(status), str(late_ms)]
    return subprocess.run(cmd, env=full, cwd=cwd, capture_output=True, text=True, timeout=150)


def said(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith(PREFIX)]


def counts_in_trace(trace: Path) -> dict[int, collections.Counter[tuple[str, int]]]:
    from profiler.analysis import load

    df = load(trace)
    out: dict[int, collections.Counter[tuple[str, int]]] = collections.defaultdict(
        collections.Counter)
    for r, op, b in zip(df["rank"], df["op"].astype(str), df["bytes"]):
        out[int(r)][(op, int(b))] += 1
    return dict(out)


def assert_exact(trace: Path) -> None:
    meta = json.loads(trace.read_bytes())["horovod_profiler"]
    assert meta["world_size"] == 2 and meta["missing_ranks"] == [] == meta["partial_ranks"]
    got = counts_in_trace(trace)
    for rank in (0, 1):
        c = got[rank]
        assert c[("allreduce", 8)] == N and c[("barrier", 0)] == 1, (rank, c)
        assert sum(n for (op, _), n in c.items() if op not in ("init", "finalize")) == N + 1


def assert_raw_exact(prof: Path, *, aborted: bool = False) -> None:
    """Every call in each rank's raw file, the file closed at exit.  aborted:
    a rank exited non-zero, so Open MPI's mpirun may end the other after its
    MPI_Finalize (everything flushed then) and before its exit closes it."""
    for rank in (0, 1):
        raw = read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert raw.state & (F.STATE_FINALIZED if aborted and rank else F.STATE_CLOSED), raw.state
        ops = collections.Counter(F.op_name(int(o)) for o in raw.records["op"])
        assert ops["allreduce"] == N and ops["barrier"] == 1


@pytest.mark.parametrize("late_ms", [0, 1500], ids=["together", "rank1-late"])
def test_c_program_gets_its_trace_at_exit(prog: Path, tmp_path: Path, late_ms: int) -> None:
    """rank1-late: rank 1 exits 1.5 s after rank 0 reached its exit; rank 0
    waits for it (its raw file's state), so nothing of rank 1 is partial."""
    prof = tmp_path / "prof"
    proc = run_c(prog, prof, tmp_path, 0, late_ms)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("RESULT OK") == 2
    assert said(proc) == [f"{PREFIX}trace written to {prof}/trace.json (2 ranks, "
                          f"{2 * (N + 3)} calls)"], proc.stderr
    assert_exact(prof / "trace.json")
    assert_raw_exact(prof)
    # the program's command and settings, read by the merge from rank 0's /proc
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    assert meta["command"] == [str(prog), str(N), "0", str(late_ms)]
    assert meta["executable"] == str(prog)
    assert meta["env"]["HOROVOD_PROFILE"] == "1"
    assert meta["env"]["HOROVOD_PROFILE_DIR"] == str(prof)


def test_exit_status_3_after_finalize_is_kept(prog: Path, tmp_path: Path) -> None:
    """Open MPI aborts the job when a rank exits non-zero: rank 0, still
    waiting for its merge, is ended by mpirun; the merge (its own session)
    goes on and the one line says so.  Either way: status 3, one line, the trace."""
    prof = tmp_path / "prof"
    proc = run_c(prog, prof, tmp_path, 3)
    assert proc.returncode == 3, proc.stderr
    lines = said(proc)
    assert len(lines) == 1, proc.stderr
    assert ("trace written to" in lines[0]
            or f"left running): {prof}/trace.json appears when it ends" in lines[0]), lines
    deadline = time.time() + 60
    while not (prof / "trace.json").is_file() and time.time() < deadline:
        time.sleep(0.2)  # written whole (a temporary file renamed)
    assert_exact(prof / "trace.json")


def test_rank0_ended_just_before_its_merge_starts_still_says_so(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A launcher's SIGTERM after rank 0 closed its raw file and before its
    merge started (tests/c/exit_status.c, -DTERM_BEFORE_MERGE) waits for the
    start: the rank is still ended by it, says the one line, and the merge,
    left running, writes the whole trace.  Before, the rank died silently
    and no trace came (seen in CI when rank 1's exit 3 made mpirun abort)."""
    cc = "mpicc.openmpi" if shutil.which("mpicc.openmpi") else "mpicc"
    exe = tmp_path_factory.mktemp("exitterm") / "exit_term"
    subprocess.run([cc, "-O1", "-Wall", "-Wextra", "-Werror", "-DTERM_BEFORE_MERGE",
                    "-rdynamic", str(ROOT / "tests" / "c" / "exit_status.c"), "-o", str(exe),
                    "-ldl"], check=True)
    prof = tmp_path / "prof"
    proc = run_c(exe, prof, tmp_path, 0)
    assert proc.returncode != 0 and "exited on signal 15" in proc.stderr, proc.stderr
    lines = said(proc)
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(
        re.escape(f"{PREFIX}this process was ended while the trace was being built (pid ")
        + r"\d+" + re.escape(f", left running): {prof}/trace.json appears when it ends; "
                             f"or build it with: profiler merge {prof}"), lines[0]), lines
    deadline = time.time() + 60
    while not (prof / "trace.json").is_file() and time.time() < deadline:
        time.sleep(0.2)
    assert_exact(prof / "trace.json")


def test_mpich(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """MPICH's launcher (hydra), a library built against MPICH with the
    interpreter recorded beside it as setup.py does; exit status 3 kept."""
    cc, run = "mpicc.mpich", "mpirun.mpich"
    if shutil.which(cc) is None or shutil.which(run) is None:
        pytest.skip("MPICH is not installed")
    lib = mpich_library(tmp_path_factory)
    exe = tmp_path / "exit_status"
    subprocess.run([cc, "-O1", str(ROOT / "tests" / "c" / "exit_status.c"), "-o", str(exe)],
                   check=True)
    prof = tmp_path / "prof"
    proc = run_c(exe, prof, tmp_path, 3, lib=str(lib), run=run)
    assert proc.returncode == 3, proc.stderr
    assert said(proc) == [f"{PREFIX}trace written to {prof}/trace.json (2 ranks, "
                          f"{2 * (N + 3)} calls)"], proc.stderr
    assert_exact(prof / "trace.json")


def test_python_job_merges_once(tmp_path: Path) -> None:
    """An mpi4py job under HOROVOD_PROFILE=1 *and* LD_PRELOAD: Python's exit
    handler merges and tells the library, which does not merge again."""
    prof = tmp_path / "prof"
    code = ("from mpi4py import MPI\n"
            "for _ in range(5): MPI.COMM_WORLD.Barrier()\n")
    ranks_env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)}
    cmd = ["mpirun", "-n", "2", "-x", f"LD_PRELOAD={native.library_path()}",
           *[a for k in ranks_env for a in ("-x", k)], sys.executable, "-c", code]
    proc = subprocess.run(cmd, env=base_env(**ranks_env), cwd=tmp_path, capture_output=True,
                          text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    lines = said(proc)
    assert len(lines) == 1 and lines[0].startswith(f"{PREFIX}trace written to"), proc.stderr
    got = counts_in_trace(prof / "trace.json")
    assert got[0][("barrier", 0)] == got[1][("barrier", 0)] == 5


def _lib_copy(tmp_path: Path, python: str) -> str:
    d = tmp_path / "lib"
    d.mkdir()
    shutil.copy(native.library_path(), d / "libhvprof.so")
    (d / "libhvprof.python").write_text(python + "\n")
    return str(d / "libhvprof.so")


@pytest.mark.parametrize("fault", ["trace-unwritable", "interpreter-missing",
                                   "interpreter-fails"])
def test_failed_merge_keeps_raw_files_and_says_one_line(prog: Path, tmp_path: Path,
                                                        fault: str) -> None:
    prof = tmp_path / "prof"
    lib = None
    if fault == "trace-unwritable":
        (prof / "trace.json").mkdir(parents=True)  # root writes anywhere: a directory
    elif fault == "interpreter-missing":
        lib = _lib_copy(tmp_path, "/nonexistent/python3")
    else:
        lib = _lib_copy(tmp_path, shutil.which("false") or "/bin/false")
    proc = run_c(prog, prof, tmp_path, 0, lib=lib)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("RESULT OK") == 2
    lines = said(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{PREFIX}error: cannot build the trace at exit: ")
    assert lines[0].endswith(f"the raw files are kept: build it with: profiler merge {prof}")
    expect = {"trace-unwritable": "IsADirectoryError", "interpreter-missing":
              "cannot start /nonexistent/python3 (No such file or directory)",
              "interpreter-fails": "exited with status 1"}[fault]
    assert expect in lines[0], lines
    assert_raw_exact(prof)
    if fault == "interpreter-fails":  # the records are all there for a later merge
        m = profiler_cli("merge", str(prof), cwd=tmp_path)
        assert m.returncode == 0, m.stderr
        assert_exact(prof / "trace.json")


def test_closed_ranks_on_other_hosts_are_converted_at_once(tmp_path: Path) -> None:
    """Without Python no rank converts its own file: the exit merge converts a
    CLOSED file at once, also one written on another host (whose pid cannot be
    checked), instead of waiting out the merge timeout for it."""
    import rawgen

    from profiler.postjob.merge import wait_and_merge

    d = tmp_path / "job"
    for r, host in enumerate(["here", "another-host"]):
        rawgen.simple_rank(r, 2, n=5, hostname=host, pid=1, state=0xF).write(
            d / "raw" / f"rank-{r:05d}.hvprof")
    t0 = time.monotonic()
    res = wait_and_merge(d, world_size=2, own_rank=0, timeout=30)
    assert time.monotonic() - t0 < 10
    assert res.ranks == [0, 1] and res.partial_ranks == [] == res.missing_ranks
    assert (d / "ranks" / "rank-00001.parquet").is_file()


def test_a_rank_that_converts_its_own_file_is_waited_for(tmp_path: Path) -> None:
    """The other side: a closed file whose header says its rank converts it
    (a Python rank, still converting) is not converted by the exit merge while
    its process lives; the merge waits for that rank's dataset (here, until
    the timeout) and converts it only then."""
    import rawgen

    from profiler.postjob.merge import wait_and_merge

    d = tmp_path / "job"
    for r in range(2):
        rawgen.simple_rank(r, 2, n=5, hostname=socket.gethostname(), pid=os.getpid(),
                           state=0xF, self_converts=1).write(d / "raw" / f"rank-{r:05d}.hvprof")
    t0 = time.monotonic()
    res = wait_and_merge(d, world_size=2, own_rank=0, timeout=1.5, poll=0.05)
    assert time.monotonic() - t0 >= 1.5  # waited: rank 1 was not converted for it
    assert res.ranks == [0, 1]  # and then merged what is there


@pytest.mark.parametrize("elastic", [True, False], ids=["elastic", "not-elastic"])
def test_a_worker_added_later_is_waited_for_in_an_elastic_job(tmp_path: Path,
                                                               elastic: bool) -> None:
    """An elastic job's files are per process: a worker added later holds a
    number past the world size (file 2 of a job of 2).  Where its file has an
    epochs sidecar, the exit merge waits for it (here it converts itself on
    the merge's second poll) and merges it; a file past the world size
    without one (not elastic) is not waited for: the merge converts it as
    it finds it, as before."""
    import rawgen

    from profiler.formats import epochs as E
    from profiler.postjob.convert import convert_raw
    from profiler.postjob.merge import wait_and_merge

    d = tmp_path / "job"
    raws = [d / "raw" / f"rank-{n:05d}.hvprof" for n in range(3)]
    for n, raw in enumerate(raws):
        rawgen.simple_rank(n, 2, n=5, hostname=socket.gethostname(), pid=os.getpid(),
                           state=0xF, self_converts=1).write(raw)
        if elastic:
            E.append(raw, {"event": "init", "t0_ns": 1, "t1_ns": 2, "rank": min(n, 1),
                           "size": 2, "local_rank": min(n, 1), "pid": os.getpid()})
    for raw in raws[:2]:
        convert_raw(raw)
    polls: list[float] = []

    def sleep(s: float) -> None:  # file 2's worker finishes its own conversion
        polls.append(s)
        if len(polls) == 2:
            convert_raw(raws[2])

    t0 = time.monotonic()
    res = wait_and_merge(d, world_size=2, own_rank=0, timeout=20, poll=0.01, sleep=sleep)
    assert time.monotonic() - t0 < 10
    if elastic:
        assert len(polls) == 2 and res.converted == []  # waited, converted nothing itself
        assert (d / "ranks" / "rank-00002.parquet").is_file()
    else:
        assert polls == [] and res.converted == [2]  # not waited for: converted at once


def test_merge_at_exit_can_be_left_for_later(prog: Path, tmp_path: Path) -> None:
    """HOROVOD_PROFILE_MERGE=0: no trace.json at exit, one line that says where
    the files are and the command that builds it, the program's status kept;
    `profiler merge` then builds the same exact trace.  A C program and a
    Python one (whose ranks still convert their own files)."""
    from conftest import profiler_cli

    prof = tmp_path / "c"
    # rank 1 sleeps after MPI_Finalize: rank 0's exit 3 always comes first, so
    # mpirun's abort may end rank 1 but never rank 0 before its one line
    proc = run_c(prog, prof, tmp_path, 3, 1000, env={"HOROVOD_PROFILE_MERGE": "0"})
    assert proc.returncode == 3, proc.stderr
    assert said(proc) == [f"{PREFIX}no trace at exit (HOROVOD_PROFILE_MERGE=0): the raw "
                          f"files are in {prof}/raw; build it with: profiler merge {prof}"]
    assert not (prof / "trace.json").exists()
    assert_raw_exact(prof, aborted=True)
    p = profiler_cli("merge", str(prof))
    assert p.returncode == 0, p.stderr
    assert_exact(prof / "trace.json")

    prof = tmp_path / "py"
    code = "from mpi4py import MPI\nfor _ in range(5): MPI.COMM_WORLD.Barrier()\n"
    ranks_env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                 "HOROVOD_PROFILE_MERGE": "0"}
    cmd = ["mpirun", "-n", "2", *[a for k in ranks_env for a in ("-x", k)], sys.executable,
           "-c", code]
    proc = subprocess.run(cmd, env=base_env(**ranks_env), cwd=tmp_path, capture_output=True,
                          text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    assert said(proc) == [f"{PREFIX}no trace at exit (HOROVOD_PROFILE_MERGE=0): each rank's "
                          f"dataset is in {prof}/ranks; build it with: profiler merge {prof}"]
    assert not (prof / "trace.json").exists()
    assert sorted(p.name for p in (prof / "ranks").glob("rank-*.parquet")) == [
        "rank-00000.parquet", "rank-00001.parquet"]
    p = profiler_cli("merge", str(prof))
    assert p.returncode == 0, p.stderr
    got = counts_in_trace(prof / "trace.json")
    assert got[0][("barrier", 0)] == got[1][("barrier", 0)] == 5


def _exit3_job(tmp_path: Path, prof: Path, calls: int, extra: int, *, busy_rank: int,
               barrier: bool) -> subprocess.CompletedProcess[str]:
    """A profiled 2-rank Python job under mpirun: `calls` allreduces on
    COMM_WORLD, `extra` more on COMM_SELF by busy_rank, a barrier if asked,
    then rank 1 exits with status 3 (mpirun aborts the job)."""
    code = ("import sys\n"
            "import numpy as np\n"
            "from mpi4py import MPI\n"
            "c = MPI.COMM_WORLD\n"
            "a = np.zeros(1); b = np.zeros(1)\n"
            f"for _ in range({calls}): c.Allreduce(a, b)\n"
            f"if c.Get_rank() == {busy_rank}:\n"
            f"    for _ in range({extra}): MPI.COMM_SELF.Allreduce(a, b)\n"
            + ("c.Barrier()\n" if barrier else "")
            + "if c.Get_rank() == 1:\n"
            "    sys.exit(3)\n")
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)}
    return subprocess.run(["mpirun", "-n", "2", *[a for k in env for a in ("-x", k)],
                           sys.executable, "-c", code], env=base_env(**env), cwd=tmp_path,
                          capture_output=True, text=True, timeout=150)


def test_python_job_aborted_by_mpirun_still_gets_its_trace(tmp_path: Path) -> None:
    """mpirun aborts the job when a rank exits non-zero.  Rank 1 records far
    more calls than rank 0 (on MPI_COMM_SELF), so rank 0 has converted its own
    file and is merging (seconds: rank 1's calls) when rank 1, done with its
    own file, exits with status 3 and mpirun ends rank 0.  The merge runs in a
    session of its own, goes on, and trace.json appears with every call of
    both ranks; one line says so (or the merge's own line, when it was quicker
    than mpirun).  The exit status stays the failing rank's."""
    prof = tmp_path / "prof"
    calls, extra = 2_000, 200_000
    proc = _exit3_job(tmp_path, prof, calls, extra, busy_rank=1, barrier=False)
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = said(proc)
    assert len(lines) <= 1, proc.stderr[-3000:]
    assert all("trace written to" in ln or
               f"left running): {prof}/trace.json appears when it ends" in ln
               for ln in lines), lines
    deadline = time.time() + 90
    while not (prof / "trace.json").is_file() and time.time() < deadline:
        time.sleep(0.2)  # written whole (a temporary file renamed)
    got = counts_in_trace(prof / "trace.json")
    assert got[0][("allreduce", 8)] == calls
    assert got[1][("allreduce", 8)] == calls + extra


@pytest.mark.full  # the line, deterministically: test_rank0_ended_just_before_its_merge_starts
def test_python_rank0_ended_while_it_converts_says_how_to_build_the_trace(
        tmp_path: Path) -> None:
    """Rank 0 records 1,000,000 calls (on MPI_COMM_SELF), so its own
    conversion at exit takes a while; rank 1 exits with status 3 right after
    MPI_Finalize, and mpirun ends rank 0 in that conversion, before its merge
    starts.  Before, it died silently and no trace came.  Now one line names
    `profiler merge`, which builds the trace with every call of both ranks."""
    prof = tmp_path / "prof"
    calls, extra = 200, 1_000_000
    proc = _exit3_job(tmp_path, prof, calls, extra, busy_rank=0, barrier=True)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert said(proc) == [f"{PREFIX}this process was ended before the trace was built; the "
                          f"raw files are kept: build it with: profiler merge {prof}"], \
        proc.stderr[-3000:]
    time.sleep(1.0)
    assert not (prof / "trace.json").exists()  # no merge was started
    p = profiler_cli("merge", str(prof), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = counts_in_trace(prof / "trace.json")
    assert got[0][("allreduce", 8)] == calls + extra
    assert got[1][("allreduce", 8)] == calls


def _running(pid: int) -> bool:
    """The process exists and has not ended (a zombie its parent has not reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _merge_child(pid: int) -> int | None:
    """The exit merge that process `pid` started (profiler.postjob.atexit), if any."""
    try:
        for c in psutil.Process(pid).children():
            if any("profiler.postjob.atexit" in a for a in c.cmdline()):
                return c.pid
    except psutil.Error:
        pass
    return None


def test_ctrl_c_while_rank0_waits_for_its_merge_ends_the_wait(tmp_path: Path) -> None:
    """Rank 1 records 1,000,000 calls (on MPI_COMM_SELF), so rank 0's exit merge
    waits seconds for rank 1's own conversion.  A SIGINT to rank 0 there (a
    person's Ctrl-C) used to be held by Python's handler until the merge
    ended, up to its bound of minutes.  Now rank 0 ends at once, before the
    trace exists, with one line that says where it appears, and the exit
    status is the job's own (0); the merge, left running, writes every call."""
    prof = tmp_path / "prof"
    calls, extra = 100, 1_000_000
    code = ("import os\n"
            "import numpy as np\n"
            "from mpi4py import MPI\n"
            "c = MPI.COMM_WORLD\n"
            f"open(r'{tmp_path}/pid-%d' % c.Get_rank(), 'w').write(str(os.getpid()))\n"
            "a = np.zeros(1); b = np.zeros(1)\n"
            f"for _ in range({calls}): c.Allreduce(a, b)\n"
            "if c.Get_rank() == 1:\n"
            f"    for _ in range({extra}): MPI.COMM_SELF.Allreduce(a, b)\n")
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)}
    proc = subprocess.Popen(["mpirun", "-n", "2", *[a for k in env for a in ("-x", k)],
                             sys.executable, "-c", code], env=base_env(**env), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        rank0 = child = None
        while child is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
            if rank0 is None and (tmp_path / "pid-0").is_file():
                text = (tmp_path / "pid-0").read_text()
                rank0 = int(text) if text else None
            child = _merge_child(rank0) if rank0 else None
        assert child is not None, "rank 0's exit merge was not seen"
        os.kill(rank0, signal.SIGINT)
        while _running(rank0) and time.monotonic() < deadline:
            time.sleep(0.01)
        trace_at_rank0_end = (prof / "trace.json").exists()
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert not trace_at_rank0_end, err[-3000:]  # rank 0 did not wait for the merge
    lines = [ln for ln in err.splitlines() if ln.startswith(PREFIX)]
    assert lines == [f"{PREFIX}interrupted while the trace was being built (pid {child}, left "
                     f"running): {prof}/trace.json appears when it ends; or build it with: "
                     f"profiler merge {prof}"], err[-3000:]
    deadline = time.time() + 120
    while not (prof / "trace.json").is_file() and time.time() < deadline:
        time.sleep(0.2)
    got = counts_in_trace(prof / "trace.json")
    assert got[0][("allreduce", 8)] == calls
    assert got[1][("allreduce", 8)] == calls + extra
