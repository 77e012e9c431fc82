"""Zero-code activation, imported at interpreter start by horovod_profiler.pth
when HOROVOD_PROFILE is set to anything but an off word (profiler._env).

At import: load libhvprof.so with RTLD_GLOBAL, before mpi4py or Horovod load
MPI, so that its MPI_* wrappers interpose; install the Horovod hooks if that
module exists; register the exit handler.  Nothing heavy is imported here
(no pandas, no pyarrow): those are imported by the exit handler, and only in a
process that actually profiled.

At exit (atexit; registered first, so it runs after Horovod's shutdown and
mpi4py's finalization handlers registered later):

* a process whose library never opened a raw file (pip, a launcher, any
  non-MPI Python) returns silently;
* MPI is finalized first when mpi4py initialized it and would finalize it
  anyway (its own finalizer runs after every Python exit handler, so this only
  brings it forward): MPI_Finalize is then recorded and the file marked
  FINALIZED, the same on every rank;
* hvprof_process_exit() marks the raw file CLOSED;
* this rank's raw file becomes ranks/rank-R.parquet + .json, with the facts
  only the rank can tell (profiler.collect.facts).  The library marks the
  file as one its rank converts (hvprof_set_python, at activation), so the
  merge waits for it rather than converting it.

The trace is then built the same way as for any other program: rank 0's
library runs its exit work (the exit merge, profiler.postjob.atexit), here at
the end of this handler rather than in its destructor, which a process
ended by a signal (an uncaught KeyboardInterrupt) never runs.

Any failure is reported in one line; the application's exit status never changes.
"""

from __future__ import annotations

import atexit
import ctypes  # already loaded: profiler.collect.native uses it
import os
import sys

from profiler._env import launcher_rank, profile_mode, unknown_mode_line
from profiler.postjob.atexit import allow_late_imports, convert_rank
from profiler.postjob.atexit import one_line as _one_line
from profiler.postjob.atexit import say as _say

_PID = os.getpid()
_registered = False


def finish() -> None:
    """The exit work of this rank (module doc)."""
    if os.getpid() != _PID:
        return None  # a forked child (data-loader worker): the parent reports
    from profiler.collect import native

    if native.loaded() is None:
        return None
    directory = native.profile_dir()
    if not directory:
        return None  # this process never profiled anything: say nothing
    rank = native.rank()
    raw = native.raw_path()
    native.exit_prepare()
    try:
        _finalize_mpi4py()
    except Exception as exc:
        _say(f"warning: rank {rank}: MPI_Finalize failed: {_one_line(exc)}")
    native.finish_native()  # NCCL device times in flight, the NCCL sidecar
    native.process_exit()

    # What the exit work creates (ranks/, parquet, json, trace.json) is never
    # world- or group-writable, whatever umask the job runs under (the
    # library creates raw/ the same way).
    mask = os.umask(0o022)
    os.umask(mask | 0o022)
    try:
        if not native.gathered():  # else rank 0's exit merge converts its copy
            from profiler.collect.facts import rank_facts

            convert_rank(directory, raw, rank, rank_facts(raw))
            _offered(directory, raw, rank)
    finally:
        os.umask(mask)
    native.exit_work()
    return None


def _facts_before_gather() -> None:
    """At MPI_Finalize, before this rank's files leave for rank 0's host (no
    shared disk): the facts only this process knows, beside its raw file."""
    try:
        from profiler.collect import native
        from profiler.collect.facts import rank_facts
        from profiler.formats import facts

        raw = native.raw_path()
        if raw:
            facts.write(raw, rank_facts(raw))
    except Exception as exc:  # noqa: BLE001 - never in the job's way
        if isinstance(exc, FileNotFoundError) and not os.path.isdir(
                os.path.dirname(native.raw_path() or "")):
            return  # the profile directory is gone: the exit work says so, once
        _say(f"warning: rank {native.rank()}: the rank's own "
             f"facts were not written before its files were gathered: {_one_line(exc)}")


def _offered(directory: str, raw: str, rank: int) -> str:
    """A job without MPI whose launcher runs a rendezvous server (horovodrun
    --gloo, elastic, Ray, Spark): this rank's files and the dataset it just
    made, offered to rank 0's exit merge, which takes them when it cannot see
    them (profiler.postjob.gather.offer).  "off" where there is no such path."""
    from profiler.postjob import gather

    if rank <= 0 or gather.rendezvous() is None:
        return "off"
    try:
        from profiler.postjob.atexit import merge_timeout

        return gather.offer(directory, raw, rank, timeout=merge_timeout())
    except Exception as exc:  # noqa: BLE001 - the files stay here
        _say(f"warning: rank {rank}: its files were not offered to rank 0: {_one_line(exc)}")
        return "off"


def _finalize_mpi4py() -> None:
    """Finalize MPI now if mpi4py is about to do it at interpreter exit."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    rc = getattr(sys.modules.get("mpi4py"), "rc", None)
    if getattr(rc, "finalize", None) is False or getattr(rc, "initialize", True) is False:
        return  # the application keeps MPI's lifetime to itself
    if mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def _interrupt_flag() -> ctypes.c_int | None:
    """CPython's "exit by SIGINT" flag (3.11: _Py_UnhandledKeyboardInterrupt).

    A script ended by an uncaught KeyboardInterrupt exits through SIGINT (status
    130 under a shell) when this is still set after the atexit handlers.  Any
    exec()/eval() of a string clears it, and the exit work's imports do that
    (namedtuple, dataclasses): the exit status would become 1.  Python >= 3.12
    keeps the flag inside _PyRuntime, out of reach: None there."""
    try:
        return ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt")
    except (AttributeError, OSError, ValueError):
        return None


def _at_exit() -> None:
    flag = _interrupt_flag()
    interrupted = flag.value if flag is not None else 0
    try:
        allow_late_imports()
        finish()
    except KeyboardInterrupt:
        # Ctrl-C in the exit work: the library's own (its destructor, at the
        # process's end) still closes the file and, on rank 0, builds the
        # trace and says so in its one line; "error: KeyboardInterrupt"
        # before it would be a second line, and a wrong one
        pass
    except BaseException as exc:  # noqa: BLE001 - never change the exit status
        _say(f"error: {_one_line(exc)}")
    finally:
        if interrupted and flag is not None:
            flag.value = interrupted


def nccl_plugin() -> str | None:
    """Make NCCL (>= 2.23) load this library as its profiler plugin.

    NCCL_PROFILER_PLUGIN is set to the library's path unless the user set it;
    a user's own value (another plugin, or "none") takes precedence, and one
    line says so (rank 0 only: every rank would say the same).  Returns the
    line printed, or None."""
    from profiler.collect import native

    own = native.library_path()
    user = os.environ.get("NCCL_PROFILER_PLUGIN")
    if not user:
        os.environ["NCCL_PROFILER_PLUGIN"] = own
        return None
    if os.path.realpath(user) == os.path.realpath(own):
        return None
    if (launcher_rank() or 0) != 0:
        return None
    line = (f"NCCL_PROFILER_PLUGIN={user} is set: the user's NCCL profiler plugin takes "
            "precedence; NCCL calls are seen only through the symbol wrappers (shared NCCL)")
    _say(line)
    return "horovod-profiler: " + line


#: Python launchers whose ranks say for themselves what the launcher would
_LAUNCHERS = ("horovodrun", "torchrun")


def _a_launcher() -> bool:
    """This process is a launcher (its script, or `-m` module, is one) or a
    helper that multiprocessing started: rank 0 of the job speaks instead."""
    argv = getattr(sys, "orig_argv", [])[1:4]
    return any(os.path.basename(a) in _LAUNCHERS or a in ("horovod.runner.launch",
                                                          "torch.distributed.run")
               or a.startswith("from multiprocessing.") for a in argv)


def activate() -> None:
    """Load the library, install the Horovod hooks, register the exit handler;
    nothing where HOROVOD_PROFILE is off, and one line (rank 0, or a process
    no launcher ranked) where it is none of its words."""
    global _registered
    if _registered:
        return
    mode = profile_mode()
    if mode is None and (launcher_rank() or 0) == 0 and not _a_launcher():
        print(unknown_mode_line(), file=sys.stderr)
    if mode in (None, "off"):
        return
    from profiler.collect import native

    try:
        native.load()
    except Exception as exc:
        _say(f"error: profiling disabled: {_one_line(exc)}")
        return
    # No import of concurrent.futures here (12 ms for every Python process
    # started with HOROVOD_PROFILE=1): allow_late_imports() lets the exit
    # work import it, and frame_to_table converts without a thread pool.
    native.set_python(True)  # this rank converts its own file at exit (finish)
    native.set_gather_callback(_facts_before_gather)
    try:  # before anything imports TensorFlow: its tensors' hooks (built with it)
        from profiler.collect import tf_kernels

        tf_kernels.preload()
    except Exception as exc:  # never break the job
        _say(f"warning: TensorFlow's tensors will not be recorded: {_one_line(exc)}")
    nccl_plugin()
    try:
        from profiler.collect import horovod_hooks as hooks
    except ImportError:
        pass
    else:
        try:
            hooks.install()
        except Exception as exc:
            _say(f"warning: Horovod hooks not installed: {_one_line(exc)}")
    try:
        from profiler.collect import watchdog

        watchdog.start()
    except Exception as exc:  # never break the job
        _say(f"warning: hang watchdog not started: {_one_line(exc)}")
    atexit.register(_at_exit)
    _registered = True


activate()
