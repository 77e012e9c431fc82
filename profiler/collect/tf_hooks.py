"""Step detection without code change for TensorFlow and Keras jobs under Horovod.

Two hooks, installed when their Horovod module is imported
(:mod:`profiler.collect.horovod_hooks` notices it).

**Custom loops** (``horovod.tensorflow``): ``hvd.DistributedGradientTape``
builds its class from a copy of the namespace of the template class
``_DistributedGradientTape``, so wrapping the template's ``gradient`` reaches
every tape the job makes.

* Eager: ``gradient`` runs every step.  Each call is a step boundary: a step
  runs from one ``gradient`` to the next, as a PyTorch step runs from one
  ``optimizer.step`` to the next (N calls make N - 1 steps).
* Inside ``tf.function``: ``gradient`` runs once per trace.  It then marks
  the outermost ``tf.function`` being called as the job's step function, and
  every call of that function, which the job makes from Python at run time,
  is one step, from the call to its return (``tf.function``'s ``__call__``
  is wrapped: one Python frame per call), so N calls make N steps.  The call
  that traced it first is a step too, from the moment its gradient was
  traced (the tracing before it is not counted); a call traced apart (another
  Python argument) is a call of the same function.
* Images per step: :func:`profiler.collect.steps.batch_size` when set, else
  the batch dimension of the step function's first argument that has one,
  else the batch inferred from its graph when it was traced (the static first
  dimension shared by the inputs the loss was computed from: the function's
  placeholders and captured tensors, the batches ``next(iterator)`` yields,
  constant arrays), each an inference that the trace's ``steps_marked_by``
  states; eager steps: the batch size only.  When none is known, one line
  (rank 0, once) says how to give it, and ``steps_marked_by`` says so too.
* The step's wait for Horovod, its "sync" row (what the step breakdown
  splits, as PyTorch's synchronize): from the last tensor a Horovod kernel
  was handed in the step to the last one Horovod handed back
  (profiler.collect.tf_kernels.take_window; absent without the kernel hooks).

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
epoch's end, validation) belongs to no step.  Its "sync" row is the
kernels' window, as for custom loops (with k batches: the last one's wait).

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

from profiler.collect import selfcost, steps, tf_kernels

__all__ = ["KERAS", "TF", "KERAS_MARK", "FUNCTION_MARK", "EAGER_MARK", "NO_IMAGES",
           "patch_module", "unpatch_module", "images_of", "marked_by", "graph_batch"]

TF = "horovod.tensorflow"
KERAS = "horovod.tensorflow.keras"
TAPE_TEMPLATE = "_DistributedGradientTape"
# what marked the steps, as the trace says it (steps_marked_by)
KERAS_MARK = "Keras model.fit (one step per run of its training function)"
FUNCTION_MARK = ("tf.function calls (the function that traced DistributedGradientTape.gradient;"
                 " images: HOROVOD_PROFILE_BATCH_SIZE, else its first argument's batch dimension,"
                 " else the batch inferred from its graph)")
#: added to the mark (and said once on rank 0) when a step's images are unknown
NO_IMAGES = ("images per step unknown (not an argument of the step, not inferable from its"
             " inputs): set HOROVOD_PROFILE_BATCH_SIZE=<images per rank per step> or call"
             " profiler.set_batch_size(n)")
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
                _measured(_begin)
            except Exception as exc:  # never break the training loop
                _warn_once(f"Keras step hook failed: {exc}")

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            try:
                s = self._shape
                n = images_of(self._first, max(int(batch), self._first), s.batch, s.samples)
                if not n:
                    _no_images()
                _measured(lambda: _end(n))
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


# --- the step's wait for Horovod: the kernels' window ------------------------

_record_app: list[Any] = []  # hvprof_record_app, declared once (empty: not looked up yet)


def _sync_row(window: tuple[int, int] | None) -> None:
    """The open step's "sync" row [window): written directly, as a Keras or
    tf.function step ends with hook_end, which writes none.  Quiet once the
    application marks steps itself, as the hooks' steps are."""
    if window is None or steps.mode() != "hook":
        return
    if not _record_app:
        from profiler.collect import native

        lib = native.loaded()
        _record_app.append(native.function("hvprof_record_app", lib) if lib is not None
                           else None)
    fn = _record_app[0]
    if fn is not None:
        fn(steps.APP_SYNC, window[0], window[1], 0, steps.steps_recorded())


def _begin() -> None:
    """A step begins (Keras's on_train_batch_begin, a step function's call):
    the kernels' window restarts with it."""
    tf_kernels.take_window()
    steps.hook_begin()


def _end(images: int) -> None:
    """... and ends: its sync row, then its step record."""
    _sync_row(tf_kernels.take_window())
    steps.hook_end(images)


# --- custom loops: DistributedGradientTape and tf.function -------------------

# per thread: .calls, the tf.functions being called, outermost first; .begun,
# whether the outermost call's step has begun (hook_begin)
_tls = threading.local()
_step_functions: weakref.WeakSet[Any] = weakref.WeakSet()
# the batch inferred from each step function's graph as it was traced
_traced_batch: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# What marked the steps: kept in a dict, never by rebinding a global, so that
# it holds even where AutoGraph runs a converted copy of a wrapper.
_state: dict[str, str | None] = {"marked_by": None, "no_images": None}


def marked_by() -> str | None:
    """Which TensorFlow hook marked this process's steps (None: none did),
    followed by :data:`NO_IMAGES` when some step's images were unknown."""
    by = _state["marked_by"]
    return f"{by}; {NO_IMAGES}" if by and _state["no_images"] else by


def _no_images() -> None:
    """A hooked step whose images are unknown: said once, by rank 0."""
    if _state["no_images"]:
        return
    _state["no_images"] = "1"
    from profiler.collect import native

    try:
        rank = native.rank() if native.loaded() is not None else 0
    except Exception:  # the rank unknown: say it
        rank = 0
    if rank <= 0:
        print(f"profiler: {NO_IMAGES}", file=sys.stderr)


def _first_batch(args: tuple[Any, ...]) -> int:
    for a in args:
        shape = getattr(a, "shape", None)
        try:
            if shape is not None and len(shape) >= 1 and shape[0] is not None:
                return int(shape[0])
        except (TypeError, ValueError):
            continue
    return 0


# ops whose outputs are a step's data when the loss depends on them: the
# function's arguments and captured tensors, what an iterator yields, arrays
# folded in as constants (only those of rank 2 or more: a rank-1 constant is
# more often a table, such as class weights, than a batch)
_DATA_OPS = ("Placeholder", "IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue")
_MAX_OPS = 50_000  # a walk's bound (ops visited), once per trace


def graph_batch(target: Any) -> int:
    """The batch a traced step computed `target` (its loss) from: the static
    first dimension of the data tensors among its ancestors (see _DATA_OPS),
    those of rank 2 or more when there are any (labels are often rank 1),
    when they all agree; 0 when they do not, or none has a static one."""
    import tensorflow as tf

    skip = (tf.resource, tf.variant)
    stack = [t.op for t in tf.nest.flatten(target) if hasattr(t, "op")]
    seen: set[int] = set()
    high: set[int] = set()
    low: set[int] = set()
    while stack and len(seen) < _MAX_OPS:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        data = op.type in _DATA_OPS
        if data or op.type == "Const":
            for out in op.outputs:
                shape = out.shape
                if out.dtype in skip or shape.rank is None or shape.rank < 1 \
                        or shape[0] is None or (not data and shape.rank < 2):
                    continue
                (high if shape.rank >= 2 else low).add(int(shape[0]))
            continue
        stack.extend(i.op for i in op.inputs)
    found = high or low
    return next(iter(found)) if len(found) == 1 else 0


def _images(fn: Any, args: tuple[Any, ...]) -> int:
    n = steps.batch_size() or _first_batch(args) or _traced_batch.get(fn, 0)
    if not n:
        _no_images()
    return n


def _wrap_call(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls = getattr(_tls, "calls", None)
        if calls is None:
            calls = _tls.calls = []
        if not calls:  # the outermost call: a step when its function is one
            _tls.begun = self in _step_functions
            if _tls.begun:
                try:
                    _measured(_begin)
                except Exception as exc:  # never break the training loop
                    _warn_once(f"tf.function step hook failed: {exc}")
        calls.append(self)
        try:
            result = orig(self, *args, **kwargs)
        finally:
            calls.pop()
        if not calls and self in _step_functions and getattr(_tls, "begun", False):
            _tls.begun = False
            try:
                _measured(lambda: _end(_images(self, args)))
            except Exception as exc:  # never break the training loop
                _warn_once(f"tf.function step hook failed: {exc}")
        return result

    setattr(__call__, _WRAPPED, orig)
    return __call__


def _after_gradient(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """What the tape's gradient hook does after each call (see _wrap_gradient)."""
    try:
        calls = getattr(_tls, "calls", None)
        if calls:  # being traced: the outermost tf.function is the step
            fn = calls[0]
            _step_functions.add(fn)
            _state["marked_by"] = FUNCTION_MARK
            target = args[0] if args else kwargs.get("target")

            def traced() -> None:
                _traced_batch[fn] = graph_batch(target)
                if not getattr(_tls, "begun", False):  # the call that traced it first
                    _tls.begun = True
                    _begin()

            _measured(traced)
        else:
            import tensorflow as tf

            if not tf.inside_function():  # eager: this call is the boundary
                _state["marked_by"] = EAGER_MARK
                _measured(_eager_boundary)
    except Exception as exc:  # never break the training loop
        _warn_once(f"DistributedGradientTape step hook failed: {exc}")


# _after_gradient as the wrapper calls it: inside tf.function AutoGraph
# converts the wrapper, as it converts the tape's own gradient when there is
# no wrapper, and would convert every function the hook calls, at a cost of
# a second and more at the first trace; _patch_tape puts here the same
# function marked for AutoGraph to call as it is (do_not_convert).  Kept in a
# dict, never in a rebound global, which the converted copy would not see.
_hooks: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], None]] = {
    "after_gradient": _after_gradient}


def _wrap_gradient(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def gradient(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig(self, *args, **kwargs)
        _hooks["after_gradient"](args, kwargs)
        return result

    setattr(gradient, _WRAPPED, orig)
    return gradient


def _eager_boundary() -> None:
    """An eager gradient call: the step's wait for Horovod (its allreduces ran
    in this call), then the boundary."""
    window = tf_kernels.take_window()
    if window is not None:
        steps.mark_synchronize(*window)
    n = steps.batch_size()
    if not n and steps.steps_recorded():  # the first call opens the first step
        _no_images()
    steps.hook_step()


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
    try:
        import tensorflow as tf

        _hooks["after_gradient"] = tf.autograph.experimental.do_not_convert(_after_gradient)
    except Exception:  # an older TensorFlow: converted, slower at tracing, the same records
        pass
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
