"""horovod-profiler: communication profiler for Horovod jobs.

Public API (kept light: this module is imported at interpreter start-up when
HOROVOD_PROFILE is set, so heavy imports stay lazy):

    profiler.step(images=N)        mark the end of a training step
    with profiler.step_context(images=N): ...   time a step explicitly
    profiler.load(path)            trace -> pandas DataFrame (profiler.analysis)
    profiler.sampling(False|True)  pause / resume recording at run time
    with profiler.paused(): ...    pause recording for a block
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

from profiler._version import __version__

__all__ = ["__version__", "step", "step_context", "set_batch_size", "load", "sampling",
           "paused"]


def step(images: int = 0) -> None:
    """Mark the end of a training step that processed `images` samples on this rank."""
    from profiler.collect.steps import step as _step

    _step(images=images)


def step_context(images: int = 0) -> Any:
    """Context manager timing one step: `with profiler.step_context(images=64): ...`."""
    from profiler.collect.steps import step_context as _ctx

    return _ctx(images=images)


def set_batch_size(n: int | None) -> None:
    """Images per step for the steps found through hvd.DistributedOptimizer
    (None: back to HOROVOD_PROFILE_BATCH_SIZE)."""
    from profiler.collect.steps import set_batch_size as _set

    _set(n)


def sampling(on: bool) -> None:
    """Pause (False) or resume (True) recording; paused calls keep their sequence
    numbers and are counted as unsampled.  A no-op when profiling is off."""
    from profiler.collect.steps import sampling as _sampling

    _sampling(on)


def paused() -> Any:
    """Context manager pausing recording for its body: `with profiler.paused(): ...`."""
    from profiler.collect.steps import paused as _paused

    return _paused()


def load(*paths: Any, **kwargs: Any) -> Any:
    """Load one or more traces into a DataFrame (see profiler.analysis.load)."""
    from profiler.analysis import load as _load

    return _load(*paths, **kwargs)
