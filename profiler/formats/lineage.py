"""lineage.parquet: one row per tensor operation (one tensor through one
Horovod collective) with the call that carried it (written by
profiler.postjob.lineage at merge, from the profiler's own records and, when
there is one, Horovod's timeline).
Its columns, Horovod's fusion threshold as the environment sets it, and the
reader."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profiler.errors import NotFoundError, PathLike
from profiler.formats.horovod_env import settings
from profiler.layout import LINEAGE_FILE

LINEAGE_COLUMNS = [
    "step", "occurrence", "tensor", "op", "comm_activity", "fused_id", "n_tensors",
    "tensor_bytes", "call_tensor_bytes", "fill_ratio", "dtype", "shape",
    "t_start_ns", "t_end_ns", "negotiation_ns", "neg_start_ns", "neg_end_ns",
    "wait_for_data_ns", "ready_ranks", "last_ready_rank", "ready_spread_ns",
    "matched", "call_op", "call_comm", "call_seq", "call_t_start_ns", "call_t_end_ns",
    "call_dur_ns", "call_bytes", "bytes_agree", "complete",
    # how the row was found: "records" (the profiler's own tensor and call
    # records, profiler.postjob.fusion) or "timeline" (Horovod's timeline)
    "source",
    # 1 when only one set of tensors fits the evidence for this call; else
    # 1 / the number that fit (0: unresolved, or too many to count); candidates:
    # every tensor some fitting set holds (";"-joined, "" when certain); method:
    # buffer, bytes, order, elimination (records) or timeline
    "confidence", "candidates", "method",
    # the ambiguity stated per row: "certain", "ambiguous" (more than one set
    # of tensors fits the call's evidence; the row shows the likeliest, by
    # Horovod's order), "unmatched" (no call explained), "not inferred" (the
    # inference's time budget ran out first); ways_log10: log10 of the number
    # of sets that fit (0 when certain, NaN when unmatched), ways_bound: that
    # number is a lower bound (the bounded search stopped before the end)
    "certainty", "ways_log10", "ways_bound",
    # the tensor's enqueue into Horovod on rank 0, the last enqueue over the
    # ranks read (when it was ready everywhere), and how long it waited on
    # rank 0 before the call that carried it started (negotiation, other
    # ranks, the cycle, fusion)
    "enqueue_ns", "ready_ns", "queue_ns",
]


def fusion_threshold(env: Mapping[str, Any] | None) -> int | None:
    """HOROVOD_FUSION_THRESHOLD in bytes as Horovod read it from a rank's env
    (profiler.formats.horovod_env: default 128 MiB, 0 = fusion off); None
    when the environment was not recorded."""
    if env is None:
        return None
    return settings(env).fusion_threshold


def load(path: PathLike) -> pd.DataFrame:
    """Read a lineage.parquet (or the one in a profile directory / next to a trace)."""
    p = Path(os.fspath(path))
    if p.is_dir():
        p = p / LINEAGE_FILE
    elif p.suffix == ".json":
        p = p.parent / LINEAGE_FILE
    if not p.is_file():
        raise NotFoundError(p, "no lineage (no tensor records and no Horovod timeline; see "
                               "the trace metadata's lineage reason)")
    try:
        frame = pq.read_table(p).to_pandas()
    except (OSError, pa.ArrowException, ValueError, KeyError, TypeError) as exc:
        raise NotFoundError(p, f"cannot read lineage: {exc}") from None
    # tensor names are escaped when the timeline is parsed; a file written by
    # another tool gets the same treatment here
    from profiler.formats.dataset import printable_columns

    frame = _with_defaults(frame)
    return printable_columns(frame, ("tensor", "op", "call_op", "dtype", "shape", "candidates"))


def _with_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    """A lineage file written before the source columns existed: the timeline's."""
    defaults = {"source": "timeline", "confidence": 1.0, "candidates": "",
                "method": "timeline", "ways_log10": 0.0, "ways_bound": False,
                "enqueue_ns": float("nan"), "ready_ns": float("nan"),
                "queue_ns": float("nan")}
    for col, value in defaults.items():
        if col not in frame.columns:
            frame[col] = value
    if "certainty" not in frame.columns:  # written before the column existed
        conf = frame["confidence"].to_numpy(dtype=float)
        matched = frame["matched"].to_numpy(dtype=bool) if "matched" in frame.columns \
            else conf > 0
        frame["certainty"] = np.where(matched, np.where(conf >= 1.0, "certain", "ambiguous"),
                                      "unmatched")
    return frame
