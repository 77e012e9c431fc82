"""Tensor fusion and cycle time what-if: from one run, the data calls and the
communication time per step at other HOROVOD_FUSION_THRESHOLD and
HOROVOD_CYCLE_TIME values.

Inputs: the run's fusion lineage (profiler.formats.lineage: per tensor and
step, its bytes, dtype and when it was ready on every rank read, ``ready_ns``)
and an alpha-beta model of Horovod's allreduce latency fitted on the same run
(profiler.analysis.model: every allreduce of Horovod's thread, data and control,
so that small sizes are anchored by the response-cache calls).

The simulation replays Horovod's background loop (horovod/common/operations.cc
RunLoopOnce, controller.cc FuseResponses): each cycle begins with the
response-cache allreduce, so the run's own cycles are the starts of the control
allreduces of Horovod's thread on rank 0.  The tensors ready on every rank by a
cycle's start go out in that cycle, in readiness order, packed greedily into
fused calls of one dtype while the bytes stay within the threshold (0: one
call per tensor); each call costs the model's latency at its size.  At the
run's own cycle time its recorded cycles are used; at another cycle time T,
cycles every T plus the run's own overhead per cycle (median gap between its
cycles minus its cycle time), from its first cycle.

Measured on this machine (resnet8, 2 ranks, tests/test_fusion_whatif.py): the
data calls per step predicted from a run at the default threshold are within a
few percent of real runs at 0 and at 64 KiB.  The model's time is transfer
time: what the calls cost without waiting for other ranks or for a core;
the run's measured allreduce time per step, which includes those waits, is
given beside it and is many times larger on a loaded node.

The prediction for the run's own settings, against what the run did, gives
the method's error on this job; a setting is recommended only when its
predicted gain exceeds that error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["simulate", "whatif", "WhatIf", "DEFAULT_THRESHOLDS", "DEFAULT_CYCLE_MS"]

MIB = 1 << 20
DEFAULT_THRESHOLDS = (0, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 128 * MIB)
DEFAULT_CYCLE_MS = 1.0
DEFAULT_THRESHOLD = 128 * MIB


def simulate(ready_ns: np.ndarray, nbytes: np.ndarray, dtype: Sequence[str],
             marks_ns: np.ndarray, latency_ns: Any, *, threshold: int) -> tuple[int, float]:
    """(data calls, transfer ns) of a set of allreduce tensors under a fusion
    threshold, given the cycle starts `marks_ns`; latency_ns(bytes) -> ns."""
    if len(ready_ns) == 0:
        return 0, 0.0
    cycle = np.searchsorted(marks_ns, ready_ns, side="left")
    order = np.lexsort((ready_ns, cycle))
    sizes: list[float] = []
    cur, cur_n, cur_c, cur_dt = 0.0, 0, -1, ""
    for i in order.tolist():
        b = float(nbytes[i])
        c = int(cycle[i])
        dt = dtype[i]
        if cur_n and (c != cur_c or threshold <= 0 or cur + b > threshold or dt != cur_dt):
            sizes.append(cur)
            cur, cur_n = 0.0, 0
        cur += b
        cur_n += 1
        cur_c, cur_dt = c, dt
    sizes.append(cur)
    return len(sizes), float(np.sum(latency_ns(np.asarray(sizes, dtype=float))))


@dataclass
class WhatIf:
    table: pd.DataFrame              # threshold, cycle_ms, calls/step, transfer ms/step
    actual_calls: float              # the run's own data calls per step
    actual_comm_ms: float            # ... and its measured allreduce time per step
    base_calls: float                # the prediction at the run's own settings
    base_comm_ms: float              # ... its transfer time (no waits)
    calls_error: float               # |base - actual| / actual
    comm_error: float
    threshold: int
    cycle_ms: float
    steps: int


def _settings(env: Mapping[str, Any] | None) -> tuple[int, float]:
    env = env or {}
    try:
        th = int(str(env.get("HOROVOD_FUSION_THRESHOLD", DEFAULT_THRESHOLD)).strip())
    except ValueError:
        th = DEFAULT_THRESHOLD
    try:
        cyc = float(str(env.get("HOROVOD_CYCLE_TIME", DEFAULT_CYCLE_MS)).strip())
    except ValueError:
        cyc = DEFAULT_CYCLE_MS
    return max(0, th), max(cyc, 0.0)


def whatif(lineage: pd.DataFrame, rows: pd.DataFrame, env: Mapping[str, Any] | None, *,
           thresholds: Sequence[int] = DEFAULT_THRESHOLDS,
           cycle_ms: Sequence[float] | None = None) -> WhatIf | None:
    """The what-if table for one run: `lineage` (its lineage table), `rows`
    (rank 0's rows: Horovod's allreduces, for the latency model and the run's
    own figures), `env` (its HOROVOD_* settings).  None when the run lacks what
    it needs (no allreduce lineage with readiness, too few sizes to fit)."""
    from profiler.formats.classify import is_horovod_row

    from .model import fit_curve

    if lineage is None or lineage.empty or "ready_ns" not in lineage.columns:
        return None
    lin = lineage[(lineage["op"] == "ALLREDUCE") & lineage["matched"]
                  & (lineage["step"] >= 0)]
    lin = lin[np.isfinite(lin["ready_ns"].to_numpy(dtype=float))]
    if lin.empty:
        return None
    hvd = rows.loc[is_horovod_row(rows) & (rows["op"] == "allreduce").to_numpy(dtype=bool)]
    if len(hvd) == 0:
        return None
    med = hvd.groupby("bytes")["dur_ns"].median()
    if len(med) < 2:
        return None
    model = fit_curve(med.index.to_numpy(dtype=float), med.to_numpy(dtype=float))
    th0, cyc0 = _settings(env)
    control = hvd.loc[(hvd["kind"].astype(str) == "control").to_numpy(dtype=bool)]
    marks = np.sort(control["t_start_ns"].to_numpy(dtype=float))
    if len(marks) < 2:
        return None
    gap_ns = float(np.median(np.diff(marks)))
    overhead_ns = max(0.0, gap_ns - cyc0 * 1e6)
    steps = sorted(int(s) for s in lin["step"].unique())
    ready = lin["ready_ns"].to_numpy(dtype=float)
    size = lin["tensor_bytes"].to_numpy(dtype=float)
    dts = lin["dtype"].astype(str).tolist()

    def run(th: int, cyc: float) -> tuple[float, float]:
        m = marks if cyc == cyc0 else np.arange(marks[0], marks[-1] + gap_ns,
                                                cyc * 1e6 + overhead_ns)
        calls, ns = simulate(ready, size, dts, m, model.predict_ns, threshold=th)
        return calls / len(steps), ns / len(steps) / 1e6

    # the run's own figures: its data calls (those that carried a tensor) per step
    carried = lin.drop_duplicates(["call_comm", "call_seq"])
    actual_calls = len(carried) / len(steps)
    actual_comm = float(carried["call_dur_ns"].sum()) / len(steps) / 1e6
    base_calls, base_comm = run(th0, cyc0)
    cycles = list(cycle_ms) if cycle_ms is not None else sorted({cyc0, 1.0, 5.0})
    out = []
    for cyc in cycles:
        for th in sorted(set(thresholds) | {th0}):
            c, t = run(th, cyc)
            out.append({"threshold": th, "cycle_ms": cyc, "calls_per_step": c,
                        "transfer_ms_per_step": t, "current": th == th0 and cyc == cyc0})
    return WhatIf(
        table=pd.DataFrame(out), actual_calls=actual_calls, actual_comm_ms=actual_comm,
        base_calls=base_calls, base_comm_ms=base_comm,
        calls_error=abs(base_calls - actual_calls) / actual_calls if actual_calls else math.nan,
        comm_error=abs(base_comm - actual_comm) / actual_comm if actual_comm else math.nan,
        threshold=th0, cycle_ms=cyc0, steps=len(steps))
