"""Parse Horovod's own timeline (HOROVOD_TIMELINE=path, written by rank 0).

What Horovod 0.28.1 writes (horovod/common/timeline.cc, read at that tag):

* A Chrome-trace JSON *array*.  The writer thread appends one event at a time
  and keeps the file valid by ending every event with ``}]`` and seeking back
  over the ``]`` before the next one; metadata events end with ``},\\n``.  A job
  that dies mid-write leaves an unterminated array (cut anywhere), and
  ``hvd.shutdown()`` stops the writer *without draining its queue*, so the last
  events of a run are often missing: spans may stay open at the end of a file.
* Tensor names are written verbatim (no JSON escaping): a name holding ``"``
  or ``\\`` makes that event invalid JSON.
* pid 0 is a header "process": ``process_name`` metadata whose args hold
  ``start_time_since_epoch_in_micros`` (CLOCK_REALTIME of ts = 0; ``ts`` is
  microseconds of steady_clock since the timeline started).
* Every tensor is a "process" (pid >= 1) named by ``process_name`` metadata
  (``args.name``).  Per tensor, the state machine is:
  ``B NEGOTIATE_<REQ>`` ... ``X "<rank>"`` (dur 0, one per rank reported ready
  at the coordinator, *uncached negotiations only*) ... ``E``; then
  ``B <RESPONSE>`` (ALLREDUCE, BROADCAST, ALLGATHER, ...) containing activity
  spans ``B <ACTIVITY>``/``E`` (WAIT_FOR_DATA, INIT_FUSION_BUFFER,
  MEMCPY_IN_FUSION_BUFFER, MPI_ALLREDUCE, NCCL_ALLREDUCE,
  MEMCPY_OUT_FUSION_BUFFER, ...) and ``E`` with args ``{dtype, shape}``.
* With the response cache (the default), a cached tensor's negotiation is
  ``B NEGOTIATE_*`` when any rank has it ready and ``E`` once all have it, with
  no per-rank ``X`` events: per-rank readiness exists only for uncached
  negotiations (each tensor's first time, or every time with
  HOROVOD_CACHE_CAPACITY=0).
* WAIT_FOR_DATA is written only for tensors with ready events (GPU tensors);
  CPU tensors have none, so their wait-for-data time is 0.
* A fused batch (one Horovod response) is written as a run of consecutive
  ``B <RESPONSE>`` events, one per tensor, and each activity as a run of
  consecutive ``B <ACTIVITY>`` events: that run is one operation instance.
* ``i`` events named CYCLE_START mark Horovod cycles when
  HOROVOD_TIMELINE_MARK_CYCLES=1.

Parsing is bounded (file size and event count limits), never trusts a field's
type, skips (and counts) malformed events, recovers every complete event of a
truncated file, and raises `profiler.errors.ProfilerError` subclasses for a file
it cannot use at all.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from profiler.errors import (
    CorruptError,
    NotATraceError,
    NotFoundError,
    PathLike,
    TruncatedError,
    UsageError,
    printable,
)

__all__ = [
    "Timeline",
    "DTYPE_BYTES",
    "COMM_ACTIVITY_PREFIXES",
    "parse",
    "tensor_ops",
    "fused_ops",
    "readiness",
    "stragglers",
    "shape_elements",
]

#: Default bounds: a timeline larger than this is refused (pass max_bytes).
DEFAULT_MAX_BYTES = 2 << 30
#: Default bound on events kept.
DEFAULT_MAX_EVENTS = 20_000_000
#: Per-tensor span nesting deeper than this is malformed (Horovod nests 2).
MAX_DEPTH = 4
#: Resynchronisations tried on malformed events before giving up.
MAX_RESYNC = 10_000

#: Horovod DataType_Name -> bytes per element (message.cc).
DTYPE_BYTES: dict[str, int] = {
    "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "int32": 4, "int64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "bool": 1,
}

#: Activities that are the collective call itself (MPI_ALLREDUCE, NCCL_ALLREDUCE...).
COMM_ACTIVITY_PREFIXES = ("MPI_", "NCCL_", "CCL_", "GLOO_")
WAIT_FOR_DATA = "WAIT_FOR_DATA"
WAIT_FOR_OTHER = "WAIT_FOR_OTHER_TENSOR_DATA"
NEGOTIATE_PREFIX = "NEGOTIATE_"

_SHAPE_RE = re.compile(r"^\s*\[\s*(\d+(\s*,\s*\d+)*)?\s*\]\s*$")

SPAN_COLUMNS = [
    "pid", "tensor", "name", "level", "depth", "t_start_us", "t_end_us",
    "group", "parent", "dtype", "shape",
]


@dataclass
class Timeline:
    """A parsed Horovod timeline.

    spans: one row per B/E span: pid, tensor, name, level ("negotiate", "op",
    "activity"), depth, t_start_us, t_end_us (NaN when never closed), group
    (operation instance: a run of consecutive B events of the same name at
    the same level), parent (row of the enclosing op span, -1), dtype and
    shape (op spans: from the closing E's args, "" when absent).
    ready: one row per per-rank readiness mark: pid, tensor, negotiation (row of
    its negotiate span), rank, ts_us.
    markers: instant events (name, ts_us), e.g. CYCLE_START.
    """

    path: str
    start_epoch_us: int | None
    tensors: dict[int, str]
    spans: pd.DataFrame
    ready: pd.DataFrame
    markers: pd.DataFrame
    events: int = 0
    skipped: int = 0
    truncated: bool = False
    unclosed: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """A JSON-able description (for trace metadata)."""
        return {
            "path": self.path,
            "start_epoch_us": self.start_epoch_us,
            "tensors": len(self.tensors),
            "events": self.events,
            "skipped": self.skipped,
            "truncated": self.truncated,
            "unclosed": self.unclosed,
            "spans": int(len(self.spans)),
            "ready_marks": int(len(self.ready)),
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------
# Reading the JSON array (complete, truncated or partly malformed)
# --------------------------------------------------------------------------

def _load_events(path: Path, max_bytes: int) -> tuple[list[Any], bool, int]:
    """Return (events, truncated, skipped_fragments)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise NotFoundError(path, "no such file") from None
    except OSError as exc:
        raise NotFoundError(path, f"cannot read: {exc.strerror or exc}") from None
    if not path.is_file():
        raise NotFoundError(path, "not a regular file")
    if size > max_bytes:
        raise UsageError(
            path, f"timeline is {size} bytes, over the limit of {max_bytes} bytes (max_bytes)"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NotFoundError(path, f"cannot read: {exc.strerror or exc}") from None
    stripped = data.strip()
    if not stripped:
        raise TruncatedError(path, "empty file, not a Horovod timeline")
    if not stripped.startswith(b"["):
        raise NotATraceError(path, "not a Horovod timeline (expected a JSON array)")
    # 1. A complete file.
    try:
        obj = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        pass
    else:
        if not isinstance(obj, list):
            raise NotATraceError(path, "not a Horovod timeline (expected a JSON array)")
        return obj, False, 0
    # 2. Cut after the last complete event and close the array.
    cut = max(stripped.rfind(b"},{"), stripped.rfind(b"},\n{"))
    if cut > 0:
        try:
            obj = orjson.loads(stripped[: cut + 1] + b"]")
        except orjson.JSONDecodeError:
            pass
        else:
            if isinstance(obj, list):
                return obj, True, 0
    # 3. Event by event, resynchronising on the next "},{" boundary after a bad one.
    return _scan_events(stripped)


def _scan_events(data: bytes) -> tuple[list[Any], bool, int]:
    text = data.decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    events: list[Any] = []
    skipped = 0
    pos = 1  # after '['
    n = len(text)
    closed = False
    resyncs = 0
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            break
        if text[pos] == "]":
            closed = True
            break
        try:
            obj, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            nxt = text.find("},", pos)
            # Resync only on an event boundary that has another event after it.
            while nxt >= 0 and not text[nxt + 2: nxt + 4].lstrip().startswith("{"):
                nxt = text.find("},", nxt + 2)
            if nxt < 0 or resyncs >= MAX_RESYNC:
                break
            resyncs += 1
            skipped += 1
            pos = nxt + 2
            continue
        events.append(obj)
        pos = end
    # Truncated when the array was never closed; a malformed event skipped
    # in the middle of a closed array is counted in `skipped`.
    return events, not closed, skipped


# --------------------------------------------------------------------------
# Building spans
# --------------------------------------------------------------------------

def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)) and math.isfinite(v) and abs(v) < 1e18:
        return float(v)
    return None


def _pid(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    if v < 0 or v > 1 << 40:
        return None
    return v


def shape_elements(shape: str) -> int | None:
    """Elements of a Horovod shape string ("[4, 16]" -> 64, "[]" -> 1)."""
    if not isinstance(shape, str) or len(shape) > 1000:
        return None
    m = _SHAPE_RE.match(shape)
    if not m:
        return None
    inner = m.group(1)
    if inner is None:
        return 1
    out = 1
    for part in inner.split(","):
        out *= int(part)
    return out


class _Builder:
    """Collects one timeline's events into spans, readiness marks and markers
    (parse() feeds it one event at a time; each event kind has its handler)."""

    def __init__(self) -> None:
        self.tensors: dict[int, str] = {}
        self.start_epoch_us: int | None = None
        self.rows: dict[str, list[Any]] = {c: [] for c in SPAN_COLUMNS}
        self.ready_rows: dict[str, list[Any]] = {
            "pid": [], "negotiation": [], "rank": [], "ts_us": []
        }
        self.marker_rows: dict[str, list[Any]] = {"name": [], "ts_us": []}
        self.stacks: dict[int, list[int]] = {}
        # Run detection for operation instances: (name, level) of the previous
        # span-opening event and the pids in the current run.
        self.run_key: tuple[str, str] | None = None
        self.run_pids: set[int] = set()
        self.group = -1
        self.horovod_like = 0
        self.skipped = 0

    def add(self, ev: Any) -> None:
        if not isinstance(ev, dict):
            self.skipped += 1
            return
        ph = ev.get("ph")
        if ph == "M":
            self._metadata(ev)
            return
        ts = _num(ev.get("ts"))
        if ph == "i":
            self._marker(ev, ts)
            return
        pid = _pid(ev.get("pid"))
        if ts is None or pid is None or ph not in ("B", "E", "X"):
            self.skipped += 1
            return
        stack = self.stacks.setdefault(pid, [])
        if ph == "B":
            self._begin(ev, pid, ts, stack)
        elif ph == "E":
            self._end(ev, ts, stack)
        else:
            self._ready(ev, pid, ts, stack)

    def _metadata(self, ev: dict[str, Any]) -> None:
        """process_name: a tensor's name (pid > 0) and, on pid 0, the epoch anchor."""
        pid = _pid(ev.get("pid"))
        args = ev.get("args")
        if pid is None or not isinstance(args, dict):
            self.skipped += 1
            return
        if ev.get("name") == "process_name":
            name = args.get("name")
            if isinstance(name, str) and pid > 0:
                self.tensors[pid] = printable(name[:4096])
                self.horovod_like += 1
            epoch = args.get("start_time_since_epoch_in_micros")
            if pid == 0 and isinstance(epoch, int) and not isinstance(epoch, bool):
                self.start_epoch_us = epoch
                self.horovod_like += 1

    def _marker(self, ev: dict[str, Any], ts: float | None) -> None:
        name = ev.get("name")
        if ts is None or not isinstance(name, str):
            self.skipped += 1
            return
        self.marker_rows["name"].append(printable(name[:256]))
        self.marker_rows["ts_us"].append(ts)
        self.run_key = None

    def _begin(self, ev: dict[str, Any], pid: int, ts: float, stack: list[int]) -> None:
        """A span opens: an operation, a negotiation, or an activity inside one.
        Consecutive openings of the same name on different tensors are one
        operation instance (one fused response): the same group number."""
        rows = self.rows
        name = ev.get("name")
        if not isinstance(name, str) or not name or len(stack) >= MAX_DEPTH:
            self.skipped += 1
            return
        name = printable(name[:256])
        if stack:
            level = "activity"
            parent = stack[0] if rows["level"][stack[0]] == "op" else -1
        elif name.startswith(NEGOTIATE_PREFIX):
            level, parent = "negotiate", -1
        else:
            level, parent = "op", -1
        key = (name, level)
        if self.run_key == key and pid not in self.run_pids:
            self.run_pids.add(pid)
        else:
            self.group += 1
            self.run_key = key
            self.run_pids = {pid}
        idx = len(rows["pid"])
        for col, value in (("pid", pid), ("tensor", None), ("name", name), ("level", level),
                           ("depth", len(stack)), ("t_start_us", ts), ("t_end_us", math.nan),
                           ("group", self.group), ("parent", parent), ("dtype", ""),
                           ("shape", "")):
            rows[col].append(value)
        stack.append(idx)
        self.horovod_like += 1

    def _end(self, ev: dict[str, Any], ts: float, stack: list[int]) -> None:
        """A span closes; its args may carry the tensor's dtype and shape."""
        rows = self.rows
        self.run_key = None
        if not stack:
            self.skipped += 1
            return
        idx = stack.pop()
        rows["t_end_us"][idx] = max(ts, rows["t_start_us"][idx])
        args = ev.get("args")
        if isinstance(args, dict):
            dt = args.get("dtype")
            sh = args.get("shape")
            if isinstance(dt, str):
                rows["dtype"][idx] = printable(dt[:32])
            if isinstance(sh, str):
                rows["shape"][idx] = printable(sh[:1000])

    def _ready(self, ev: dict[str, Any], pid: int, ts: float, stack: list[int]) -> None:
        """"X": a rank-ready mark inside a negotiation (name = rank).  X events
        between a run of B events do not break the run."""
        name = ev.get("name")
        if (
            stack
            and self.rows["level"][stack[-1]] == "negotiate"
            and isinstance(name, str)
            and name.isdigit()
            and len(name) < 10
        ):
            self.ready_rows["pid"].append(pid)
            self.ready_rows["negotiation"].append(stack[-1])
            self.ready_rows["rank"].append(int(name))
            self.ready_rows["ts_us"].append(ts)
        else:
            self.skipped += 1

    def unclosed(self) -> int:
        return sum(len(s) for s in self.stacks.values())

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(spans, ready, markers) as DataFrames."""
        rows, ready_rows, tensors = self.rows, self.ready_rows, self.tensors
        spans = pd.DataFrame(
            {
                "pid": np.asarray(rows["pid"], dtype=np.int64),
                "tensor": [tensors.get(pid, f"pid{pid}") for pid in rows["pid"]],
                "name": pd.Categorical(rows["name"]),
                "level": pd.Categorical(rows["level"],
                                        categories=["negotiate", "op", "activity"]),
                "depth": np.asarray(rows["depth"], dtype=np.int8),
                "t_start_us": np.asarray(rows["t_start_us"], dtype=np.float64),
                "t_end_us": np.asarray(rows["t_end_us"], dtype=np.float64),
                "group": np.asarray(rows["group"], dtype=np.int64),
                "parent": np.asarray(rows["parent"], dtype=np.int64),
                "dtype": rows["dtype"],
                "shape": rows["shape"],
            }
        )
        ready = pd.DataFrame(
            {
                "pid": np.asarray(ready_rows["pid"], dtype=np.int64),
                "tensor": [tensors.get(pid, f"pid{pid}") for pid in ready_rows["pid"]],
                "negotiation": np.asarray(ready_rows["negotiation"], dtype=np.int64),
                "rank": np.asarray(ready_rows["rank"], dtype=np.int64),
                "ts_us": np.asarray(ready_rows["ts_us"], dtype=np.float64),
            }
        )
        markers = pd.DataFrame(
            {"name": self.marker_rows["name"],
             "ts_us": np.asarray(self.marker_rows["ts_us"], dtype=np.float64)}
        )
        return spans, ready, markers


def parse(
    path: PathLike,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> Timeline:
    """Parse a Horovod timeline file into a `Timeline`.

    Raises NotFoundError (missing), NotATraceError (not a JSON array, or no
    Horovod events), TruncatedError (empty / nothing recoverable), CorruptError
    (inconsistent beyond repair), UsageError (over the size limit).
    """
    p = Path(os.fspath(path))
    events, truncated, skipped = _load_events(p, max_bytes)
    notes: list[str] = []
    if len(events) > max_events:
        notes.append(f"kept the first {max_events} of {len(events)} events (max_events)")
        events = events[:max_events]
        truncated = True
    b = _Builder()
    b.skipped = skipped
    for ev in events:
        b.add(ev)
    if b.horovod_like == 0:
        if events:
            raise NotATraceError(p, "no Horovod timeline events found")
        raise TruncatedError(p, "no complete event in the file")
    unclosed = b.unclosed()
    spans, ready, markers = b.frames()
    if truncated:
        notes.append("file is truncated (unterminated JSON array): kept every complete event")
    if unclosed:
        notes.append(
            f"{unclosed} spans never closed (job died, or hvd.shutdown() stopped "
            "Horovod's timeline writer before it drained its queue)"
        )
    if b.skipped:
        notes.append(f"skipped {b.skipped} malformed events")
    if len(spans) and not np.all(np.isfinite(spans["t_start_us"])):
        raise CorruptError(p, "non-finite timestamps")
    return Timeline(
        path=str(p),
        start_epoch_us=b.start_epoch_us,
        tensors=b.tensors,
        spans=spans,
        ready=ready,
        markers=markers,
        events=len(events),
        skipped=b.skipped,
        truncated=truncated,
        unclosed=unclosed,
        notes=notes,
    )


# --------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------

TENSOR_OP_COLUMNS = [
    "tensor", "pid", "occurrence", "op", "op_group", "t_start_us", "t_end_us",
    "complete", "negotiation_us", "neg_start_us", "neg_end_us", "wait_for_data_us",
    "wait_other_us", "comm_activity", "comm_group", "comm_start_us", "comm_end_us",
    "dtype", "shape", "elements", "tensor_bytes", "n_fused", "ready_ranks",
    "first_ready_us", "last_ready_us", "last_ready_rank", "ready_spread_us",
]


def _is_comm(name: str) -> bool:
    return name.startswith(COMM_ACTIVITY_PREFIXES)


def tensor_ops(tl: Timeline) -> pd.DataFrame:
    """One row per tensor operation (one tensor through one Horovod response).

    occurrence: the n-th operation of that tensor (0, 1, ...): for gradients
    under hvd.DistributedOptimizer, the training step counted from the first
    timeline step.  negotiation_us: the negotiation span that preceded the
    operation (0 when the timeline shows none).  wait_for_data_us: WAIT_FOR_DATA
    time (GPU tensors only; 0 on CPU).  comm_*: the collective activity
    (MPI_ALLREDUCE, ...) and its instance (comm_group: same value on every
    tensor that rode in the same call).  n_fused: tensors in the same op
    instance.  tensor_bytes: elements x dtype size from the op's closing args
    (NaN when the span was never closed).  Readiness columns: from the per-rank
    marks of the preceding negotiation (NaN / -1 when the timeline has none).
    """
    sp = tl.spans
    if sp.empty:
        return pd.DataFrame({c: [] for c in TENSOR_OP_COLUMNS})
    level = sp["level"].to_numpy()
    names = sp["name"].astype(str).to_numpy()
    pids = sp["pid"].to_numpy()
    t0 = sp["t_start_us"].to_numpy()
    t1 = sp["t_end_us"].to_numpy()
    parent = sp["parent"].to_numpy()
    groups = sp["group"].to_numpy()

    # Activities per op span.
    wait = np.zeros(len(sp))
    wait_other = np.zeros(len(sp))
    comm_idx = np.full(len(sp), -1, dtype=np.int64)
    for j in np.flatnonzero(level == "activity"):
        par = parent[j]
        if par < 0:
            continue
        d = t1[j] - t0[j]
        if names[j] == WAIT_FOR_DATA:
            wait[par] += d if np.isfinite(d) else 0.0
        elif names[j] == WAIT_FOR_OTHER:
            wait_other[par] += d if np.isfinite(d) else 0.0
        elif comm_idx[par] < 0 and _is_comm(names[j]):
            comm_idx[par] = j

    # Readiness per negotiation span.
    rd = tl.ready
    ready_by_neg: dict[int, tuple[int, float, float, int]] = {}
    if not rd.empty:
        g = rd.sort_values(["negotiation", "ts_us"], kind="stable").groupby("negotiation")
        for neg, part in g:
            ts = part["ts_us"].to_numpy()
            ranks = part["rank"].to_numpy()
            ready_by_neg[int(neg)] = (len(set(ranks.tolist())), float(ts[0]), float(ts[-1]),
                                      int(ranks[-1]))

    # Walk spans in order, per pid: attach the last closed negotiation to the next op.
    pending_neg: dict[int, int] = {}
    occurrence: dict[int, int] = {}
    out: dict[str, list[Any]] = {c: [] for c in TENSOR_OP_COLUMNS}
    op_rows = np.flatnonzero(level == "op")
    group_sizes = pd.Series(groups[op_rows]).value_counts().to_dict() if len(op_rows) else {}
    dtypes = sp["dtype"].tolist()
    shapes = sp["shape"].tolist()
    pid_list = pids.tolist()
    level_list = level.tolist()
    for i in range(len(sp)):
        lv = level_list[i]
        pid = pid_list[i]
        if lv == "negotiate":
            pending_neg[pid] = i
            continue
        if lv != "op":
            continue
        occ = occurrence.get(pid, 0)
        occurrence[pid] = occ + 1
        neg = pending_neg.pop(pid, -1)
        c = comm_idx[i]
        dtype = dtypes[i]
        shape = shapes[i]
        elems = shape_elements(shape) if shape else None
        isz = DTYPE_BYTES.get(dtype)
        out["tensor"].append(tl.tensors.get(pid, f"pid{pid}"))
        out["pid"].append(pid)
        out["occurrence"].append(occ)
        out["op"].append(names[i])
        out["op_group"].append(int(groups[i]))
        out["t_start_us"].append(t0[i])
        out["t_end_us"].append(t1[i])
        out["complete"].append(bool(np.isfinite(t1[i])))
        if neg >= 0:
            out["negotiation_us"].append(t1[neg] - t0[neg])
            out["neg_start_us"].append(t0[neg])
            out["neg_end_us"].append(t1[neg])
        else:
            out["negotiation_us"].append(0.0)
            out["neg_start_us"].append(math.nan)
            out["neg_end_us"].append(math.nan)
        out["wait_for_data_us"].append(wait[i])
        out["wait_other_us"].append(wait_other[i])
        out["comm_activity"].append(names[c] if c >= 0 else "")
        out["comm_group"].append(int(groups[c]) if c >= 0 else -1)
        out["comm_start_us"].append(t0[c] if c >= 0 else math.nan)
        out["comm_end_us"].append(t1[c] if c >= 0 else math.nan)
        out["dtype"].append(dtype)
        out["shape"].append(shape)
        out["elements"].append(float(elems) if elems is not None else math.nan)
        out["tensor_bytes"].append(
            float(elems * isz) if elems is not None and isz is not None else math.nan
        )
        out["n_fused"].append(int(group_sizes.get(groups[i], 1)))
        r = ready_by_neg.get(neg)
        if r is None:
            out["ready_ranks"].append(0)
            out["first_ready_us"].append(math.nan)
            out["last_ready_us"].append(math.nan)
            out["last_ready_rank"].append(-1)
            out["ready_spread_us"].append(math.nan)
        else:
            out["ready_ranks"].append(r[0])
            out["first_ready_us"].append(r[1])
            out["last_ready_us"].append(r[2])
            out["last_ready_rank"].append(r[3])
            out["ready_spread_us"].append(r[2] - r[1])
    df = pd.DataFrame(out)
    for col in ("pid", "occurrence", "op_group", "comm_group", "n_fused", "ready_ranks",
                "last_ready_rank"):
        df[col] = df[col].astype(np.int64)
    return df


def fused_ops(tl: Timeline, ops: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per operation instance (one Horovod response = one collective call).

    Columns: op_group, op, comm_activity, comm_group, t_start_us, t_end_us
    (the collective activity's span, else the op's), n_tensors, tensors (list
    of names in timeline order), tensor_bytes (sum; NaN when unknown),
    complete.
    """
    t = tensor_ops(tl) if ops is None else ops
    cols = ["op_group", "op", "comm_activity", "comm_group", "t_start_us", "t_end_us",
            "n_tensors", "tensors", "tensor_bytes", "complete"]
    if t.empty:
        return pd.DataFrame({c: [] for c in cols})
    has_comm = t["comm_activity"].astype(str).to_numpy() != ""
    work = pd.DataFrame({
        "op_group": t["op_group"].to_numpy(),
        "op": t["op"].to_numpy(),
        "comm_activity": t["comm_activity"].to_numpy(),
        "comm_group": t["comm_group"].to_numpy(),
        "start": np.where(has_comm, t["comm_start_us"], t["t_start_us"]),
        "end": np.where(has_comm, t["comm_end_us"], t["t_end_us"]),
        "tensor": t["tensor"].to_numpy(),
        "tensor_bytes": t["tensor_bytes"].to_numpy(dtype=np.float64),
        "complete": t["complete"].to_numpy(dtype=bool),
    })
    g = work.groupby("op_group", sort=True)
    out = g.agg(
        op=("op", "first"),
        comm_activity=("comm_activity", "first"),
        comm_group=("comm_group", "first"),
        t_start_us=("start", "min"),
        t_end_us=("end", "max"),
        n_tensors=("tensor", "size"),
        tensors=("tensor", list),
        tensor_bytes=("tensor_bytes", "sum"),
        complete=("complete", "all"),
    ).reset_index()
    # Unknown if any member's end or size is unknown.
    out.loc[g["end"].count().to_numpy() < out["n_tensors"].to_numpy(), "t_end_us"] = math.nan
    out.loc[g["tensor_bytes"].count().to_numpy() < out["n_tensors"].to_numpy(),
            "tensor_bytes"] = math.nan
    out["n_tensors"] = out["n_tensors"].astype(np.int64)
    out["comm_group"] = out["comm_group"].astype(np.int64)
    out["complete"] = out["complete"].astype(bool)
    return out[cols].sort_values("t_start_us", kind="stable").reset_index(drop=True)


def readiness(tl: Timeline) -> pd.DataFrame:
    """Per uncached negotiation and rank: when the coordinator saw that rank ready.

    Columns: tensor, negotiation, rank, ts_us, lag_us (ts minus the first rank
    ready for that negotiation).  Empty when the timeline has no per-rank
    marks (all negotiations served by the response cache).
    """
    rd = tl.ready
    if rd.empty:
        return pd.DataFrame({c: [] for c in ["tensor", "negotiation", "rank", "ts_us", "lag_us"]})
    out = rd[["tensor", "negotiation", "rank", "ts_us"]].copy()
    out["lag_us"] = out["ts_us"] - out.groupby("negotiation")["ts_us"].transform("min")
    return out.reset_index(drop=True)


def stragglers(tl: Timeline, *, min_spread_us: float = 0.0) -> pd.DataFrame:
    """Per rank: how often it was the last one ready, and the wait it caused.

    A negotiation's straggler is the rank whose readiness mark came last;
    the wait it caused is its lag behind the first rank ready.  Negotiations
    whose spread is <= min_spread_us (e.g. one Horovod cycle) are ignored.
    Columns: rank, last_count, wait_caused_us, max_wait_us, negotiations.
    """
    rd = readiness(tl)
    cols = ["rank", "last_count", "wait_caused_us", "max_wait_us", "negotiations"]
    if rd.empty:
        return pd.DataFrame({c: [] for c in cols})
    last = rd.sort_values(["negotiation", "ts_us"], kind="stable").groupby("negotiation").tail(1)
    last = last[last["lag_us"] > min_spread_us]
    n_neg = rd["negotiation"].nunique()
    ranks = sorted(rd["rank"].unique().tolist())
    rows = []
    for r in ranks:
        part = last[last["rank"] == r]
        rows.append({
            "rank": int(r),
            "last_count": int(len(part)),
            "wait_caused_us": float(part["lag_us"].sum()),
            "max_wait_us": float(part["lag_us"].max()) if len(part) else 0.0,
            "negotiations": int(n_neg),
        })
    return pd.DataFrame(rows, columns=cols)
