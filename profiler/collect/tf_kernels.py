"""The tensors TensorFlow hands to Horovod, recorded inside Horovod's kernels.

In a tf.function the Python wrappers of Horovod's ops run once, at tracing;
at run time only the kernels run.  ``libhvprof_tf.so`` (hooks/tf/kernels.cc,
built by setup.py against the installed TensorFlow's headers) defines
``tensorflow::OpKernelContext::input(int)``, which every Horovod data kernel
calls once per tensor before it queues it, and writes one APP_TENSOR record
there, in eager mode and in graph mode alike.

For its definition to take the place of TensorFlow's, it must come before
TensorFlow's libraries in the process's global scope (TensorFlow loads them
global), so :func:`preload` loads it at activation, right after libhvprof.so
and before anything imports TensorFlow.  Until armed it only calls
TensorFlow's function.  :func:`arm` runs before ``horovod.tensorflow.mpi_ops``
executes (profiler.collect.horovod_hooks): it checks that the library was
built for the TensorFlow being run (it reads the kernel through those
headers' inline accessors) and turns the recording on.  Any failure leaves
TensorFlow untouched and is kept as the reason the tensors are not recorded
(:func:`reason`, in the rank's facts and the lineage's reason).
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

__all__ = ["LIB_NAME", "arm", "cost", "library_path", "loaded", "note_late_load",
           "oldest_pending", "preload", "recorded", "reason", "switch", "take_window", "wanted"]

LIB_NAME = "libhvprof_tf.so"
_lib: Any = None
_reason: str | None = None
_armed = False  # arm() succeeded: only then does switch() act


def library_path() -> str:
    """The copy inside the package (profiler/_lib), beside libhvprof.so."""
    from profiler.collect.native import packaged

    return packaged(LIB_NAME)


def wanted() -> bool:
    """HOROVOD_PROFILE_TF_KERNELS: 1 (the default) or 0 (not loaded at all)."""
    from profiler._env import read

    return bool(read("HOROVOD_PROFILE_TF_KERNELS"))


def preload() -> None:
    """At activation (profiler.collect.activate), when the library was built:
    load it global, recording off.  Costs a dlopen."""
    global _lib, _reason
    path = library_path()
    if _lib is not None or not os.path.isfile(path):
        return
    if not wanted():
        _reason = "the kernel hooks are off (HOROVOD_PROFILE_TF_KERNELS=0)"
        return
    if "tensorflow" in sys.modules:
        _reason = "TensorFlow was imported before the profiler started"
        return
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    except OSError as exc:
        _reason = f"the kernel hooks did not load ({exc})"
        return
    lib.hvprof_tf_init.restype = ctypes.c_int
    lib.hvprof_tf_arm.restype = ctypes.c_int
    lib.hvprof_tf_arm.argtypes = (ctypes.c_int,)
    lib.hvprof_tf_built_for.restype = ctypes.c_char_p
    lib.hvprof_tf_recorded.restype = ctypes.c_uint64
    lib.hvprof_tf_cost_ns.restype = ctypes.c_uint64
    lib.hvprof_tf_take_window.restype = ctypes.c_uint64
    lib.hvprof_tf_take_window.argtypes = (ctypes.POINTER(ctypes.c_uint64),
                                          ctypes.POINTER(ctypes.c_uint64))
    lib.hvprof_tf_oldest_pending.restype = ctypes.c_int
    lib.hvprof_tf_oldest_pending.argtypes = (ctypes.POINTER(ctypes.c_int64),
                                             ctypes.POINTER(ctypes.c_int64))
    if lib.hvprof_tf_init() != 0:
        _reason = "the profiler's library lacks the tensor exports"
        return
    _lib = lib


def arm() -> str | None:
    """Before Horovod's TensorFlow kernels load: recording on when the library
    was built for this TensorFlow.  None when on, else why not (kept)."""
    global _reason, _armed
    if _reason is None and not _armed:
        _reason = _arm()
        _armed = _reason is None
    return _reason


def _arm() -> str | None:
    if _lib is None:
        return ("the kernel hooks were not built (no TensorFlow when the profiler was "
                "installed)" if not os.path.isfile(library_path()) else
                "the kernel hooks were not loaded at start-up")
    import tensorflow as tf  # Horovod's mpi_ops imports it first thing too

    running = str(getattr(tf, "__version__", ""))
    built = (_lib.hvprof_tf_built_for() or b"").decode()
    if built != running:
        return (f"the kernel hooks were built for TensorFlow {built}, the job runs {running} "
                "(reinstall horovod-profiler)")
    if _lib.hvprof_tf_arm(1) != 0:
        return "TensorFlow's kernel functions were not found"
    return None


def loaded() -> bool:
    return _lib is not None


def reason() -> str | None:
    """Why the kernels' tensors are not recorded (None: they are, or TensorFlow
    was never used)."""
    return _reason


def recorded() -> int:
    """APP_TENSOR records the kernel hooks wrote in this process."""
    return int(_lib.hvprof_tf_recorded()) if _lib is not None else 0


def oldest_pending() -> tuple[float, str] | None:
    """(seconds, name) of the oldest tensor a Horovod kernel handed over and
    Horovod has not handed back (for the hang watchdog, as
    profiler.collect.tensors.oldest_pending); None when there is none.  The
    name is read from the names file only once it has waited a second."""
    if _lib is None:
        return None
    age, ident = ctypes.c_int64(), ctypes.c_int64()
    if not _lib.hvprof_tf_oldest_pending(ctypes.byref(age), ctypes.byref(ident)):
        return None
    seconds = age.value / 1e9
    name = ""
    if seconds >= 1.0:
        from profiler.collect import native
        from profiler.formats.raw import read_tensor_names

        names = read_tensor_names(native.raw_path())
        name = names[ident.value] if 0 <= ident.value < len(names) else f"tensor #{ident.value}"
    return seconds, name


def take_window() -> tuple[int, int] | None:
    """The step's wait for Horovod, as a step hook ends a step: (the last
    tensor a Horovod kernel handed over, the last one Horovod handed back),
    in the records' clock, since the previous take; None when no kernel ran,
    one is still out, or the hooks are not armed.  Starts the next window."""
    if not _armed:
        return None
    t_in, t_out = ctypes.c_uint64(), ctypes.c_uint64()
    runs = _lib.hvprof_tf_take_window(ctypes.byref(t_in), ctypes.byref(t_out))
    if not runs or not t_in.value or t_out.value < t_in.value:
        return None
    return int(t_in.value), int(t_out.value)


def cost() -> dict[str, int] | None:
    """The kernel hooks' own time (for the rank's self-cost): None when they
    never recorded."""
    n = recorded()
    if not n:
        return None
    return {"kernel_hook_ns": int(_lib.hvprof_tf_cost_ns()), "kernel_hook_records": n}


def switch(on: bool) -> None:
    """Recording off or on again once armed (benchmarks' A/B switch)."""
    if _armed:
        _lib.hvprof_tf_arm(1 if on else 0)


def note_late_load() -> None:
    """horovod.tensorflow was imported before the profiler's hook was: its
    kernel library is bound to TensorFlow's function already."""
    global _reason
    if _reason is None:
        _reason = "Horovod's TensorFlow library was loaded before the profiler started"
