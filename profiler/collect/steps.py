"""Training-step boundaries: the records that turn communication into images/sec.

A step record (op ``step``, backend ``app``) is written through the
interposition library: ``count`` = images the step processed on this rank
(0 = unknown), ``seq`` = step number (0, 1, ...), times = the step's interval.
With each step record the library writes one ``cpu`` record per thread that
recorded (hooks/cpu.c): its CPU and run-queue time since its previous read;
a step that opens without another closing (the first boundary, a
step_context's entry) takes that read here (hvprof_cpu_baseline).

Two ways to mark steps:

* by hand, in any loop::

      for batch in loader:
          train(batch)
          profiler.step(images=len(batch))    # closes the step begun at the previous call

      with profiler.step_context(images=64):  # times exactly the body
          train(batch)

  ``step()`` closes the interval that began at the previous ``step()`` (the
  first call only opens the first interval, so N calls make N - 1 records).

* without code change, for jobs using ``hvd.DistributedOptimizer``: while
  profiling, :mod:`profiler.collect.horovod_hooks` wraps the optimizer's ``step`` and
  calls :func:`hook_step` after each one.  Images per step then come from
  :func:`set_batch_size` if called, else from ``HOROVOD_PROFILE_BATCH_SIZE``,
  else 0 (images/sec unknown).  As soon as the application marks steps itself
  the hook falls silent, so nothing is counted twice.

Steps whose image count is 0 (warm-up, or unknown) are recorded but carry no
images: images/sec is computed over the steps that have images.

Sampling (the library's run-time switch, ``hvprof_set_sampling``): while
recording is paused, calls are neither recorded nor lost: they keep their
per-communicator sequence numbers (so the recorded calls still match across
ranks) and are counted in the raw header's ``unsampled_calls``.  Step records
are always written.

* ``profiler.sampling(False)`` / ``profiler.sampling(True)`` pause and resume;
  ``with profiler.paused(): ...`` pauses for a block;
* ``HOROVOD_PROFILE_SAMPLE_STEPS=N`` records one step in N: steps 0, N, 2N, ...
  are recorded, the others counted as unsampled (switched at step boundaries,
  whichever way steps are marked).  The calls before the first step boundary
  (start-up, parameter broadcast) are recorded.

Both combine: a call is recorded when neither pauses it.

The step state (the open step, the next step's number, who marks steps,
sampling) is the library's (hooks/steps.c), one for every way steps are
marked: the functions here, TensorFlow's hooks, and the DistributedOptimizer
hook, which in C (profiler._fastrec.StepHook) reaches it without Python.

When profiling is off (the library was not loaded at start-up) every function
here returns at once, after one cached check.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from profiler._env import read, setting
from profiler.errors import UsageError

__all__ = [
    "APP_STEP",
    "step",
    "step_context",
    "set_batch_size",
    "batch_size",
    "hook_step",
    "hook_begin",
    "hook_end",
    "steps_recorded",
    "mark_join",
    "wrap_join",
    "mode",
    "sampling",
    "paused",
    "sample_every",
]

APP_STEP = 32  # hvprof_format.h: X(32, APP_STEP, "step", "app")
APP_SYNC = 34  # hvprof_format.h: X(34, APP_SYNC, "sync", "app")
APP_JOIN = 37  # hvprof_format.h: X(37, APP_JOIN, "join", "app")
BATCH_SIZE_ENV = "HOROVOD_PROFILE_BATCH_SIZE"
SAMPLE_STEPS_ENV = "HOROVOD_PROFILE_SAMPLE_STEPS"
#: the library's step functions, one of which each API below calls
_STEP_FUNCTIONS = ("steps_configure", "steps_set_batch", "steps_mark", "steps_context_enter",
                   "steps_context_exit", "steps_sync", "steps_hook", "steps_hook_begin",
                   "steps_hook_end", "steps_join", "steps_user_sampling", "steps_recorded",
                   "steps_mode", "cpu_step_reads")

_UNRESOLVED: Any = object()
# the library's functions (profiler.collect.native.Functions), None when profiling is off
_lib: Any = _UNRESOLVED
_batch_size: int | None = None  # set_batch_size()
_env_batch: int | None = None
_env_read = False
_every: int | None = None  # HOROVOD_PROFILE_SAMPLE_STEPS, read once (1 = every step)
_schedstat_fd: int | None = None  # /proc/thread-self/schedstat of the thread that opened it
_schedstat_tid = -1


def _library() -> Any:
    """The loaded interposition library, or None when profiling is off.

    The step state lives in the library (hooks/steps.c: one state for every
    way steps are marked, the C step hook of profiler._fastrec included);
    the first call hands it HOROVOD_PROFILE_SAMPLE_STEPS and the batch size.
    The calls made every step (the clock, a boundary) go through
    profiler._fastrec where it is built: the same exports without
    ctypes' argument conversion, which inside a training step costs several
    microseconds a call."""
    global _lib
    if _lib is _UNRESOLVED:
        mod = sys.modules.get("profiler.collect.native")
        lib = mod.loaded() if mod is not None else None  # type: ignore[attr-defined]
        fns = mod.Functions(lib) if mod is not None and lib is not None else None
        if fns is not None and all(getattr(fns, n) is not None for n in _STEP_FUNCTIONS):
            fast = _fastrec()
            if fast is not None:
                for name in FAST_FUNCTIONS:
                    setattr(fns, name, getattr(fast, name))
            _lib = fns
            fns.steps_configure(sample_every(_rank_of(fns)), batch_size())
        else:
            _lib = None
    return _lib


#: the library's functions that profiler._fastrec also exports, called instead
FAST_FUNCTIONS = ("now", "steps_mark", "steps_hook", "steps_hook_begin", "steps_hook_end")


def _fastrec() -> Any:
    """profiler._fastrec with the step functions, or None (not built, an
    older build, the library's exports absent, HOROVOD_PROFILE_FASTREC off:
    profiler.collect.tensors.fast_hooks_wanted, the switch's one reader)."""
    from profiler.collect.tensors import fast_hooks_wanted

    if not fast_hooks_wanted():
        return None
    try:
        import importlib

        # a compiled extension: no source for the import graph to follow
        fast = importlib.import_module("profiler._fastrec")
    except ImportError:
        return None
    if not all(hasattr(fast, n) for n in FAST_FUNCTIONS):
        return None
    return fast if fast.available() and fast.steps_available() else None


def prepare() -> bool:
    """Resolve the library and hand it the step settings; False when
    profiling is off.  The C step hook (profiler._fastrec.StepHook) calls it
    once, at its first step."""
    return (_lib if _lib is not _UNRESOLVED else _library()) is not None


def _check_images(images: int) -> int:
    try:
        n = int(images)
    except (TypeError, ValueError):
        raise UsageError(None, f"images must be an integer, not {images!r}") from None
    if n < 0:
        raise UsageError(None, f"images must be >= 0, not {n}")
    return n


def sample_every(rank: int = 0) -> int:
    """N of HOROVOD_PROFILE_SAMPLE_STEPS (record one step in N); 1 = every step.

    A value that is not a positive integer is ignored with one warning, from
    rank 0 only (`rank`: this process's, when known)."""
    global _every
    if _every is None:
        _every = int(read(SAMPLE_STEPS_ENV, instead="every step is recorded",
                          speak=rank <= 0))
    return _every


def _rank_of(lib: Any) -> int:
    try:
        return int(lib.rank()) if lib.rank is not None else 0
    except (TypeError, ValueError):
        return 0


def step(images: int = 0) -> None:
    """Mark the end of a training step that processed `images` samples on this rank.

    Closes the interval that began at the previous call (the first call opens
    the first interval and records nothing).  A no-op when profiling is off.
    """
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return
    lib.steps_mark(_check_images(images))


@contextmanager
def _step_context(lib: Any, images: int) -> Iterator[None]:
    t0 = int(lib.steps_context_enter())  # the body is the next step
    try:
        yield
    finally:
        lib.steps_context_exit(t0, images)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def step_context(images: int = 0) -> Any:
    """Context manager recording its body as one step: ``with step_context(images=64): ...``.

    A following :func:`step` call closes the interval that began when the
    body ended.  A no-op context when profiling is off.
    """
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return _nothing()
    return _step_context(lib, _check_images(images))


def set_batch_size(n: int | None) -> None:
    """Images per step for steps marked by the optimizer hook (None: back to the
    environment's HOROVOD_PROFILE_BATCH_SIZE, else 0).  Overrides the variable."""
    global _batch_size
    _batch_size = None if n is None else _check_images(n)
    if _lib is not _UNRESOLVED and _lib is not None:
        _lib.steps_set_batch(batch_size())


def _env_batch_size() -> int:
    global _env_batch, _env_read
    if not _env_read:
        _env_read = True
        lib = _lib if _lib is not _UNRESOLVED else None
        _env_batch = setting(BATCH_SIZE_ENV, None, lambda v: _check_images(int(v)),
                             "images per rank per step, 0 or more",
                             instead="images per step unknown",
                             speak=lib is None or _rank_of(lib) <= 0)
    return _env_batch or 0


def batch_size() -> int:
    """Images per step the optimizer hook records (0 = unknown)."""
    return _batch_size if _batch_size is not None else _env_batch_size()


def now() -> int | None:
    """The records' clock now (ticks), None when profiling is off: the
    DistributedOptimizer hook takes it as optimizer.step begins."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    return None if lib is None else int(lib.now())


def schedstat() -> tuple[int, int]:
    """(ns on a CPU, ns waiting on a run queue) of the calling thread so far,
    from Linux schedstat; (-1, -1) where it cannot be read.  One pread on a
    file kept open per thread (about 1.5 us)."""
    global _schedstat_fd, _schedstat_tid
    import os

    try:
        tid = threading.get_native_id()
        if _schedstat_fd is None or _schedstat_tid != tid:
            if _schedstat_fd is not None:
                os.close(_schedstat_fd)
                _schedstat_fd = None
            _schedstat_fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            _schedstat_tid = tid
        f = os.pread(_schedstat_fd, 96, 0).split()
        return int(f[0]), int(f[1])
    except (OSError, ValueError, IndexError):
        return -1, -1


def sync_point() -> tuple[int, int, int] | None:
    """(:func:`now`, then :func:`schedstat`'s two figures) in one call, None
    when profiling is off: what the Python DistributedOptimizer hook reads
    on either side of synchronize (the C hook reads the same itself)."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return None
    t = int(lib.now())
    if not lib.cpu_step_reads():  # a step not read (HOROVOD_PROFILE_CPU), no schedstat
        return (t, -1, -1)
    return (t, *schedstat())


def mark_synchronize(t_in: int, t_out: int, cpu_in: tuple[int, int] = (-1, -1),
                     cpu_out: tuple[int, int] = (-1, -1)) -> None:
    """Called by the DistributedOptimizer hook as its synchronize returns: the
    interval (ticks) the main thread waited for every gradient to be reduced,
    and its schedstat (:func:`schedstat`) at both ends, recorded as the open
    step's "sync" row by :func:`hook_step`."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return
    ok = min(*cpu_in, *cpu_out) >= 0
    lib.steps_sync(int(t_in), int(t_out), cpu_out[0] - cpu_in[0] if ok else -1,
                   cpu_out[1] - cpu_in[1] if ok else -1)


def hook_step(entered: int | None = None, images: int | None = None) -> None:
    """Called by a step hook at each boundary: the DistributedOptimizer hook
    after each optimizer step, TensorFlow's after each call of the step
    function or each eager tape gradient (profiler.collect.tf_hooks).

    The step's "sync" row is the time this rank waited in synchronize for the
    others' gradients (a rank that arrives late waits least): the last
    synchronize of the step (:func:`mark_synchronize`; its bytes = the main
    thread's ns on a CPU in it, count = its ns waiting for a CPU, 0 when not
    read), else [entered, now), with entered the clock (now()) as that
    optimizer.step began, which holds the optimizer update too.
    images: the step's images when the hook knows them (else
    :func:`batch_size`).
    Quiet once the application marks steps itself (:func:`step` or
    :func:`step_context`).  Never raises into the training loop.
    """
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return
    lib.steps_hook(int(entered or 0), -1 if images is None else max(0, int(images)))


def hook_begin() -> None:
    """Called by a framework's hook as a step begins (the Keras callback's
    on_train_batch_begin): opens step number :func:`steps_recorded`, which
    :func:`hook_end` closes.  The time between a hook_end and the next
    hook_begin belongs to no step.  Quiet once the application marks steps
    itself."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is not None:
        lib.steps_hook_begin()


def hook_end(images: int) -> None:
    """Called by a framework's hook as the step :func:`hook_begin` opened ends:
    one step record [begin, now) of `images` images."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is not None:
        lib.steps_hook_end(max(0, int(images)))


def mark_join(t_in: int, t_out: int, last_rank: int) -> None:
    """Called by the hvd.join hook as join returns: one "join" record, the
    interval (ticks) this rank waited in it, count = the rank join returned
    (the last to join; 2**64 - 1 when not a rank), seq = the step records
    written so far (the last step's number + 1)."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return
    last = int(last_rank) if int(last_rank) >= 0 else (1 << 64) - 1
    lib.steps_join(int(t_in), int(t_out), last)


WRAPPED = "__hvprof_wrapped__"  # the original, on each wrapper the hooks install
_join_warned = False


def wrap_join(orig: Any, when: Any = None) -> Any:
    """hvd.join wrapped: the time this rank waits in it becomes one "join"
    row (:func:`mark_join`); only for calls where ``when()`` holds, when
    given (TensorFlow: eager calls; inside tf.function join is only traced).
    The original's result and exceptions pass through untouched."""
    import functools

    @functools.wraps(orig)
    def join(*args: Any, **kwargs: Any) -> Any:
        global _join_warned
        try:
            t_in = now() if when is None or when() else None
        except Exception:  # never break the training loop
            t_in = None
        result = orig(*args, **kwargs)
        if t_in is not None:
            try:
                mark_join(t_in, int(now() or 0), int(result))
            except Exception as exc:  # never break the training loop
                if not _join_warned:
                    _join_warned = True
                    print(f"profiler: warning: join hook failed: {exc}", file=sys.stderr)
        return result

    setattr(join, WRAPPED, orig)
    return join


def steps_recorded() -> int:
    """Step records written by this process so far."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    return 0 if lib is None else int(lib.steps_recorded())


def mode() -> str:
    """How steps are being marked: "off" (profiling off), "none" yet, "hook" or "explicit"."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return "off"
    return ("none", "hook", "explicit")[int(lib.steps_mode())]


def sampling(on: bool) -> None:
    """Resume (True) or pause (False) recording at run time.

    While paused, calls keep their sequence numbers and are counted as
    unsampled (raw header ``unsampled_calls``, trace metadata); step records
    are still written.  Combines with HOROVOD_PROFILE_SAMPLE_STEPS: a call is
    recorded when neither pauses it.  A no-op when profiling is off, and in a
    forked child (the library ignores it there)."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is not None:
        lib.steps_user_sampling(1 if on else 0)


@contextmanager
def _paused(lib: Any) -> Iterator[None]:
    before = int(lib.steps_user_sampling(0))
    try:
        yield
    finally:
        lib.steps_user_sampling(before)


def paused() -> Any:
    """Context manager pausing recording for its body: ``with profiler.paused(): ...``
    (restores the previous setting on exit; nests).  A no-op when profiling is off."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return _nothing()
    return _paused(lib)
