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

When profiling is off (the library was not loaded at start-up) every function
here returns at once, after one cached check.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from profiler._env import at_least, setting
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

_UNRESOLVED: Any = object()
# the library's functions (profiler.collect.native.Functions), None when profiling is off
_lib: Any = _UNRESOLVED

_lock = threading.Lock()
_last: int | None = None  # ticks of the last boundary (start of the open step)
_next_seq = 0  # number of the next step record
_explicit = False  # the application marks steps itself
_hooked = False  # the optimizer hook has marked a boundary
_batch_size: int | None = None  # set_batch_size()
_env_batch: int | None = None
_env_read = False
_user_on = True  # profiler.sampling() / paused()
_steps_on = True  # HOROVOD_PROFILE_SAMPLE_STEPS: the open step is one to record
_every: int | None = None  # HOROVOD_PROFILE_SAMPLE_STEPS, read once (1 = every step)
# the open step's last synchronize: ticks in, out, and the main thread's ns on a
# CPU and waiting for one (schedstat) during it (-1: not read)
_sync: tuple[int, int, int, int] | None = None
_schedstat_fd: int | None = None  # /proc/thread-self/schedstat of the thread that opened it
_schedstat_tid = -1


# profiler._fastrec's sync_point once resolved (None: not built, or
# HOROVOD_PROFILE_FASTREC=0: now() and schedstat() instead)
_sync_point: Any = None


def _library() -> Any:
    """The loaded interposition library, or None when profiling is off.

    The step hook's per-step calls (the clock, the step and sync records) go
    through profiler._fastrec where it is built: the same exports without
    ctypes' argument conversion, which inside a training step costs several
    microseconds a call."""
    global _lib, _sync_point
    if _lib is _UNRESOLVED:
        mod = sys.modules.get("profiler.collect.native")
        lib = mod.loaded() if mod is not None else None  # type: ignore[attr-defined]
        fns = mod.Functions(lib) if mod is not None and lib is not None else None
        if fns is not None and fns.record_app is not None:
            fast = _fastrec()
            if fast is not None:
                fns.now, fns.record_app = fast.now, fast.record_app
                if fns.record_app_cpu is not None:
                    fns.record_app_cpu = fast.record_app_cpu
                _sync_point = fast.sync_point
        _lib = fns if fns is not None and fns.record_app is not None else None
    return _lib


def _fastrec() -> Any:
    """profiler._fastrec with the step hook's calls, or None (not built, an
    older build, the library's exports absent, HOROVOD_PROFILE_FASTREC=0)."""
    import os

    if os.environ.get("HOROVOD_PROFILE_FASTREC", "1") == "0":
        return None
    try:
        import importlib

        # a compiled extension: no source for the import graph to follow
        fast = importlib.import_module("profiler._fastrec")
    except ImportError:
        return None
    if not all(hasattr(fast, n) for n in ("record_app", "record_app_cpu", "sync_point")):
        return None
    return fast if fast.available() else None


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
        _every = setting(SAMPLE_STEPS_ENV, 1, at_least(1, int), "a positive integer",
                         instead="every step is recorded", speak=rank <= 0)
    return _every


def _apply_sampling(lib: Any) -> None:
    """Tell the library whether calls are recorded now (caller holds the lock)."""
    if lib.set_sampling is not None:
        lib.set_sampling(1 if (_user_on and _steps_on) else 0)


def _rank_of(lib: Any) -> int:
    try:
        return int(lib.rank()) if lib.rank is not None else 0
    except (TypeError, ValueError):
        return 0


def _open_step(lib: Any) -> None:
    """Step number _next_seq has just opened: sample it or not (caller holds the lock)."""
    global _steps_on
    every = _every if _every is not None else sample_every(_rank_of(lib))
    if every > 1:
        on = _next_seq % every == 0
        if on != _steps_on:
            _steps_on = on
            _apply_sampling(lib)


def _cpu_baseline(lib: Any) -> None:
    """A step opens with no step closing at the same moment: the library reads
    every thread's CPU figures now, so that the APP_CPU records of the step
    (written with its step record, hooks/cpu.c) cover the step alone."""
    if lib.cpu_baseline is not None:
        lib.cpu_baseline()


def _record(lib: Any, t_start: int, t_end: int, images: int) -> None:
    """Write one step record (caller holds the lock)."""
    global _next_seq
    lib.record_app(APP_STEP, t_start, t_end, images, _next_seq & 0xFFFFFFFF)
    _next_seq += 1


def _boundary(lib: Any, images: int) -> None:
    """Close the open step (if any) at now and open the next (caller holds the lock)."""
    global _last
    now = int(lib.now())
    if _last is not None:
        _record(lib, _last, now, images)
    else:
        _cpu_baseline(lib)
    _last = now
    _open_step(lib)


def step(images: int = 0) -> None:
    """Mark the end of a training step that processed `images` samples on this rank.

    Closes the interval that began at the previous call (the first call opens
    the first interval and records nothing).  A no-op when profiling is off.
    """
    global _explicit, _last
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return
    n = _check_images(images)
    with _lock:
        if not _explicit:
            _explicit = True
            if _hooked:
                # The optimizer hook opened (or recorded) steps before the
                # application started marking its own: restart the open
                # interval here so that no step is counted twice.
                _last = int(lib.now())
                _cpu_baseline(lib)
                _open_step(lib)
                return
        _boundary(lib, n)


@contextmanager
def _step_context(lib: Any, images: int) -> Iterator[None]:
    global _explicit, _last
    with _lock:
        _open_step(lib)  # the body is step number _next_seq
    t0 = int(lib.now())
    _cpu_baseline(lib)
    try:
        yield
    finally:
        with _lock:
            _explicit = True
            t1 = int(lib.now())
            _record(lib, t0, t1, images)
            _last = t1
            _open_step(lib)


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
    when profiling is off: what the DistributedOptimizer hook reads on
    either side of synchronize."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return None
    if _sync_point is not None:
        point: tuple[int, int, int] = _sync_point()
        return point
    t = int(lib.now())
    return (t, *schedstat())


def mark_synchronize(t_in: int, t_out: int, cpu_in: tuple[int, int] = (-1, -1),
                     cpu_out: tuple[int, int] = (-1, -1)) -> None:
    """Called by the DistributedOptimizer hook as its synchronize returns: the
    interval (ticks) the main thread waited for every gradient to be reduced,
    and its schedstat (:func:`schedstat`) at both ends, recorded as the open
    step's "sync" row by :func:`hook_step`."""
    global _sync
    ok = min(*cpu_in, *cpu_out) >= 0
    _sync = (int(t_in), int(t_out), cpu_out[0] - cpu_in[0] if ok else -1,
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
    global _hooked, _sync
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None or _explicit:
        return
    with _lock:
        if _explicit:
            return
        _hooked = True
        span, _sync = _sync, None
        if _last is not None:
            if span is not None and span[0] >= _last:
                if span[2] >= 0 and lib.record_app_cpu is not None:
                    lib.record_app_cpu(APP_SYNC, span[0], span[1], span[2], span[3],
                                       _next_seq & 0xFFFFFFFF)
                else:
                    lib.record_app(APP_SYNC, span[0], span[1], 0, _next_seq & 0xFFFFFFFF)
            elif entered is not None:
                lib.record_app(APP_SYNC, int(entered), int(lib.now()), 0,
                               _next_seq & 0xFFFFFFFF)
        _boundary(lib, batch_size() if images is None else max(0, int(images)))


_begun: int | None = None  # hook_begin's clock, until its hook_end


def hook_begin() -> None:
    """Called by a framework's hook as a step begins (the Keras callback's
    on_train_batch_begin): opens step number :func:`steps_recorded`, which
    :func:`hook_end` closes.  The time between a hook_end and the next
    hook_begin belongs to no step.  Quiet once the application marks steps
    itself."""
    global _hooked, _begun
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None or _explicit:
        return
    with _lock:
        if _explicit:
            return
        _hooked = True
        _open_step(lib)
        _begun = int(lib.now())
        _cpu_baseline(lib)


def hook_end(images: int) -> None:
    """Called by a framework's hook as the step :func:`hook_begin` opened ends:
    one step record [begin, now) of `images` images."""
    global _last, _begun
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None or _explicit or _begun is None:
        return
    with _lock:
        if _explicit or _begun is None:
            return
        now = int(lib.now())
        _record(lib, _begun, now, max(0, int(images)))
        _last, _begun = now, None
        _open_step(lib)


def mark_join(t_in: int, t_out: int, last_rank: int) -> None:
    """Called by the hvd.join hook as join returns: one "join" record, the
    interval (ticks) this rank waited in it, count = the rank join returned
    (the last to join; 2**64 - 1 when not a rank), seq = the step records
    written so far (the last step's number + 1)."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return
    last = int(last_rank) if int(last_rank) >= 0 else (1 << 64) - 1
    lib.record_app(APP_JOIN, int(t_in), int(t_out), last, _next_seq & 0xFFFFFFFF)


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
    return _next_seq


def mode() -> str:
    """How steps are being marked: "off" (profiling off), "none" yet, "hook" or "explicit"."""
    if (_lib if _lib is not _UNRESOLVED else _library()) is None:
        return "off"
    if _explicit:
        return "explicit"
    return "hook" if _hooked else "none"


def sampling(on: bool) -> None:
    """Resume (True) or pause (False) recording at run time.

    While paused, calls keep their sequence numbers and are counted as
    unsampled (raw header ``unsampled_calls``, trace metadata); step records
    are still written.  Combines with HOROVOD_PROFILE_SAMPLE_STEPS: a call is
    recorded when neither pauses it.  A no-op when profiling is off, and in a
    forked child (the library ignores it there)."""
    global _user_on
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return
    with _lock:
        _user_on = bool(on)
        _apply_sampling(lib)


@contextmanager
def _paused(lib: Any) -> Iterator[None]:
    global _user_on
    with _lock:
        before = _user_on
        _user_on = False
        _apply_sampling(lib)
    try:
        yield
    finally:
        with _lock:
            _user_on = before
            _apply_sampling(lib)


def paused() -> Any:
    """Context manager pausing recording for its body: ``with profiler.paused(): ...``
    (restores the previous setting on exit; nests).  A no-op when profiling is off."""
    lib = _lib if _lib is not _UNRESOLVED else _library()
    if lib is None:
        return _nothing()
    return _paused(lib)
