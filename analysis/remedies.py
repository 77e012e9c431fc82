"""Remedies in the words of the job's framework.

A finding that tells a TensorFlow job to call ``torch.set_num_threads`` is
no help to it.  Each phrase here that names a framework's API comes in one
version per framework, chosen by :func:`framework` from the trace's metadata:

* ``steps_marked_by`` (each rank's, profiler.collect): the TensorFlow hooks
  (profiler.collect.tf_hooks) name ``tf.function``, ``model.fit`` or
  ``DistributedGradientTape``; PyTorch's names ``optimizer.step (PyTorch)``;
* else the ranks' ``torch_threads`` (a rank that imported torch).

"unknown" (an MPI program, steps marked by hand in a job that never said
which framework it runs) gets both frameworks' words, PyTorch's first.
Pure functions of their arguments: analysis imports nothing from the
collection layer (pyproject.toml's contracts), so the marks are matched by
their wording, which tests/test_remedies.py checks against tf_hooks'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FRAMEWORKS", "framework", "threads_remedy", "threads_detail",
           "profile_compute_remedy", "even_data_remedy", "mark_steps_remedy",
           "sync_name", "completion_detail"]

PYTORCH = "pytorch"
TENSORFLOW = "tensorflow"
UNKNOWN = "unknown"
FRAMEWORKS = (PYTORCH, TENSORFLOW, UNKNOWN)

#: how the TensorFlow step hooks' marks begin (profiler.collect.tf_hooks:
#: KERAS_MARK, FUNCTION_MARK, EAGER_MARK)
TF_MARKS = ("Keras model.fit", "tf.function calls", "DistributedGradientTape")
#: how PyTorch's begins (profiler.collect.facts.STEP_MARKERS["hook"])
TORCH_MARKS = ("optimizer.step (PyTorch)",)


def framework(meta: Mapping[str, Any] | None) -> str:
    """"pytorch", "tensorflow" or "unknown": the job's framework, from the
    trace's metadata (steps_marked_by, else the ranks' torch_threads).  A job
    whose ranks say both (a TensorFlow job that imported torch too) is
    TensorFlow's when its steps were marked by TensorFlow's hooks."""
    meta = meta or {}
    marks = meta.get("steps_marked_by") or []
    if isinstance(marks, str):
        marks = [marks]
    text = [str(m) for m in marks]
    if any(m.startswith(TF_MARKS) for m in text):
        return TENSORFLOW
    if any(m.startswith(TORCH_MARKS) for m in text):
        return PYTORCH
    for r in meta.get("ranks") or []:
        cpu = r.get("cpu") if isinstance(r, Mapping) else None
        if isinstance(cpu, Mapping) and isinstance(cpu.get("torch_threads"), int):
            return PYTORCH
    return UNKNOWN


def _check(fw: str) -> str:
    if fw not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, not {fw!r}")
    return fw


_THREADS = {
    PYTORCH: "torch.set_num_threads, OMP_NUM_THREADS",
    TENSORFLOW: ("tf.config.threading.set_intra_op_parallelism_threads and "
                 "set_inter_op_parallelism_threads, OMP_NUM_THREADS"),
}


def threads_remedy(fw: str) -> str:
    """How to give a rank fewer compute threads, in the framework's API (for a
    parenthesis after "fewer intra-op threads")."""
    fw = _check(fw)
    if fw == UNKNOWN:
        return f"{_THREADS[PYTORCH]}; TensorFlow: {_THREADS[TENSORFLOW]}"
    return _THREADS[fw]


def threads_detail(fw: str, n: int) -> str:
    """The ranks' intra-op threads as a detail ("torch uses 4 intra-op
    threads"); '' when unknown (n <= 0)."""
    fw = _check(fw)
    if n <= 0:
        return ""
    who = "TensorFlow" if fw == TENSORFLOW else "torch"
    return f"{who} uses {n} intra-op threads"


_PROFILE = {
    PYTORCH: ("profile the compute side (torch.profiler, py-spy) and the input pipeline "
              "(DataLoader num_workers, pinned memory)"),
    TENSORFLOW: ("profile the compute side (tf.profiler.experimental, TensorBoard's profiler, "
                 "py-spy) and the input pipeline (tf.data: prefetch(tf.data.AUTOTUNE), "
                 "num_parallel_calls in map)"),
}


def profile_compute_remedy(fw: str) -> str:
    """Where to look when compute, not communication, limits the job."""
    fw = _check(fw)
    if fw == UNKNOWN:
        return (f"{_PROFILE[PYTORCH]}; TensorFlow: "
                f"{_PROFILE[TENSORFLOW].removeprefix('profile the compute side ')}")
    return _PROFILE[fw]


_EVEN = {
    PYTORCH: ("torch's DistributedSampler gives each rank an equal shard, padded, or drops "
              "the uneven tail with drop_last=True"),
    TENSORFLOW: ("dataset.shard(hvd.size(), hvd.rank()) then batch(..., drop_remainder=True) "
                 "and take the same number of batches on every rank, or steps_per_epoch in "
                 "model.fit"),
}


def even_data_remedy(fw: str) -> str:
    """How to give every rank the same number of batches (for a parenthesis
    after "the same number of batches on every rank")."""
    fw = _check(fw)
    if fw == UNKNOWN:
        return f"{_EVEN[PYTORCH]}; TensorFlow: {_EVEN[TENSORFLOW]}"
    return _EVEN[fw]


_MARK = {
    PYTORCH: "mark steps with profiler.step() or use hvd.DistributedOptimizer.",
    TENSORFLOW: ("mark steps with profiler.step(), or use hvd.DistributedGradientTape (in a "
                 "tf.function or eagerly) or model.fit with hvd.DistributedOptimizer."),
}


def mark_steps_remedy(fw: str) -> str:
    """How to get steps marked when none were."""
    fw = _check(fw)
    if fw == UNKNOWN:
        return ("mark steps with profiler.step(), or use hvd.DistributedOptimizer (PyTorch, "
                "Keras) or hvd.DistributedGradientTape (TensorFlow).")
    return _MARK[fw]


def images_remedy(fw: str) -> str:
    """How to give a job's steps their images when the profiler found none."""
    fw = _check(fw)
    if fw == TENSORFLOW:
        return ("the batch could not be read from the training function's arguments (a batch "
                "held in a closure or a global, or no fixed batch dimension): set "
                "HOROVOD_PROFILE_BATCH_SIZE=N, the images of one rank's step.")
    return ("set HOROVOD_PROFILE_BATCH_SIZE=N, the images of one rank's step, or call "
            "profiler.set_batch_size(N) in the script (profiler.step(images=N) where it marks "
            "its own steps).")


def sync_name(fw: str) -> str:
    """What the step's wait for Horovod is called in the framework: PyTorch's
    synchronize; in TensorFlow the step waits on Horovod's ops inside the
    training function."""
    fw = _check(fw)
    if fw == TENSORFLOW:
        return "Horovod's ops in the training step"
    return "synchronize"


def completion_detail(fw: str) -> str:
    """What the "handing the results back" part is, in parentheses."""
    fw = _check(fw)
    if fw == TENSORFLOW:
        return "(Horovod's callbacks hand each result back to its TensorFlow op)"
    return "(synchronize polls its handles every millisecond)"
