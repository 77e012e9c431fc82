"""What only a rank itself can tell about its process, gathered at its exit
for its metadata (profiler.postjob.convert.rank_metadata's facts): the
profiler's own cost in Python, the GPUs and the library's live NCCL state,
the kind of each network interface in its own namespace, its threads, and
its command line and environment as they are now."""

from __future__ import annotations

import os
import sys
from typing import Any

STEP_MARKERS = {"explicit": "the application (profiler.step)",
                "hook": "optimizer.step (PyTorch)"}


def steps_marked_by() -> str | None:
    """What marked this process's steps, in words (None: nothing did): the
    application, PyTorch's optimizer hook, or a TensorFlow hook
    (profiler.collect.tf_hooks.marked_by)."""
    from profiler.collect import steps

    mode = steps.mode()
    tf = sys.modules.get("profiler.collect.tf_hooks")
    by = tf.marked_by() if tf is not None and mode == "hook" else None  # type: ignore[attr-defined]
    return by or STEP_MARKERS.get(mode)


def tensors_not_recorded() -> str | None:
    """Why the tensors TensorFlow handed to Horovod were not recorded, when
    this process used Horovod's TensorFlow kernels and they were not
    (profiler.collect.tf_kernels.reason); else None."""
    tf = sys.modules.get("profiler.collect.tf_kernels")
    if tf is None or "horovod.tensorflow.mpi_ops" not in sys.modules:
        return None
    return tf.reason()  # type: ignore[attr-defined,no-any-return]


def rank_facts(raw_path: str) -> dict[str, Any]:
    from profiler.collect import nvml, selfcost
    from profiler.collect.native import native_state
    from profiler.formats import fabric

    doc = fabric.read_mpit(raw_path)
    kinds = ({n: fabric.interface_kind(n) for n in fabric.interface_names(doc)}
             if doc is not None else None)
    torch = sys.modules.get("torch")
    try:
        threads = int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # a half-imported or unusual torch: leave it unknown
        threads = None
    return {
        "own": True,
        "self_cost": selfcost.snapshot(),
        "gpus": nvml.topology(),
        "nccl": native_state(),
        "interface_kinds": kinds,
        "torch_threads": threads,
        "steps_marked_by": steps_marked_by(),
        "tensors_not_recorded": tensors_not_recorded(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "environ": dict(os.environ),
        "argv": list(sys.argv),
        "executable": sys.executable,
    }
