"""The job's exit: one entry point that turns raw files into the dataset and
trace.json, run the same way for every program.

* Each rank whose process has a Python runtime converts its own raw file in
  its exit handler (profiler.collect.activate -> convert_rank): the rank's
  own facts go into its metadata, and the conversion is spread over the
  ranks.  The raw file's header says so (self_converts, set by the library
  when Python activates it), so the merge waits for that rank's dataset.
* Rank 0's library, in its exit work, starts `main` (DIR RAW WORLD PID) as
  a child in a session of its own, for Python and C programs alike
  (hooks/exitmerge.c): at the end of Python's exit handler, or in the
  library's destructor for a program without Python.  The child converts what
  is not up to date (rank 0's file, unless Python did; the files of ranks
  that convert nothing themselves, once closed; those of ranks that died),
  waits for the others (bounded by HOROVOD_PROFILE_MERGE_TIMEOUT) and writes
  trace.json.  Its "horovod-profiler:" lines are what the library prints;
  exit status 0 when it said how it went (a trace, or why not), 2 after a
  failure it reported in one line itself.  A launcher that ends rank 0
  meanwhile does not end the child: the trace appears a moment later.

Nothing heavy at import: imported by the start-up hook's activation."""

from __future__ import annotations

import os
import sys
from typing import Any


def say(message: str) -> None:
    try:
        sys.stderr.write("horovod-profiler: " + " ".join(message.split()) + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def merge_timeout() -> float:
    from profiler._env import read

    return float(read("HOROVOD_PROFILE_MERGE_TIMEOUT"))


def merge_at_exit() -> bool:
    """HOROVOD_PROFILE_MERGE: 1 (the default) builds trace.json at exit on
    rank 0; 0 leaves it to a later `profiler merge DIR` (each rank still
    converts its own raw file)."""
    from profiler._env import read

    return bool(read("HOROVOD_PROFILE_MERGE"))


def one_line(exc: BaseException) -> str:
    from profiler.errors import ProfilerError

    if isinstance(exc, ProfilerError):
        return exc.line()
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def no_space(exc: OSError) -> bool:
    import errno

    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def no_space_line(directory: str, exc: OSError) -> str:
    what = os.strerror(exc.errno) if exc.errno else str(exc)
    return (f"error: cannot write the dataset or trace in {directory} ({what}): the raw "
            f"files are kept; build the trace where there is space with: profiler merge "
            f"{directory}")


def convert_rank(directory: str, raw: str, rank: int,
                 facts: dict[str, Any] | None = None) -> tuple[str, OSError | None]:
    """Convert one rank's raw file at exit: a rank converting its own (facts
    with "own"), or the exit merge converting rank 0's unless it is up to
    date.  Returns ("ok" | "gone" | "no space" | "failed", the OSError of
    "no space").  "gone": the directory was removed while the job ran.  A
    conversion that fails is said here, in one line; the conditions of the
    whole job (gone, no space) are said once, by the exit merge (main),
    never by every rank."""
    if not os.path.exists(raw):
        return "gone", None
    from profiler.postjob.convert import convert_raw, is_up_to_date

    try:
        if not (facts or {}).get("own") and is_up_to_date(raw, directory):
            return "ok", None  # the rank converted it itself
        convert_raw(raw, directory, facts=facts)
        return "ok", None
    except Exception as exc:  # rank 0 still merges what is there
        if _interrupted(exc):  # Ctrl-C, masked by a failing clean-up: the caller's
            raise KeyboardInterrupt from exc
        if isinstance(exc, OSError) and no_space(exc):
            return "no space", exc
        say(f"error: rank {rank}: cannot convert {raw}: {one_line(exc)}")
    return "failed", None


def _interrupted(exc: BaseException) -> bool:
    """exc was raised while a KeyboardInterrupt was being handled (a mapped
    file's close refused with "exported pointers exist" replaces it)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _merge(directory: str, world: int, *, timeout: float | None = None,
           receiver: Any = None) -> str:
    """Rank 0's part: wait for the other ranks (bounded by `timeout`, else
    HOROVOD_PROFILE_MERGE_TIMEOUT; with a `receiver`, the files of the ranks
    on other hosts too), merge, say the line."""
    from profiler.postjob.merge import wait_and_merge

    try:
        result = wait_and_merge(directory, world_size=max(world, 1), own_rank=0,
                                timeout=merge_timeout() if timeout is None else timeout,
                                receiver=receiver)
    except OSError as exc:
        if not no_space(exc):
            raise
        line = no_space_line(directory, exc)
        say(line)
        return line
    line = f"trace written to {result.summary_line()}"
    say(line)
    from profiler.postjob.site_record import record_at_exit  # the job record
    record_at_exit(directory, say)
    return line


def process_info(pid: int) -> dict[str, Any] | None:
    """The command line, executable and environment (as it started) of the
    process `pid`, from /proc; None where they cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [e.decode(errors="replace").partition("=")
                     for e in f.read().split(b"\0") if e]
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    return {"argv": argv, "executable": exe, "environ": {k: v for k, _, v in pairs}}


class _Tolerant:
    """A stream whose writes never raise: the library that reads this process's
    output may be gone (ended by its launcher, or it stopped waiting), and a
    warning printed then must not cost the trace."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._broken = False

    def write(self, text: str) -> int:
        if not self._broken:
            try:
                self._stream.write(text)
                self._stream.flush()
            except (OSError, ValueError):
                self._broken = True
        return len(text)

    def flush(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _self_converts(raw: str) -> bool:
    from profiler.errors import ProfilerError
    from profiler.formats.raw import read_header

    try:
        return bool(read_header(raw).get("self_converts"))
    except (ProfilerError, OSError):
        return False


def main(argv: list[str]) -> int:
    """The exit merge that rank 0's library starts (hooks/exitmerge.c):
    DIR RAW WORLD PID."""
    sys.stdout = _Tolerant(sys.stdout)
    sys.stderr = _Tolerant(sys.stderr)
    os.umask(os.umask(0o022) | 0o022)  # nothing world- or group-writable
    try:
        directory, raw, world, pid = argv[0], argv[1], int(argv[2]), int(argv[3])
    except (IndexError, ValueError):
        say(f"error: cannot build the trace at exit: bad arguments {argv!r}")
        return 2
    receiver = None
    if merge_at_exit():  # a job without MPI: the other hosts' files, over TCP
        from profiler.postjob.gather import start_receiver

        receiver = start_receiver(directory, world, say)
    try:
        # rank 0 converted its own file (Python) unless its header says
        # otherwise; a conversion that failed there is the merge's to retry
        done, err = (("ok", None) if _self_converts(raw) else
                     convert_rank(directory, raw, 0, process_info(pid)))
        if done == "gone" or not os.path.exists(raw):
            # The profile directory (or this raw file) was removed while the job
            # ran: the records went into files nobody can open any more.
            say(f"warning: the profile directory {directory} was removed while the job "
                "ran: the records of this job are lost (no dataset, no trace)")
            return 0
        if done == "no space" and err is not None:
            # every rank's conversion fails the same way, and merging would too
            say(no_space_line(directory, err))
            return 0
        if not merge_at_exit():
            say(f"no trace at exit (HOROVOD_PROFILE_MERGE=0): build it with: profiler merge "
                f"{directory}")
            return 0
        _merge(directory, world, receiver=receiver)
    except BaseException as exc:  # noqa: BLE001 - one line, the raw files kept
        say(f"error: cannot build the trace at exit: {one_line(exc)}; the raw files are "
            f"kept: build it with: profiler merge {directory}")
        return 2
    finally:
        if receiver is not None:
            receiver.close()
    return 0


def allow_late_imports() -> None:
    """Let the exit work import pandas in a process that imported `threading`.

    Python's shutdown marks `threading` as shutting down before the atexit
    handlers run; from then on, importing concurrent.futures.thread (which
    pandas does) raises "can't register atexit after shutdown".  A job that
    imported threading or multiprocessing but not concurrent.futures would
    lose its dataset and trace.  Import it now with the mark lifted for that
    one import: its own exit hook would only join thread pools, and no pool
    exists yet.
    """
    if "concurrent.futures.thread" in sys.modules:
        return
    th = sys.modules.get("threading")
    if th is None or not getattr(th, "_SHUTTING_DOWN", False):
        return
    th._SHUTTING_DOWN = False  # type: ignore[attr-defined]
    try:
        import concurrent.futures.thread  # noqa: F401
    finally:
        th._SHUTTING_DOWN = True  # type: ignore[attr-defined]
