"""profiler.analysis: pure functions, DataFrame in, DataFrame or figure out.

The facade: one line per public name; analysis modules add theirs here.
"""

from __future__ import annotations

from .load import load, load_aggregates, load_meta
from .summary import (
    bucket_label,
    bus_factor,
    comm_time_imbalance,
    summarize,
    summarize_aggregates,
)

__all__ = [
    "load",
    "load_meta",
    "load_aggregates",
    "summarize",
    "summarize_aggregates",
    "bucket_label",
    "bus_factor",
    "comm_time_imbalance",
]
