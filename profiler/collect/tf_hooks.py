"""Step detection without code change for TensorFlow and Keras jobs under Horovod.

Two hooks, installed when their Horovod module is imported
(:mod:`profiler.collect.horovod_hooks` notices it).

**Custom loops** (``horovod.tensorflow``): ``hvd.DistributedGradientTape``
builds its class from a copy of the namespace of the template class
``_DistributedGradientTape``, so wrapping the template's ``gradient`` reaches
every tape the job makes.

* Eager: ``gradient`` runs every step.  Each call is a step boundary: a step
  runs from one ``gradient`` to the next, as a PyTorch step runs from one
  ``optimizer.step`` to the next.
* Inside ``tf.function``: ``gradient`` runs once, while the function is
  traced.  It then marks the outermost ``tf.function`` being called as the
  job's step function, and every later call of that function, which the job
  makes from Python at run time, ends a step (``tf.function``'s ``__call__``
  is wrapped: one Python frame per call).
* Images per step: :func:`profiler.collect.steps.batch_size` when set, else
  the batch dimension of the step function's first argument that has one (an
  inference: the trace's ``steps_marked_by`` states the rule); eager steps:
  the batch size only.

``hvd.join`` called eagerly is recorded as for PyTorch: one "join" row, the
time this rank waited in it (:func:`profiler.collect.steps.mark_join`).

**Keras** (``horovod.tensorflow.keras``):

``fit`` of the Keras ``Model`` that Horovod uses
(``horovod.tensorflow.keras.keras.Model``: tf.keras, which is tf_keras when
``TF_USE_LEGACY_KERAS=1``) is wrapped.  The wrapper adds one callback to the
job's own list; nothing else about the call changes.

Why a callback: ``fit`` runs the training step inside a ``tf.function``, so a
Python wrapper around the optimizer runs once, while tracing.  Keras's own
loop stays in Python and calls ``on_train_batch_begin`` and
``on_train_batch_end`` around every execution of that function, at run time.

What a step is: one execution of the training function, from its
``on_train_batch_begin`` to its ``on_train_batch_end``.  With
``steps_per_execution=k`` one execution runs k batches, and the step record
counts their images.  The time between executions (other callbacks, the
epoch's end, validation) belongs to no step.

Images per step: the batch size ``fit`` was given (32, Keras's default, for
arrays), times the batches of the execution; the last batch of an epoch holds
what is left of the samples.  For a dataset, its static batch dimension, else
:func:`profiler.collect.steps.batch_size` (``HOROVOD_PROFILE_BATCH_SIZE``).

Never raises into the job: a failure is one warning and ``fit`` goes on
unobserved.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from types import ModuleType
from typing import Any, Callable

from profiler.collect import selfcost, steps

__all__ = ["KERAS", "TF", "KERAS_MARK", "FUNCTION_MARK", "EAGER_MARK", "patch_module",
           "unpatch_module", "images_of", "marked_by"]

TF = "horovod.tensorflow"
KERAS = "horovod.tensorflow.keras"
TAPE_TEMPLATE = "_DistributedGradientTape"
# what marked the steps, as the trace says it (steps_marked_by)
KERAS_MARK = "Keras model.fit (one step per run of its training function)"
FUNCTION_MARK = ("tf.function calls (the function that traced DistributedGradientTape.gradient;"
                 " images: HOROVOD_PROFILE_BATCH_SIZE, else its first argument's batch dimension)")
EAGER_MARK = "DistributedGradientTape.gradient (eager: one call to the next)"
_WRAPPED = steps.WRAPPED
_CALLBACKS_ARG = 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)
_BATCH_ARG = 2
KERAS_DEFAULT_BATCH = 32

_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"profiler: warning: {message}", file=sys.stderr)


def _samples(x: Any) -> int | None:
    """Samples in array-like input (numpy, a tensor, a list or dict of them)."""
    if isinstance(x, dict):
        x = next(iter(x.values()), None)
    elif isinstance(x, (list, tuple)) and x and hasattr(x[0], "shape"):
        x = x[0]
    shape = getattr(x, "shape", None)
    try:
        return int(shape[0]) if shape is not None and shape[0] is not None else None
    except (TypeError, ValueError, IndexError):
        return None


def _measured(work: Callable[[], Any]) -> None:
    """Run a hook's work, its cost measured as the PyTorch hooks' are
    (profiler.collect.selfcost: sampled, into the trace's self_cost)."""
    if selfcost.sample():
        opened = selfcost.start()
        work()
        selfcost.close(opened)
    else:
        work()


def _dataset_batch(x: Any) -> int | None:
    """The static batch dimension of a tf.data.Dataset's first component."""
    spec = getattr(x, "element_spec", None)
    while isinstance(spec, (tuple, list)) and spec:
        spec = spec[0]
    if isinstance(spec, dict):
        spec = next(iter(spec.values()), None)
    shape = getattr(spec, "shape", None)
    try:
        dim = shape[0] if shape is not None and len(shape) else None
        return int(dim) if dim is not None else None
    except (TypeError, ValueError):
        return None


def images_of(first: int, last: int, batch: int, samples: int | None) -> int:
    """Images in batches first..last (inclusive) of an epoch of `samples`
    samples in batches of `batch` (the last one holds the remainder)."""
    if batch <= 0:
        return 0
    n = batch * (last - first + 1)
    if samples is not None:
        n = max(0, min(n, samples - first * batch))
    return n


class _Shape:
    """How ``fit`` was called: images per batch and samples per epoch."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.get("x")
        batch = args[_BATCH_ARG] if len(args) > _BATCH_ARG else kwargs.get("batch_size")
        self.samples: int | None = None
        if hasattr(x, "element_spec"):
            self.batch = _dataset_batch(x) or 0
        elif (n := _samples(x)) is not None:
            self.batch = int(batch) if batch else KERAS_DEFAULT_BATCH
            # epochs need not end where the arrays do when steps_per_epoch is given
            self.samples = None if kwargs.get("steps_per_epoch") else n
        else:
            self.batch = int(batch) if batch else 0  # a generator or Sequence
        if not self.batch:
            self.batch = steps.batch_size()


def _callback_class(keras: Any) -> type:
    """A Callback subclass of `keras` (built once per Keras module)."""
    cached = getattr(keras, "__hvprof_callback__", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]

    class ProfilerSteps(keras.callbacks.Callback):  # type: ignore[misc]
        """Marks one profiler step per execution of the training function."""

        def __init__(self, shape: _Shape) -> None:
            super().__init__()
            self._shape = shape
            self._first = 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            _state["marked_by"] = KERAS_MARK
            try:
                self._first = int(batch)
                _measured(steps.hook_begin)
            except Exception as exc:  # never break the training loop
                _warn_once(f"Keras step hook failed: {exc}")

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            try:
                s = self._shape
                n = images_of(self._first, max(int(batch), self._first), s.batch, s.samples)
                _measured(lambda: steps.hook_end(n))
            except Exception as exc:  # never break the training loop
                _warn_once(f"Keras step hook failed: {exc}")

    try:
        keras.__hvprof_callback__ = ProfilerSteps
    except Exception:  # a module that refuses attributes: build it again next time
        pass
    return ProfilerSteps


def _wrap_fit(orig: Callable[..., Any], keras: Any) -> Callable[..., Any]:
    @functools.wraps(orig)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            cb = _callback_class(keras)(_Shape(args, kwargs))
            if len(args) > _CALLBACKS_ARG:
                given = args[_CALLBACKS_ARG]
                args = (*args[:_CALLBACKS_ARG], [*(given or []), cb], *args[_CALLBACKS_ARG + 1:])
            else:
                kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), cb]
        except Exception as exc:  # never break the training loop
            _warn_once(f"could not watch model.fit's steps: {exc}")
        return orig(self, *args, **kwargs)

    setattr(fit, _WRAPPED, orig)
    return fit


def _model_class(module: ModuleType) -> Any:
    keras = getattr(module, "keras", None)
    return keras, getattr(keras, "Model", None)


def _patch_keras(module: ModuleType) -> bool:
    """Wrap ``fit`` of the Keras Model that `module` (horovod.tensorflow.keras)
    uses.  Idempotent; True when newly wrapped."""
    keras, model = _model_class(module)
    if model is None:
        return False
    # fit is defined on Keras's base Model class, which keras.Model may only inherit
    owner = next((c for c in model.__mro__ if "fit" in c.__dict__), None)
    if owner is None:
        return False
    orig = owner.__dict__["fit"]
    if getattr(orig, _WRAPPED, None) is not None:
        return False
    owner.fit = _wrap_fit(orig, keras)
    return True


def _unpatch_keras(module: ModuleType) -> None:
    _, model = _model_class(module)
    if model is None:
        return
    for c in model.__mro__:
        orig = getattr(c.__dict__.get("fit"), _WRAPPED, None)
        if orig is not None:
            c.fit = orig


# --- custom loops: DistributedGradientTape and tf.function -------------------

_tls = threading.local()  # .calls: the tf.functions being called, outermost first
_step_functions: weakref.WeakSet[Any] = weakref.WeakSet()
# What marked the steps: kept in a dict, never by rebinding a global, so that
# it holds even where AutoGraph runs a converted copy of a wrapper.
_state: dict[str, str | None] = {"marked_by": None}


def marked_by() -> str | None:
    """Which TensorFlow hook marked this process's steps (None: none did)."""
    return _state["marked_by"]


def _first_batch(args: tuple[Any, ...]) -> int:
    for a in args:
        shape = getattr(a, "shape", None)
        try:
            if shape is not None and len(shape) >= 1 and shape[0] is not None:
                return int(shape[0])
        except (TypeError, ValueError):
            continue
    return 0


def _wrap_call(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls = getattr(_tls, "calls", None)
        if calls is None:
            calls = _tls.calls = []
        calls.append(self)
        try:
            result = orig(self, *args, **kwargs)
        finally:
            calls.pop()
        if not calls and self in _step_functions:
            try:
                _measured(lambda: steps.hook_step(
                    None, images=steps.batch_size() or _first_batch(args)))
            except Exception as exc:  # never break the training loop
                _warn_once(f"tf.function step hook failed: {exc}")
        return result

    setattr(__call__, _WRAPPED, orig)
    return __call__


def _wrap_gradient(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def gradient(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig(self, *args, **kwargs)
        try:
            calls = getattr(_tls, "calls", None)
            if calls:  # being traced: the outermost tf.function is the step
                _step_functions.add(calls[0])
                _state["marked_by"] = FUNCTION_MARK
            else:
                import tensorflow as tf

                if not tf.inside_function():  # eager: this call is the boundary
                    _state["marked_by"] = EAGER_MARK
                    _measured(steps.hook_step)
        except Exception as exc:  # never break the training loop
            _warn_once(f"DistributedGradientTape step hook failed: {exc}")
        return result

    # Inside tf.function, AutoGraph runs a converted copy of this wrapper, as
    # it converts the tape's own gradient when there is no wrapper: state
    # goes through mutable objects (_state, _step_functions), never `global`.
    setattr(gradient, _WRAPPED, orig)
    return gradient


def _function_class() -> Any:
    import tensorflow as tf

    return type(tf.function(lambda: None))


def _eager() -> bool:
    import tensorflow as tf

    return bool(tf.executing_eagerly())


JOIN_MODULES = ("horovod.tensorflow.mpi_ops", TF)  # where hvd.join is bound


def _patch_join() -> None:
    """Wrap hvd.join (eager calls: the time this rank waits in it, as for
    PyTorch; profiler.collect.steps.mark_join), in the module that defines it
    and in the package that re-exports it."""
    ops = sys.modules.get(JOIN_MODULES[0])
    orig = ops.__dict__.get("join") if ops is not None else None
    if orig is None or getattr(orig, _WRAPPED, None) is not None:
        return
    wrapped = steps.wrap_join(orig, when=_eager)
    for name in JOIN_MODULES:
        mod = sys.modules.get(name)
        if mod is not None and mod.__dict__.get("join") is orig:
            setattr(mod, "join", wrapped)  # noqa: B010


def _unpatch_join() -> None:
    for name in JOIN_MODULES:
        mod = sys.modules.get(name)
        orig = getattr(mod.__dict__.get("join"), _WRAPPED, None) if mod is not None else None
        if orig is not None:
            setattr(mod, "join", orig)  # noqa: B010


def _patch_tape(module: ModuleType) -> bool:
    tape: Any = getattr(module, TAPE_TEMPLATE, None)
    orig = tape.__dict__.get("gradient") if tape is not None else None
    if orig is None or getattr(orig, _WRAPPED, None) is not None:
        return False
    fn = _function_class()
    call = fn.__dict__.get("__call__")
    if call is not None and getattr(call, _WRAPPED, None) is None:
        fn.__call__ = _wrap_call(call)
    tape.gradient = _wrap_gradient(orig)
    return True


def _unpatch_tape(module: ModuleType) -> None:
    tape: Any = getattr(module, TAPE_TEMPLATE, None)
    orig = getattr(tape.__dict__.get("gradient"), _WRAPPED, None) if tape is not None else None
    if orig is not None:
        tape.gradient = orig
    fn = _function_class()
    call = getattr(fn.__dict__.get("__call__"), _WRAPPED, None)
    if call is not None:
        fn.__call__ = call


def patch_module(module: ModuleType) -> bool:
    """Install the hook of `module` (horovod.tensorflow or horovod.tensorflow.keras).
    Idempotent; True when newly installed."""
    if module.__name__ == KERAS:
        return _patch_keras(module)
    if module.__name__ == TF:
        try:
            _patch_join()
        except Exception as exc:  # a Horovod whose layout we do not know
            _warn_once(f"could not wrap hvd.join: {exc}")
        return _patch_tape(module)
    return False


def unpatch_module(module: ModuleType) -> None:
    """Undo :func:`patch_module` (for tests)."""
    if module.__name__ == KERAS:
        _unpatch_keras(module)
    elif module.__name__ == TF:
        _unpatch_tape(module)
        _unpatch_join()
