"""The overhead benchmarks' profiled Horovod job (hook_cost.py,
ready_to_enqueue.py): one thread for torch, Horovod started under the
profiler's library, a corpus workload built, and the profiler's Python-side
hooks switched as a whole (the tensor entry points, the DistributedOptimizer's
step and synchronize; the MPI wrappers stay on)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass
class Job:
    hvd: Any          # horovod.torch
    mpi_ops: Any      # horovod.torch.mpi_ops
    model: Any
    wl: Any           # profiler.workloads.corpus's workload
    rank: int

    def python_hooks(self, on: bool, *, step_hooks: bool = True) -> None:
        """The profiler's Python-side hooks installed (on) or Horovod's own
        functions back (off); step_hooks=False: the tensor hooks alone, the
        step and synchronize hooks left as they are."""
        import horovod.torch.optimizer as hopt

        from profiler.collect import horovod_hooks, tensors

        if step_hooks:
            (horovod_hooks.patch_module if on else horovod_hooks.unpatch_module)(hopt)
        (tensors.patch_module if on else tensors.unpatch_module)(self.mpi_ops)

    def optimizer(self) -> Any:
        """SGD wrapped by hvd.DistributedOptimizer (which registers its hooks on
        the gradient accumulators now), the parameters broadcast from rank 0."""
        import torch

        base = torch.optim.SGD(self.model.parameters(), lr=0.01)
        opt = self.hvd.DistributedOptimizer(base,
                                            named_parameters=self.model.named_parameters())
        self.hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        return opt


def start(workload: str, workload_argv: list[str]) -> Job | None:
    """Horovod initialised and `workload` built (corpus arguments
    `workload_argv`); None, said on stderr, without the profiler's library
    loaded (run under HOROVOD_PROFILE=1)."""
    import torch

    torch.set_num_threads(1)
    import horovod.torch as hvd
    import horovod.torch.mpi_ops as mpi_ops

    from profiler.collect import native
    from profiler.workloads import corpus

    if native.loaded() is None:
        print("run with HOROVOD_PROFILE=1", file=sys.stderr)
        return None
    hvd.init()
    wl = corpus.build_model(workload, corpus.parse_args([workload, *workload_argv]))
    return Job(hvd=hvd, mpi_ops=mpi_ops, model=wl.model, wl=wl, rank=hvd.rank())
