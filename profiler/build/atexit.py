"""The exit work that turns raw files into the dataset and trace.json, shared
by the two ways a profiled process ends:

* a Python process: its exit handler (profiler.collect.activate) converts its
  own raw file and, on rank 0, starts the merge as a child in a session of
  its own (`merge_detached`: `main --merge DIR WORLD TIMEOUT`), which waits for the
  other ranks and writes trace.json.  Rank 0 waits for it and prints its
  line; a launcher that ends rank 0 meanwhile (mpirun aborting the job when
  another rank exits non-zero) does not end the merge, and the trace appears
  a moment later;
* any other process (C, Fortran, anything LD_PRELOADed, NCCL-only): rank 0's
  library runs `main` in a child interpreter from its destructor
  (hooks/exitmerge.c), after closing its own file, with that file's path, the
  world size and its pid; the child converts rank 0's file on its behalf and
  merges the same way.  Its "horovod-profiler:" lines are what the library
  prints; exit status 0 when it said how it went (a trace, or why not), 2
  after a failure it reported in one line itself, anything else (a crash, a
  broken interpreter) makes the library say one line of its own.

Nothing heavy at import: imported by the start-up hook's activation."""

from __future__ import annotations

import os
import sys
from typing import Any

DEFAULT_MERGE_TIMEOUT_S = 60.0
#: beyond the merge timeout, how long rank 0 waits for the merge itself before
#: it lets the child go on alone (hooks/exitmerge.c EXIT_MERGE_GRACE_S)
EXIT_MERGE_GRACE_S = 30.0
#: the child's command: never the working directory's profiler/ (a checkout)
BOOT = ("import sys\n"
        "if sys.path and sys.path[0] in ('', '.'): del sys.path[0]\n"
        "from profiler.collect.exitmerge import main\n"
        "sys.exit(main(sys.argv[1:]))\n")


def say(message: str) -> None:
    try:
        sys.stderr.write("horovod-profiler: " + " ".join(message.split()) + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def merge_timeout() -> float:
    from profiler._env import at_least, setting

    return setting("HOROVOD_PROFILE_MERGE_TIMEOUT", DEFAULT_MERGE_TIMEOUT_S,
                   at_least(0.0, float), "seconds, 0 or more")


def merge_at_exit() -> bool:
    """HOROVOD_PROFILE_MERGE: 1 (the default) builds trace.json at exit on
    rank 0; 0 leaves it to a later `profiler merge DIR` (each rank still
    converts its own raw file)."""
    from profiler._env import setting

    def parse(raw: str) -> bool:
        if raw not in ("0", "1"):
            raise ValueError(raw)
        return raw == "1"

    return setting("HOROVOD_PROFILE_MERGE", True, parse, "0 or 1")


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


def convert_and_merge(directory: str, raw: str, rank: int, world: int, *,
                      own_process: bool = True, others_convert: bool = True,
                      process: dict[str, Any] | None = None,
                      detached: bool = False) -> str | None:
    """Convert this rank's raw file; rank 0 then waits (bounded by
    HOROVOD_PROFILE_MERGE_TIMEOUT) for the others and writes trace.json.
    Returns the line printed by rank 0 (None elsewhere).  own_process: the
    caller is the rank itself (its argv, environment and Python self-cost go
    into the rank's metadata), not a helper converting for it.  others_convert:
    the other ranks convert their own files at exit (Python); if not, rank 0
    converts each as soon as it is closed.  process: the rank's argv,
    executable and environment when the caller is not the rank.  detached:
    rank 0 merges in a child of its own session (merge_detached), which
    outlives this process."""
    if not os.path.exists(raw):
        # The profile directory (or this raw file) was removed while the job
        # ran: the records went into a file nobody can open any more.  Rank 0
        # says so once; the other ranks' records went the same way.
        if rank == 0:
            say(f"warning: the profile directory {directory} was removed while the job "
                "ran: the records of this job are lost (no dataset, no trace)")
        return None
    from profiler.collect.convert import convert_raw

    try:
        convert_raw(raw, directory, own_process=own_process, process=process)
    except OSError as exc:
        if no_space(exc):
            # The other ranks' conversions fail the same way: rank 0 alone
            # says what is kept, and merging would fail again.
            if rank == 0:
                say(no_space_line(directory, exc))
            return None
        say(f"error: rank {rank}: cannot convert {raw}: {one_line(exc)}")
    except Exception as exc:  # rank 0 still merges what is there
        say(f"error: rank {rank}: cannot convert {raw}: {one_line(exc)}")
    if rank != 0:
        return None
    if not merge_at_exit():
        line = (f"no trace at exit (HOROVOD_PROFILE_MERGE=0): each rank's dataset is in "
                f"{directory}/ranks; build it with: profiler merge {directory}")
        say(line)
        return line
    if detached:
        return merge_detached(directory, world)
    return _merge(directory, world, convert_closed=not others_convert)


def _merge(directory: str, world: int, *, convert_closed: bool,
           timeout: float | None = None) -> str:
    """Rank 0's part: wait for the other ranks (bounded by `timeout`, else
    HOROVOD_PROFILE_MERGE_TIMEOUT), merge, say the line."""
    from profiler.collect.merge import wait_and_merge

    try:
        result = wait_and_merge(directory, world_size=max(world, 1), own_rank=0,
                                timeout=merge_timeout() if timeout is None else timeout,
                                convert_closed=convert_closed)
    except OSError as exc:
        if not no_space(exc):
            raise
        line = no_space_line(directory, exc)
        say(line)
        return line
    line = f"trace written to {result.summary_line()}"
    say(line)
    return line


def merge_detached(directory: str, world: int) -> str | None:
    """Run rank 0's merge (_merge) in a child: this interpreter, in a session of
    its own (a launcher that ends this rank or its process group spares it),
    without HOROVOD_PROFILE or LD_PRELOAD (it must not profile itself), stdin
    from /dev/null and its output through a pipe (never the launcher's stdio,
    which mpirun waits on).  Waits for it HOROVOD_PROFILE_MERGE_TIMEOUT plus
    EXIT_MERGE_GRACE_S, relays its "horovod-profiler:" lines and returns the
    last; past that, says that it goes on alone.  If this process is ended
    first, the child goes on and writes the trace all the same."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("HOROVOD_PROFILE", "LD_PRELOAD")}
    timeout = merge_timeout()  # read (and a bad value said) once, here
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", BOOT, "--merge", directory, str(int(world)), repr(timeout)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, start_new_session=True, close_fds=True)
    except OSError as exc:  # no process to spare: merge here, as before
        say(f"warning: cannot start the merge as its own process ({one_line(exc)}): "
            "merging in this one")
        return _merge(directory, world, convert_closed=False, timeout=timeout)
    bound = timeout + EXIT_MERGE_GRACE_S
    ended = (f"this process was ended while the trace was being built (pid {child.pid}, "
             f"left running): {directory}/trace.json appears when it ends; or build it "
             f"with: profiler merge {directory}")
    old = _catch_end_signals(ended)
    try:
        out, _ = child.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        line = (f"the trace is still being built after {bound:.0f} s (pid {child.pid}, left "
                f"running): {directory}/trace.json appears when it ends; or build it with: "
                f"profiler merge {directory}")
        say(line)
        return line
    finally:
        _restore(old)
    last = None
    for text in out.decode(errors="replace").splitlines():
        if text.startswith("horovod-profiler: "):
            last = text[len("horovod-profiler: "):]
            say(last)
    if child.returncode not in (0, 2) or last is None:
        last = (f"error: the merge ended with status {child.returncode}: the raw files are "
                f"kept; build the trace with: profiler merge {directory}")
        say(last)
    return last


#: the signals a launcher ends a rank with (hooks/exitmerge.c end_signals)
END_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


def _catch_end_signals(line: str) -> dict[int, Any]:
    """While rank 0 waits for its merge: a launcher's signal says `line` (the
    merge goes on in its own session), then ends this process as the signal
    would.  Returns the handlers to restore (_restore)."""
    import signal

    def ended(signum: int, frame: Any) -> None:
        say(line)
        # the signal again, to the handler it had before (Python's SIGINT
        # handler raises KeyboardInterrupt, which the exit handler reports
        # and the exit status survives; a handler set in C reads as None)
        prev = old.get(signum)
        signal.signal(signum, prev if prev is not None else signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    old: dict[int, Any] = {}
    for name in END_SIGNALS:
        sig = getattr(signal, name)
        try:
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN:
                continue  # a signal the job ignores stays ignored
            old[sig] = signal.signal(sig, ended)
        except (ValueError, OSError):  # not the main thread: no handler, no line
            pass
    return old


def _restore(old: dict[int, Any]) -> None:
    import signal

    for sig, handler in old.items():
        try:
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        except (ValueError, OSError, TypeError):
            pass


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


def main(argv: list[str]) -> int:
    """The library's exit merge (hooks/exitmerge.c): DIR RAW WORLD PID; or
    Python rank 0's (merge_detached): --merge DIR WORLD TIMEOUT (seconds)."""
    sys.stdout = _Tolerant(sys.stdout)
    sys.stderr = _Tolerant(sys.stderr)
    os.umask(os.umask(0o022) | 0o022)  # nothing world- or group-writable
    if argv[:1] == ["--merge"]:
        try:
            directory, world, timeout = argv[1], int(argv[2]), float(argv[3])
        except (IndexError, ValueError):
            say(f"error: cannot build the trace at exit: bad arguments {argv!r}")
            return 2
        try:
            _merge(directory, world, convert_closed=False, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - one line, the raw files kept
            say(f"error: cannot build the trace at exit: {one_line(exc)}; the raw files "
                f"are kept: build it with: profiler merge {directory}")
            return 2
        return 0
    try:
        directory, raw, world, pid = argv[0], argv[1], int(argv[2]), int(argv[3])
    except (IndexError, ValueError):
        say(f"error: cannot build the trace at exit: bad arguments {argv!r}")
        return 2
    try:
        convert_and_merge(directory, raw, 0, world, own_process=False, others_convert=False,
                          process=process_info(pid))
    except BaseException as exc:  # noqa: BLE001 - one line, the raw files kept
        say(f"error: cannot build the trace at exit: {one_line(exc)}; the raw files are "
            f"kept: build it with: profiler merge {directory}")
        return 2
    return 0
