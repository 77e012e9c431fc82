"""Step detection without code change: ``hvd.DistributedOptimizer`` (PyTorch), Keras.

``horovod.torch.DistributedOptimizer(opt)`` builds a new class each time it
is called, from a copy of the namespace of ``horovod.torch.optimizer.
_DistributedOptimizer`` (or ``_DistributedAdasumOptimizer``).  Wrapping the
``step`` function of those two template classes as soon as their module is
imported therefore reaches every DistributedOptimizer the job creates.  The
wrapper calls the original ``step`` and then marks the step's boundary
(:func:`profiler.collect.steps.hook_step`).  The wrappers are C
(``profiler._fastrec.StepHook``, straight into the library's step state,
hooks/steps.c) where the extension is built, else the Python functions below.
Their ``synchronize`` is wrapped too: the interval the main thread spends in
it (waiting for every gradient to be reduced) becomes the step's "sync" row,
apart from the optimizer update that follows it.

The same finder patches ``horovod.torch.mpi_ops`` when it is imported: its
private entry points then record every tensor handed to Horovod
(:mod:`profiler.collect.tensors`), and its ``join`` (re-exported as
``hvd.join``, which imports it after the patch) records the time this rank
waits in it as a "join" row (:func:`profiler.collect.steps.mark_join`).

:func:`install` adds a ``sys.meta_path`` finder that notices the import of
``horovod.torch.optimizer`` and patches the module right after it executes.
The imports of ``horovod.tensorflow`` and ``horovod.tensorflow.keras`` are
noticed the same way: ``DistributedGradientTape`` and Keras's ``model.fit``
then mark steps (:mod:`profiler.collect.tf_hooks`), and before
``horovod.tensorflow.mpi_ops`` loads Horovod's kernel library, the kernel
hooks that record TensorFlow's tensors are armed
(:mod:`profiler.collect.tf_kernels`).  Right after either Horovod extension
loads, the library's Gloo wrappers are armed in it (:func:`arm_gloo`,
hooks/gloo.c), before ``hvd.init`` can run a Gloo collective.  In an elastic
job, ``hvd.init`` and ``hvd.shutdown`` are wrapped too: each reset's epoch is
one line of the process's epochs sidecar (profiler.formats.epochs).  The
import of ``horovod.ray`` or ``horovod.spark`` marks a driver, which merges
its workers' profile at its exit (profiler.collect.driver).

It imports neither torch nor Horovod (start-up cost: a list insert).  If the
module is already imported, it is patched at once.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

__all__ = ["TARGET", "install", "uninstall", "installed", "patch_module", "arm_gloo"]

TARGET = "horovod.torch.optimizer"
MPI_OPS = "horovod.torch.mpi_ops"
KERAS = "horovod.tensorflow.keras"  # profiler.collect.tf_hooks.KERAS
TF_MODULES = ("horovod.tensorflow", KERAS)  # patched by profiler.collect.tf_hooks
#: loads Horovod's TensorFlow kernel library: the kernel hooks (loaded at
#: activation) are armed first (profiler.collect.tf_kernels)
TF_MPI_OPS = "horovod.tensorflow.mpi_ops"
#: imported by a process that starts Horovod's workers (profiler.collect.driver)
DRIVER_MODULES = ("horovod.ray", "horovod.spark")
TEMPLATE_CLASSES = ("_DistributedOptimizer", "_DistributedAdasumOptimizer")
_WRAPPED = "__hvprof_wrapped__"


_mods: tuple[Any, Any] | None = None


def _modules() -> tuple[Any, Any]:
    """(profiler.collect.selfcost, profiler.collect.steps), imported on the
    first step: not at start-up, and not once a call after."""
    global _mods
    if _mods is None:
        from profiler.collect import selfcost, steps

        _mods = (selfcost, steps)
    return _mods


def _c_hook(orig: Callable[..., Any], kind: int) -> Callable[..., Any] | None:
    """profiler._fastrec.StepHook for `orig` (kind 0: step, 1: synchronize):
    the same work as the Python wrappers below, without a Python frame in
    the step (the step state is the library's: hooks/steps.c); None where
    the extension is not built or HOROVOD_PROFILE_FASTREC=0."""
    from profiler.collect import steps, tensors

    fast = tensors.fast_module()
    if fast is None or not hasattr(fast, "StepHook") or not fast.steps_available():
        return None
    hook: Callable[..., Any] = fast.StepHook(orig, kind, steps.prepare)
    return hook


def _wrap_step(orig: Callable[..., Any]) -> Callable[..., Any]:
    hook = _c_hook(orig, 0)
    if hook is not None:
        return hook

    @functools.wraps(orig)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        selfcost, steps = _mods or _modules()
        measured = selfcost.sample()
        w0 = selfcost.wall() if measured else 0
        try:
            entered = steps.now()
        except Exception:  # never break the training loop
            entered = None
        before = selfcost.wall() - w0 if measured else 0
        result = orig(self, *args, **kwargs)
        opened = selfcost.start() if measured else None
        try:
            steps.hook_step(entered)
            if opened is not None:
                selfcost.close(opened, before)
        except Exception as exc:  # never break the training loop
            _warn_once(f"step hook failed: {exc}")
        return result

    setattr(step, _WRAPPED, orig)
    return step


def _wrap_synchronize(orig: Callable[..., Any]) -> Callable[..., Any]:
    hook = _c_hook(orig, 1)
    if hook is not None:
        return hook

    @functools.wraps(orig)
    def synchronize(self: Any, *args: Any, **kwargs: Any) -> Any:
        selfcost, steps = _mods or _modules()
        measured = selfcost.sample()  # its two schedstat reads are its cost
        w0 = selfcost.wall() if measured else 0
        try:
            p0 = steps.sync_point()
        except Exception:  # never break the training loop
            p0 = None
        before = selfcost.wall() - w0 if measured else 0
        result = orig(self, *args, **kwargs)
        if p0 is not None:
            opened = selfcost.start() if measured else None
            try:
                p1 = steps.sync_point()
                if p1 is not None:
                    steps.mark_synchronize(p0[0], p1[0], (p0[1], p0[2]), (p1[1], p1[2]))
                if opened is not None:
                    selfcost.close(opened, before)
            except Exception as exc:  # never break the training loop
                _warn_once(f"synchronize hook failed: {exc}")
        return result

    setattr(synchronize, _WRAPPED, orig)
    return synchronize


_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "step": _wrap_step, "synchronize": _wrap_synchronize}

_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"profiler: warning: {message}", file=sys.stderr)


TIMELINE_DRAIN_S = 0.2


def timeline_on() -> bool:
    """Horovod writes a timeline in this job: the user's, or the profiler's
    (set by the library at MPI_Init when HOROVOD_PROFILE_TIMELINE=1; off by
    default: it costs a quarter to a third of the throughput, and the fusion
    lineage comes from the profiler's own records)."""
    if os.environ.get("HOROVOD_TIMELINE"):
        return True
    from profiler._env import read

    return bool(read("HOROVOD_PROFILE_TIMELINE"))


def _let_timeline_drain() -> None:
    time.sleep(TIMELINE_DRAIN_S)


def patch_module(module: ModuleType) -> int:
    """Wrap ``step`` and ``synchronize`` of the DistributedOptimizer template
    classes in `module`.

    Idempotent.  Returns the number of classes whose ``step`` was newly wrapped.
    """
    n = 0
    for name in TEMPLATE_CLASSES:
        cls = getattr(module, name, None)
        if cls is None:
            continue
        for method, wrap in _WRAPPERS.items():
            orig = cls.__dict__.get(method)
            if orig is None or getattr(orig, _WRAPPED, None) is not None:
                continue
            setattr(cls, method, wrap(orig))
            n += method == "step"
    return n


def unpatch_module(module: ModuleType) -> None:
    """Undo :func:`patch_module` (for tests)."""
    for name in TEMPLATE_CLASSES:
        cls = getattr(module, name, None)
        if cls is None:
            continue
        for method in _WRAPPERS:
            wrapped = cls.__dict__.get(method)
            orig = getattr(wrapped, _WRAPPED, None)
            if orig is not None:
                setattr(cls, method, orig)


# Plain classes, not importlib.abc subclasses: importing importlib.abc costs
# ~15 ms at start-up; the import system only needs the methods.
class _PatchingLoader:
    """Delegates to the real loader, then patches the executed module."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        if module.__name__ in DRIVER_MODULES:  # a Ray or Spark driver
            _watch_driver()
            self._inner.exec_module(module)
            return
        if module.__name__ == TF_MPI_OPS:
            _load_tf_kernels()
            self._inner.exec_module(module)
            arm_gloo()
            return
        self._inner.exec_module(module)
        if module.__name__ == MPI_OPS:
            arm_gloo()
            _patch_mpi_ops(module)
            return
        if module.__name__ in TF_MODULES:
            _patch_tf(module)
            return
        try:
            patch_module(module)
        except Exception as exc:  # a Horovod whose layout we do not know
            _warn_once(f"could not wrap DistributedOptimizer.step: {exc}")
        if timeline_on():
            # Registered after Horovod's own exit handler (hvd.shutdown, from
            # horovod.torch.mpi_ops), so it runs before it: Horovod's timeline
            # writer drops what is still queued at shutdown.
            import atexit

            atexit.register(_let_timeline_drain)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...
        return getattr(self._inner, name)


class _HorovodFinder:
    """Finds ``horovod.torch.optimizer`` with the other finders, wraps its loader."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if (fullname != TARGET and fullname != MPI_OPS and fullname != TF_MPI_OPS
                and fullname not in TF_MODULES and fullname not in DRIVER_MODULES):
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _HorovodFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader)
            return spec
        return None


_finder: _HorovodFinder | None = None


def install() -> None:
    """Register the import hook (idempotent); patch at once if already imported."""
    global _finder
    if _finder is None:
        _finder = _HorovodFinder()
        sys.meta_path.insert(0, _finder)
    module = sys.modules.get(TARGET)
    if module is not None:
        patch_module(module)
    ops = sys.modules.get(MPI_OPS)
    if ops is not None:
        _patch_mpi_ops(ops)
    for name in TF_MODULES:
        tf_module = sys.modules.get(name)
        if tf_module is not None:
            _patch_tf(tf_module)
    if TF_MPI_OPS in sys.modules:
        from profiler.collect import tf_kernels

        tf_kernels.note_late_load()
    if ops is not None or TF_MPI_OPS in sys.modules:
        arm_gloo()
    if any(name in sys.modules for name in DRIVER_MODULES):
        _watch_driver()


def _watch_driver() -> None:
    """This process starts Horovod's workers through Ray or Spark: merge what
    they leave at its exit (profiler.collect.driver)."""
    try:
        from profiler.collect import driver

        driver.watch()
    except Exception as exc:  # never let the hook stop the application's import
        _warn_once(f"the driver will not merge its workers' profile: {exc}")


def arm_gloo() -> int | None:
    """Wrap the Gloo collectives of every loaded Horovod extension
    (hooks/gloo.c), right after its import: before hvd.init starts the
    background thread that runs them.  Idempotent; under MPI the wrappers are
    armed but never called (Horovod then runs no Gloo op)."""
    try:
        from profiler.collect import native

        return native.gloo_arm(None)
    except Exception as exc:  # never let the hook stop the application's import
        _warn_once(f"could not watch Horovod's Gloo collectives: {exc}")
        return None


def _load_tf_kernels() -> None:
    """Before Horovod's TensorFlow kernels load: arm the kernel hooks (a
    failure is kept as the reason the tensors are not recorded)."""
    try:
        from profiler.collect import tf_kernels

        tf_kernels.arm()
    except Exception as exc:  # never let the hook stop the application's import
        _warn_once(f"could not record TensorFlow's tensors: {exc}")


def _patch_tf(module: ModuleType) -> None:
    try:
        from profiler.collect import tf_hooks

        tf_hooks.patch_module(module)
    except Exception as exc:  # a TensorFlow or Keras whose layout we do not know
        _warn_once(f"could not watch TensorFlow's steps in {module.__name__}: {exc}")


JOIN = "join"
JOIN_MODULES = (MPI_OPS, "horovod.torch")  # where hvd.join is bound


def _patch_join(module: ModuleType) -> None:
    """Wrap `module`.join (idempotent); the package's re-export when it is
    already bound to the original (install() after `import horovod.torch`)."""
    orig = module.__dict__.get(JOIN)
    if orig is None or getattr(orig, _WRAPPED, None) is not None:
        return
    from profiler.collect.steps import wrap_join

    wrapped = wrap_join(orig)
    setattr(module, JOIN, wrapped)
    pkg = sys.modules.get("horovod.torch")
    if pkg is not None and pkg is not module and pkg.__dict__.get(JOIN) is orig:
        setattr(pkg, JOIN, wrapped)


def _unpatch_join() -> None:
    for name in JOIN_MODULES:
        module = sys.modules.get(name)
        orig = getattr(module.__dict__.get(JOIN), _WRAPPED, None) if module else None
        if module is not None and orig is not None:
            setattr(module, JOIN, orig)


def _patch_mpi_ops(module: ModuleType) -> None:
    try:
        from profiler.collect import tensors

        tensors.patch_module(module)
    except Exception as exc:  # a Horovod whose layout we do not know
        _warn_once(f"could not wrap Horovod's collectives: {exc}")
    try:
        _patch_join(module)
    except Exception as exc:  # a Horovod whose layout we do not know
        _warn_once(f"could not wrap hvd.join: {exc}")
    if os.environ.get("HOROVOD_ELASTIC") == "1":
        try:
            _patch_epochs(module)
        except Exception as exc:  # a Horovod whose layout we do not know
            _warn_once(f"could not watch elastic Horovod's resets: {exc}")


# Elastic Horovod (horovodrun sets HOROVOD_ELASTIC=1 in its workers): a reset
# is hvd.shutdown then hvd.init in the same process (horovod.torch.elastic
# imports both from mpi_ops after this patch).  Each init that returns and
# each shutdown is one line of the process's epochs sidecar
# (profiler.formats.epochs), written at once: the merge rebuilds the
# membership epochs from them (profiler.postjob.epochs).
EPOCH_FUNCTIONS = ("init", "shutdown")


def _epoch_event(event: dict[str, Any]) -> None:
    from profiler.collect import native
    from profiler.formats import epochs

    raw = native.raw_path() if native.loaded() is not None else ""
    if raw:
        epochs.append(raw, {**event, "pid": os.getpid()})


def _wrap_init(orig: Callable[..., Any], module: ModuleType) -> Callable[..., Any]:
    @functools.wraps(orig)
    def init(*args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic_ns()
        try:
            from profiler.collect import native

            begin = native.function("hvprof_gloo_epoch_begin")
            if begin is not None:
                begin()
        except Exception as exc:  # never break the job's init
            _warn_once(f"elastic epoch not marked: {exc}")
        result = orig(*args, **kwargs)
        try:
            _epoch_event({"event": "init", "t0_ns": t0, "t1_ns": time.monotonic_ns(),
                          "rank": int(module.rank()), "size": int(module.size()),
                          "local_rank": int(module.local_rank())})
        except Exception as exc:  # never break the job's init
            _warn_once(f"elastic epoch not recorded: {exc}")
        return result

    setattr(init, _WRAPPED, orig)
    return init


def _wrap_shutdown(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def shutdown(*args: Any, **kwargs: Any) -> Any:
        try:
            _epoch_event({"event": "shutdown", "t_ns": time.monotonic_ns()})
        except Exception as exc:  # never break the job's shutdown
            _warn_once(f"elastic reset not recorded: {exc}")
        return orig(*args, **kwargs)

    setattr(shutdown, _WRAPPED, orig)
    return shutdown


def _patch_epochs(module: ModuleType) -> None:
    """Wrap `module`.init and .shutdown (idempotent)."""
    for name in EPOCH_FUNCTIONS:
        orig = module.__dict__.get(name)
        if orig is None or getattr(orig, _WRAPPED, None) is not None:
            continue
        setattr(module, name, _wrap_init(orig, module) if name == "init"
                else _wrap_shutdown(orig))


def _unpatch_epochs(module: ModuleType) -> None:
    for name in EPOCH_FUNCTIONS:
        orig = getattr(module.__dict__.get(name), _WRAPPED, None)
        if orig is not None:
            setattr(module, name, orig)


def uninstall() -> None:
    """Remove the import hook and unwrap an imported optimizer module (for tests)."""
    global _finder
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None
    module = sys.modules.get(TARGET)
    if module is not None:
        unpatch_module(module)
    ops = sys.modules.get(MPI_OPS)
    if ops is not None:
        from profiler.collect import tensors

        tensors.unpatch_module(ops)
        _unpatch_epochs(ops)
    _unpatch_join()
    for name in TF_MODULES:
        tf_module = sys.modules.get(name)
        if tf_module is not None:
            from profiler.collect import tf_hooks

            tf_hooks.unpatch_module(tf_module)


def installed() -> bool:
    """Whether the import hook is registered."""
    return _finder is not None
