"""profiler.analysis: pure functions, DataFrame in, DataFrame or figure out.

The facade: one line per public name; analysis modules add theirs here.
"""

from __future__ import annotations

from profiler.formats.filters import RowFilter

from . import figures, predict
from .compare import compare
from .distributed import summarize_dask
from .engine import open_dataset, overview, stragglers_dataset, summarize_dataset
from .facade import TraceAnalysis
from .imbalance import match_calls, rank_times, stragglers
from .load import load, load_aggregates, load_meta
from .model import anomalies, fit_alpha_beta, latency_by_size, padding_summary, padding_whatif
from .p2p import match_p2p, p2p_summary
from .report import render_report, write_report
from .sizes import fusion_table, size_distribution, size_summary
from .summary import (
    bucket_label,
    bus_factor,
    comm_time_imbalance,
    summarize,
    summarize_aggregates,
)
from .throughput import correlation, step_table, throughput_summary

__all__ = [
    "TraceAnalysis",
    "RowFilter",
    "load",
    "load_meta",
    "load_aggregates",
    "summarize",
    "summarize_aggregates",
    "bucket_label",
    "bus_factor",
    "comm_time_imbalance",
    "size_distribution",
    "size_summary",
    "fusion_table",
    "fit_alpha_beta",
    "latency_by_size",
    "anomalies",
    "padding_whatif",
    "padding_summary",
    "match_calls",
    "match_p2p",
    "p2p_summary",
    "rank_times",
    "stragglers",
    "step_table",
    "throughput_summary",
    "correlation",
    "compare",
    "write_report",
    "render_report",
    "figures",
    "predict",
    "summarize_dataset",
    "overview",
    "open_dataset",
    "summarize_dask",
    "stragglers_dataset",
]
