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
from typing import Any

import orjson

from profiler.errors import LibraryError

LIB_NAME = "libhvprof.so"
_lib: ctypes.CDLL | None = None


def library_path() -> str:
    """Path of the library: $HVPROF_LIB, else the copy inside the package."""
    override = os.environ.get("HVPROF_LIB")
    if override:
        path = os.path.abspath(override)
    else:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_lib",
                            LIB_NAME)
    if not os.path.isfile(path):
        raise LibraryError(
            path, "interposition library not found (reinstall horovod-profiler)"
        )
    return path


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes
    sigs: dict[str, tuple[object, list[object]]] = {
        "hvprof_layout_json": (c.c_char_p, []),
        "hvprof_is_active": (c.c_int, []),
        "hvprof_dir": (c.c_char_p, []),
        "hvprof_raw_path": (c.c_char_p, []),
        "hvprof_rank": (c.c_int, []),
        "hvprof_world_size": (c.c_int, []),
        "hvprof_now": (c.c_uint64, []),
        "hvprof_record_app": (
            c.c_int, [c.c_int, c.c_uint64, c.c_uint64, c.c_uint64, c.c_uint32]
        ),
        "hvprof_set_enabled": (None, [c.c_int]),
        "hvprof_process_exit": (None, []),
    }
    for name, (restype, argtypes) in sigs.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue  # an older library: the wrapper raises when called
        fn.restype = restype
        fn.argtypes = argtypes


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


def _fn(name: str) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    lib = load()
    try:
        return getattr(lib, name)
    except AttributeError:
        raise LibraryError(library_path(), f"library lacks the export {name}") from None


def _str(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def layout_json() -> str:
    return _str(_fn("hvprof_layout_json")())


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


def now() -> int:
    """Current tick count (the clock of the raw records)."""
    return int(_fn("hvprof_now")())


def record_app(op: int, t_start: int, t_end: int, count: int, seq: int) -> int:
    return int(_fn("hvprof_record_app")(op, t_start, t_end, count, seq))


def set_enabled(on: bool) -> None:
    _fn("hvprof_set_enabled")(1 if on else 0)


def process_exit() -> None:
    _fn("hvprof_process_exit")()


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
    try:
        fn = lib.hvprof_nccl_json
    except AttributeError:
        return None  # a library without NCCL support
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
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
    try:
        fn = lib.hvprof_nccl_finish
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int]
    return int(fn(int(timeout_ms)))
