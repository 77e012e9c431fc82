"""Locate and load the interposition library (libhvprof.so) with ctypes.

The library ships inside the package (profiler/_lib/libhvprof.so); the
environment variable HVPROF_LIB overrides the path.  It is loaded with
RTLD_GLOBAL so that its MPI_* symbols interpose for every MPI user loaded
afterwards (mpi4py, Horovod).  The typed wrappers below follow
docs/ARCHITECTURE.md section 6.  Importing this module is cheap (ctypes only).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

import orjson

from profiler._env import text
from profiler.errors import LibraryError

LIB_NAME = "libhvprof.so"
_lib: ctypes.CDLL | None = None


def packaged(name: str) -> str:
    """Path of a library built into the package (profiler/_lib/`name`)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_lib",
                        name)


def library_path() -> str:
    """Path of the library: $HVPROF_LIB, else the copy inside the package."""
    override = text("HVPROF_LIB")
    path = os.path.abspath(override) if override else packaged(LIB_NAME)
    if not os.path.isfile(path):
        raise LibraryError(
            path, "interposition library not found (reinstall horovod-profiler)"
        )
    return path


# Every export of libhvprof.so that the Python side calls: name -> (restype,
# argtypes, who calls it).  The one place a C signature is written in Python
# (docs/ARCHITECTURE.md section 6); tests/test_native_exports.py checks it
# against the library's export list.  Callers get the declared function from
# function() (or the wrappers below), never through getattr on the library.
_c = ctypes
EXPORTS: dict[str, tuple[Any, tuple[Any, ...], str]] = {
    "hvprof_layout_json": (_c.c_char_p, (), "tests: the record layout, as the C side sees it"),
    "hvprof_settings_json": (_c.c_size_t, (_c.c_char_p, _c.c_size_t),
                             "tests: every setting as the C side reads it"),
    "hvprof_is_active": (_c.c_int, (), "is a raw file open"),
    "hvprof_gathered": (_c.c_int, (), "activate: this rank's files went to rank 0 at "
                                      "MPI_Finalize (it converts nothing itself)"),
    "hvprof_set_gather_callback": (None, (_c.c_void_p,), "activate: the rank's facts, "
                                                         "written before its files leave"),
    "hvprof_dir": (_c.c_char_p, (), "activate: the profile directory"),
    "hvprof_raw_path": (_c.c_char_p, (), "activate: this rank's raw file"),
    "hvprof_rank": (_c.c_int, (), "activate, steps: this process's rank"),
    "hvprof_world_size": (_c.c_int, (), "activate: number of ranks"),
    "hvprof_now": (_c.c_uint64, (), "steps: the raw records' clock"),
    "hvprof_record_app": (_c.c_int, (_c.c_int, _c.c_uint64, _c.c_uint64, _c.c_uint64,
                                     _c.c_uint32), "benchmarks: app records (steps.c writes "
                                                   "them)"),
    "hvprof_record_tensor": (_c.c_int, (_c.c_uint64, _c.c_uint64, _c.c_uint64, _c.c_uint64,
                                        _c.c_uint32, _c.c_int32, _c.c_uint32, _c.c_uint32,
                                        _c.c_uint32, _c.c_int32, _c.c_uint64),
                             "tensors: a tensor handed to Horovod"),
    "hvprof_tensor_name_id": (_c.c_int64, (_c.c_char_p, _c.c_size_t),
                              "tensors: a tensor name's id (one id space with the "
                              "TensorFlow kernels' records)"),
    "hvprof_steps_configure": (None, (_c.c_uint32, _c.c_uint64),
                               "steps: one step in N recorded, images of a hooked step"),
    "hvprof_steps_set_batch": (None, (_c.c_uint64,), "steps: set_batch_size"),
    "hvprof_steps_mark": (None, (_c.c_uint64,), "steps: profiler.step()"),
    "hvprof_steps_context_enter": (_c.c_uint64, (), "steps: step_context's entry"),
    "hvprof_steps_context_exit": (None, (_c.c_uint64, _c.c_uint64),
                                  "steps: step_context's exit"),
    "hvprof_steps_sync": (None, (_c.c_uint64, _c.c_uint64, _c.c_int64, _c.c_int64),
                          "steps: the open step's synchronize (Python hooks)"),
    "hvprof_steps_hook": (None, (_c.c_uint64, _c.c_int64), "steps: a framework hook's boundary"),
    "hvprof_steps_hook_begin": (None, (), "steps: a framework hook's step begins"),
    "hvprof_steps_hook_end": (None, (_c.c_uint64,), "steps: ... and ends"),
    "hvprof_steps_join": (None, (_c.c_uint64, _c.c_uint64, _c.c_uint64), "steps: hvd.join"),
    "hvprof_steps_user_sampling": (_c.c_int, (_c.c_int,),
                                   "steps: sampling()/paused(); the previous setting"),
    "hvprof_steps_recorded": (_c.c_uint64, (), "steps: step records written"),
    "hvprof_steps_mode": (_c.c_int, (), "steps: none, hook or explicit"),
    "hvprof_cpu_step_reads": (_c.c_int, (), "steps: the open step reads each thread's "
                                            "CPU (HOROVOD_PROFILE_CPU)"),
    "hvprof_set_enabled": (None, (_c.c_int,), "bench: run-time switch"),
    "hvprof_set_flush_ms": (_c.c_int, (_c.c_int,),
                            "bench: the helper's period (0: no ticks); the previous one"),
    "hvprof_set_python": (None, (_c.c_int,), "activate: this rank converts its own file at exit"),
    "hvprof_process_exit": (None, (), "activate: mark the raw file CLOSED"),
    "hvprof_exit_work": (None, (), "activate: the library's exit work now (rank 0: the "
                                   "exit merge), once"),
    "hvprof_exit_prepare": (None, (), "activate: the exit work starts (rank 0 says so if "
                                      "a signal ends it before its merge)"),
    "hvprof_nccl_visible": (_c.c_int, (), "tests: NCCL visibility bits"),
    "hvprof_nccl_json": (_c.c_char_p, (), "nvml: NCCL state and counters"),
    "hvprof_nccl_finish": (_c.c_int, (_c.c_int,), "activate: NCCL device times, sidecar"),
    "hvprof_gloo_arm": (_c.c_int, (_c.c_char_p,),
                        "horovod_hooks: wrap Horovod's Gloo collectives (hooks/gloo.c) once "
                        "its extension is loaded; >0 armed, 0 none (said once), -1 not loaded"),
    "hvprof_gloo_records": (_c.c_uint64, (), "tests: records the Gloo wrappers wrote"),
    "hvprof_gloo_epoch_begin": (None, (), "horovod_hooks: an elastic reset's hvd.init"),
    "hvprof_inflight_oldest_ns": (_c.c_int64, (), "watchdog: age of the oldest call in flight"),
    "hvprof_inflight_oldest_op": (_c.c_int, (), "watchdog: the op of the oldest call in flight"),
}
del _c
# Exports Python never calls, each with the reason.
C_ONLY: dict[str, str] = {
    "hvprof_record_app_cpu": "a sync row with its schedstat, written by the step state "
                             "(hooks/steps.c)",
    "hvprof_cpu_baseline": "every thread's CPU read as a step opens, by the step state "
                           "(hooks/steps.c)",
    "hvprof_set_sampling": "pause/resume recording, switched by the step state "
                           "(hooks/steps.c: hvprof_steps_user_sampling, SAMPLE_STEPS)",
    "hvprof_record_op_tensor": "the TensorFlow kernels' tensor records "
                               "(hooks/tf/kernels.cc, on TensorFlow's threads, no Python)",
    "hvprof_ticks_per_ns": "the C hooks' own-work meter (profiler/_ext/fastrec.c, through "
                           "dlsym): the library's clock in ns",
    "hvprof_nccl_flush": "called by hvprof_nccl_finish (Python calls that); exported for C "
                         "applications that collect device times mid-run",
}


def function(name: str, lib: ctypes.CDLL | None = None) -> Any:
    """The export `name` (a key of EXPORTS) of `lib` (default: this module's
    library, loaded if need be) with its declared signature; None when the
    library lacks it (an older or a non-NCCL build)."""
    restype, argtypes, _ = EXPORTS[name]
    lib = lib if lib is not None else load()
    fn = getattr(lib, name, None)
    if fn is None:
        return None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


class Functions:
    """The EXPORTS of one library as attributes named without the ``hvprof_``
    prefix (``now``, ``record_app``, ...), declared once; None when absent.
    For callers that call often (steps)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        for name in EXPORTS:
            setattr(self, name[len("hvprof_"):], function(name, lib))

    def __getattr__(self, name: str) -> Any:  # only for names outside EXPORTS
        raise AttributeError(f"{name!r} is not in profiler.collect.native.EXPORTS")


def _declare(lib: ctypes.CDLL) -> None:
    for name in EXPORTS:
        function(name, lib)


def load() -> ctypes.CDLL:
    """Load the library once (RTLD_GLOBAL) and return it."""
    global _lib
    if _lib is None:
        path = library_path()
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise LibraryError(path, f"cannot load: {exc}") from None
        _declare(lib)
        _lib = lib
    return _lib


def loaded() -> ctypes.CDLL | None:
    """The library if this process already loaded it through this module."""
    return _lib


def _fn(name: str) -> Any:
    fn = function(name)
    if fn is None:
        raise LibraryError(library_path(), f"library lacks the export {name}")
    return fn


def _str(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def layout_json() -> str:
    return _str(_fn("hvprof_layout_json")())


def settings_json() -> str:
    """Every setting as the library reads it (tests/test_settings.py)."""
    buf = ctypes.create_string_buffer(1 << 16)
    n = _fn("hvprof_settings_json")(buf, len(buf))
    return buf.raw[:min(n, len(buf) - 1)].decode("utf-8", "replace")


def is_active() -> bool:
    return bool(_fn("hvprof_is_active")())


def profile_dir() -> str:
    """The profile directory, "" when this process never opened a raw file."""
    return _str(_fn("hvprof_dir")())


def raw_path() -> str:
    return _str(_fn("hvprof_raw_path")())


def rank() -> int:
    return int(_fn("hvprof_rank")())


def world_size() -> int:
    return int(_fn("hvprof_world_size")())


def set_enabled(on: bool) -> None:
    _fn("hvprof_set_enabled")(1 if on else 0)


def set_flush_ms(ms: int) -> int:
    """The helper's flush period from now on (0: no clock ticks); the
    previous one, or -1 (no raw file open in this process, or out of range)."""
    return int(_fn("hvprof_set_flush_ms")(int(ms)))


def set_python(on: bool) -> None:
    """Tell the library that this rank converts its own raw file at exit; its
    header says so to the exit merge (no-op for a library without it)."""
    fn = function("hvprof_set_python")
    if fn is not None:
        fn(1 if on else 0)


_GATHER_CALLBACK = ctypes.CFUNCTYPE(None)
_gather_callback: Any = None  # kept alive: the library holds its address


def set_gather_callback(fn: Callable[[], None]) -> None:
    """Have the library call `fn` at MPI_Finalize, just before this rank's files
    are sent to rank 0 (hooks/mpi_gather.c), on whatever thread finalizes MPI.
    `fn` must not raise (an exception is printed and dropped by ctypes)."""
    global _gather_callback
    setter = function("hvprof_set_gather_callback")
    if setter is not None:
        _gather_callback = _GATHER_CALLBACK(fn)
        setter(ctypes.cast(_gather_callback, ctypes.c_void_p))


def gathered() -> bool:
    """This rank's files went to rank 0's directory at MPI_Finalize: rank 0's
    exit merge converts them, and this rank converts nothing itself."""
    fn = function("hvprof_gathered")
    return bool(fn()) if fn is not None else False


def process_exit() -> None:
    _fn("hvprof_process_exit")()


def exit_prepare() -> None:
    """A Python rank's exit work starts: on rank 0, a signal that ends it
    before its exit merge starts says how to build the trace."""
    fn = function("hvprof_exit_prepare")
    if fn is not None:
        fn()


def exit_work() -> None:
    """The library's exit work, now rather than in its destructor (which a
    process ended by a signal never runs): on rank 0, the exit merge."""
    fn = function("hvprof_exit_work")
    if fn is not None:
        fn()


def gloo_arm(library: str | None = None) -> int | None:
    """Wrap the Gloo collectives of Horovod's extension `library` (None:
    every loaded one).  Returns the wrappers armed (0: none, said once on
    stderr; -1: not loaded), or None without the library or this export."""
    lib = loaded()
    if lib is None:
        return None
    fn = function("hvprof_gloo_arm", lib)
    if fn is None:
        return None
    return int(fn(os.fsencode(library) if library else None))


# ---------------------------------------------------------------------------
# The library's NCCL state
# ---------------------------------------------------------------------------
def _loaded_lib() -> ctypes.CDLL | None:
    """The interposition library if this process loaded it (ctypes or LD_PRELOAD)."""
    lib = loaded()
    if lib is not None:
        return lib
    try:
        glob = ctypes.CDLL(None)
        glob.hvprof_nccl_json  # noqa: B018 - present only when preloaded
    except (OSError, AttributeError):
        return None
    return glob


def native_state(lib: ctypes.CDLL | None = None) -> dict[str, Any] | None:
    """hvprof_nccl_json() of this process, parsed; None without the library."""
    lib = lib if lib is not None else _loaded_lib()
    if lib is None:
        return None
    fn = function("hvprof_nccl_json", lib)
    if fn is None:
        return None  # a library without NCCL support
    raw = fn()
    if not raw:
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def finish_native(timeout_ms: int = -1, lib: ctypes.CDLL | None = None) -> int | None:
    """Collect this process's pending NCCL device times and write its sidecar.

    To be called before the raw file is closed and converted (the device
    records are written by the calling thread).  Returns the number of event
    pairs still pending after `timeout_ms` (negative: the library's default),
    or None when the library is not loaded.
    """
    lib = lib if lib is not None else _loaded_lib()
    if lib is None:
        return None
    fn = function("hvprof_nccl_finish", lib)
    if fn is None:
        return None
    return int(fn(int(timeout_ms)))
