"""Bundled workloads: programs to run under the profiler.

* :mod:`profiler.workloads.train_bench` -- a synthetic-data image training
  benchmark on Horovod (models in plain torch), reporting images/sec.
  ``python -m profiler.workloads.train_bench --help``
* :mod:`profiler.workloads.mpi4py_collectives` -- every MPI collective a known
  number of times at given sizes, through mpi4py (a non-Horovod example and a
  fixture for exact-count tests).
"""
