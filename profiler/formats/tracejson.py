"""trace.json: Chrome Trace Event format (object form) + the profiler's metadata.

Layout (docs/ARCHITECTURE.md section 4).  The metadata block is written
first, so that readers get it from the head of the file without parsing the
events:

    {"horovod_profiler": {...}, "displayTimeUnit": "ns", "traceEvents": [...]}

Events: per rank a process (pid = rank, "rank R (host)"), per track a thread
(tid = track index; Horovod's background thread is named so), complete
events ("ph": "X", ts/dur in microseconds) named by op.

Event selection (bounded whatever the size of the job; the parquet dataset
always holds every row):

* the whole job when it has at most HOROVOD_PROFILE_TRACE_EVENTS rows (default
  500000): every rank's rows are read;
* otherwise a window, read from a few ranks only:
  - ranks: the first HOROVOD_PROFILE_TRACE_RANKS ranks (default 8), plus the
    ranks with the least communication time when the rank metadata says it
    (``totals.comm_ns``: a rank that arrives last at the collectives waits
    least in them, so these are the likely stragglers), at most
    TRACE_EXTRA_RANKS of them.  The number of rows per rank comes from the
    rank metadata (or the parquet footer): no other rank's records are read;
  - steps: when the rows carry step numbers, up to HOROVOD_PROFILE_TRACE_STEPS
    (default 10) consecutive steps around the middle step that fit in the
    limit, as a time window from the first start of the first step to the
    first start of the step after the last one (calls between steps included);
    with no steps, or when one step alone exceeds the limit, the N consecutive
    rows (by start time) centred on the middle.

The metadata says which: "events": {"included", "total", "selection" (text),
and for a window "ranks", "steps" ([first, last] or null), "t_window_ns"}.
Per-thread CPU samples (op "cpu") are dataset rows but never events
(profiler.formats.events.NOT_EVENT_OPS: their intervals cross the events of
the thread they measure); "total" and "included" leave them out.
`profiler export` writes any other window from the dataset.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from profiler._version import __version__
from profiler.errors import (
    CorruptError,
    NotATraceError,
    NotFoundError,
    TruncatedError,
    VersionError,
)
from profiler.formats.events import Selection, Source, read_events

TRACE_FORMAT_VERSION = 1
META_KEY = "horovod_profiler"
_PREFIX = b'{"' + META_KEY.encode() + b'":'
_SLICE = 65536  # events formatted per write


def _thread_label(row: Mapping[str, Any]) -> str:
    kind = row.get("thread_kind", "other")
    name = row.get("name") or ""
    tid = row.get("tid", -1)
    if kind == "horovod":
        return f"Horovod background thread ({name}, tid {tid})"
    if kind == "stream":
        return f"device stream {row.get('index')} (device {row.get('device', -1)})"
    if kind == "main":
        return f"main thread ({name}, tid {tid})"
    return f"thread {name} (tid {tid})"


def metadata_events(rank_meta: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """process_name / thread_name / sort-index metadata events."""
    out: list[dict[str, Any]] = []
    for m in rank_meta:
        r = int(m["rank"])
        out.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                    "args": {"name": f"rank {r} ({m.get('host', '')})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                    "args": {"sort_index": r}})
        for t in m.get("tracks", []):
            out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": int(t["index"]),
                        "args": {"name": _thread_label(t)}})
    return out


_EVENT = ('{"name":%s,"cat":%s,"ph":"X","pid":%d,"tid":%d,"ts":%r,"dur":%r,"args":{'
          '"bytes":%d,"count":%d,"dtype":%s,"dtype_size":%d,"redop":%s,"comm":"%s",'
          '"comm_size":%d,"comm_rank":%d,"seq":%d,"root":%d,"tag":%d,"kind":%s,"step":%d,"flags":%d,'
          '"rc":%d}}')


_NET_ARGS = ("net_send_bytes", "net_recv_bytes", "net_ns", "net_steps")


def _json_strings(df: pd.DataFrame, name: str, default: str) -> list[str]:
    """A (categorical) string column as JSON-encoded strings, one per row, encoding
    each distinct value once."""
    n = len(df)
    if name not in df.columns:
        return [orjson.dumps(default).decode()] * n
    s = df[name]
    cat = s if isinstance(s.dtype, pd.CategoricalDtype) else s.astype("category")
    enc = np.array([orjson.dumps(str(c)).decode() for c in cat.cat.categories]
                   + [orjson.dumps(default).decode()], dtype=object)
    codes = cat.cat.codes.to_numpy()
    return list(enc[np.where(codes < 0, len(enc) - 1, codes)])


def _ints(df: pd.DataFrame, name: str, default: int) -> list[int]:
    if name not in df.columns:
        return [default] * len(df)
    return list(df[name].to_numpy().tolist())


def call_events_json(df: pd.DataFrame) -> bytes:
    """Complete ("X") events for the rows of df, as comma-separated JSON objects.

    Formatted from column lists with one template (no per-event dicts): a
    500k-event trace costs well under a second instead of several."""
    if df.empty:
        return b""
    n = len(df)
    ts = (df["t_start_ns"].to_numpy() / 1e3).tolist()
    dur = (df["dur_ns"].to_numpy() / 1e3).tolist()
    if "comm" in df.columns:
        uniq, inv = np.unique(df["comm"].to_numpy(), return_inverse=True)
        comm = list(np.array([f"{int(u):#x}" for u in uniq], dtype=object)[inv])
    else:
        comm = ["0x0"] * n
    rows = zip(
        _json_strings(df, "op", ""), _json_strings(df, "backend", ""), _ints(df, "rank", 0),
        _ints(df, "track", 0), ts, dur, _ints(df, "bytes", 0), _ints(df, "count", 0),
        _json_strings(df, "dtype", ""), _ints(df, "dtype_size", 0),
        _json_strings(df, "redop", ""), comm, _ints(df, "comm_size", -1),
        _ints(df, "comm_rank", -1), _ints(df, "seq", -1), _ints(df, "root", -1),
        _ints(df, "tag", -1), _json_strings(df, "kind", "data"), _ints(df, "step", -1),
        _ints(df, "flags", 0), _ints(df, "rc", 0),
    )
    if all(c in df.columns for c in _NET_ARGS):
        # the plugin path's network activity per NCCL call (-1: none)
        extra = zip(*(_ints(df, c, -1) for c in _NET_ARGS))
        tmpl = _EVENT[:-2] + "".join(f',"{c}":%d' for c in _NET_ARGS) + "}}"
        return ",".join([tmpl % (*row, *x) for row, x in zip(rows, extra)]).encode()
    tmpl = _EVENT
    return ",".join([tmpl % row for row in rows]).encode()




def write_trace(path: str | os.PathLike[str], meta: dict[str, Any],
                frames: Sequence[Source], rank_meta: Sequence[Mapping[str, Any]],
                sel: Selection, *, description: str | None = None) -> dict[str, Any]:
    """Write trace.json; returns the metadata block written (with "events").

    frames: per rank, its rows as a DataFrame or the path of its parquet file (then
    only the selected ranks' files are read; see the module doc), in the order of
    rank_meta when both are given.  description: the "events.selection" text to
    write instead of the one the selection makes (`profiler export`)."""
    p = Path(path)
    meta = dict(meta)
    meta.setdefault("format_version", TRACE_FORMAT_VERSION)
    meta.setdefault("profiler_version", __version__)
    meta["events"] = sel.events_meta()
    if description is not None:
        meta["events"]["selection"] = description
    shown_meta = rank_meta
    if sel.ranks is not None:
        keep = set(sel.ranks)
        shown_meta = [m for m in rank_meta if int(m["rank"]) in keep]
    head = orjson.dumps(metadata_events(shown_meta))
    opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_PREFIX)
            f.write(orjson.dumps(meta, option=opts))
            f.write(b',"displayTimeUnit":"ns","traceEvents":')
            f.write(head[:-1])
            sep = b"," if len(head) > 2 else b""
            for i in sel.picked:
                part = read_events(frames[i], t_range=(sel.reads or {}).get(i))
                local = sel.rows.get(i)
                if local is not None:
                    part = part.iloc[local]
                # in slices: memory stays bounded whatever the number of events
                for lo in range(0, len(part), _SLICE):
                    body = call_events_json(part.iloc[lo:lo + _SLICE])
                    if body:
                        f.write(sep)
                        f.write(body)
                        sep = b","
                del part
            f.write(b"]}\n")
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return meta


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------
def _check_meta(p: Path, meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise NotATraceError(p, f"'{META_KEY}' metadata is not an object")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise CorruptError(p, "metadata lacks an integer format_version")
    if version > TRACE_FORMAT_VERSION:
        raise VersionError(p, f"trace format version {version} is newer than this "
                              f"profiler understands ({TRACE_FORMAT_VERSION}): upgrade "
                              "horovod-profiler")
    if version < 1:
        raise CorruptError(p, f"invalid trace format version {version}")
    bad = _shape_error(meta, _META_SHAPE, META_KEY)
    if bad:
        raise CorruptError(p, f"malformed metadata: {bad}")
    return meta


# The shape of the metadata fields that readers use (what write_trace and
# profiler.postjob.merge write): a trace edited or written by another tool is refused
# with the field's name rather than failing later in a reader.  Keys not listed
# are not checked; None is accepted for every listed key (absent), not for a
# list's items.  A spec is a
# type or tuple of types, a one-element list (each item's spec), or a dict
# (that object's keys; the key "*" applies to every value).
@dataclass(frozen=True)
class _Required:
    """A key that must be present and not null."""

    spec: Any


_INT = int
_NUM = (int, float)
_RANK_SHAPE: dict[str, Any] = {
    "rank": _Required(_INT), "host": str, "pid": _INT, "calls": _INT, "dropped": _INT,
    "unsampled_calls": _INT, "aggregated_calls": _INT, "offset_ns": _NUM,
    "offset_err_ns": _NUM, "offset_method": _INT, "offset_end_ns": _NUM,
    "offset_end_err_ns": _NUM, "clock_drift_ppm": _NUM, "ticks_per_ns": _NUM,
    "local_rank": _INT, "mode": str,
    "state": [str], "problems": list, "gpus": list, "nccl": dict, "steps": dict,
    "totals": dict,
    "cpu": {"host_cpus": _INT, "affinity": [_INT], "loadavg_start": [_NUM],
            "loadavg_end": [_NUM], "read_cost_ns": _NUM, "schedstat": bool,
            "torch_threads": _INT, "omp_num_threads": str, "rows": _INT,
            "threads": [{"tid": _Required(_INT), "name": str, "kind": str,
                         "start": dict, "end": dict}]},
}
_META_SHAPE: dict[str, Any] = {
    "world_size": _INT, "hosts": [str], "ranks": [_RANK_SHAPE],
    "missing_ranks": [_INT], "partial_ranks": [_INT], "mode": str, "job_id": str,
    "mpi_version": str, "command": [str], "executable": str, "created": str,
    "problems": list, "env": {"*": str}, "clock": dict, "lineage": dict,
    "steps_marked_by": [str], "batch_size": (int, list), "images_per_sec": _NUM,
    "step_ms": _NUM, "step_totals": {"*": _INT},
    "images_per_sec_per_rank": {"*": _NUM},
    "dataset": {"format": str, "files": [str], "aggregates": [str], "calls": _INT,
                "rows": _INT},
    "events": {"included": _INT, "total": _INT, "selection": str, "ranks": [_INT],
               "steps": [_INT], "t_window_ns": [_INT]},
    "window": {"source": str, "calls": _INT, "ranks": [_INT], "steps": [_INT],
               "ops": [str], "kinds": [str], "t_start_ns": [_INT]},
}


def _shape_error(value: Any, spec: Any, where: str) -> str | None:
    """Where `value` departs from `spec` (None when it does not)."""
    if isinstance(spec, _Required):
        return f"{where} is missing" if value is None else _shape_error(value, spec.spec, where)
    if value is None:
        return None
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where} is not an object"
        for key, sub in spec.items():
            items = value.items() if key == "*" else [(key, value.get(key))]
            for k, v in items:
                bad = _shape_error(v, sub, f"{where}.{k}")
                if bad:
                    return bad
        return None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"{where} is not a list"
        for i, v in enumerate(value):
            bad = (f"{where}[{i}] is null" if v is None
                   else _shape_error(v, spec[0], f"{where}[{i}]"))
            if bad:
                return bad
        return None
    types = spec if isinstance(spec, tuple) else (spec,)
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        return f"{where} has the wrong type ({type(value).__name__})"
    if isinstance(value, float) and not np.isfinite(value):
        return f"{where} is not finite"
    return None


def _open_checked(p: Path) -> tuple[int, bytes]:
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise NotFoundError(p, "no such file") from None
    except OSError as exc:
        raise NotFoundError(p, f"cannot read: {exc.strerror or exc}") from None
    if p.is_dir():
        raise NotATraceError(p, "is a directory, not a trace.json (did you mean "
                                f"{p / 'trace.json'}?)")
    if size == 0:
        raise NotATraceError(p, "empty file, not a trace")
    try:
        with open(p, "rb") as f:
            head = f.read(1 << 16)
    except OSError as exc:
        raise NotFoundError(p, f"cannot read: {exc.strerror or exc}") from None
    return size, head


def _tail_ok(p: Path, size: int) -> bool:
    with open(p, "rb") as f:
        f.seek(max(0, size - 64))
        tail = f.read().rstrip()
    return tail.endswith(b"]}")


def read_trace_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated metadata block of a trace.json, without parsing its events
    when the file has the layout this module writes."""
    p = Path(path)
    size, head = _open_checked(p)
    stripped = head.lstrip()
    if stripped.startswith(_PREFIX):
        start = head.index(_PREFIX) + len(_PREFIX)
        meta = _decode_prefix_object(p, start, size)
        if not _tail_ok(p, size):
            raise TruncatedError(p, "truncated trace: the file ends before its events do")
        return _check_meta(p, meta)
    # Another layout (re-saved by a tool, another program's JSON): parse it all.
    doc = _load_json(p, head, size)
    if not isinstance(doc, dict) or META_KEY not in doc:
        what = "a JSON array" if isinstance(doc, list) else "JSON"
        hint = " (a Horovod timeline?)" if isinstance(doc, list) else ""
        raise NotATraceError(p, f"{what} but not a horovod-profiler trace{hint}: no "
                                f"'{META_KEY}' metadata")
    return _check_meta(p, doc[META_KEY])


def _load_json(p: Path, head: bytes, size: int) -> Any:
    first = head.lstrip()[:1]
    if first not in (b"{", b"["):
        raise NotATraceError(p, "not a trace: not JSON")
    try:
        return orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as exc:
        if not _tail_ok(p, size) and first == b"{":
            raise TruncatedError(p, "truncated or corrupt JSON: "
                                    f"{str(exc).splitlines()[0]}") from None
        raise NotATraceError(p, f"not a trace: invalid JSON ({str(exc).splitlines()[0]})"
                             ) from None


def _decode_prefix_object(p: Path, start: int, size: int) -> Any:
    """Decode the JSON object that starts at byte `start`, reading only as much
    of the file as the object needs."""
    import json

    want = 1 << 16
    while True:
        with open(p, "rb") as f:
            f.seek(start)
            data = f.read(want)
        text = data.decode("utf-8", "replace").lstrip()
        try:
            obj, _end = json.JSONDecoder().raw_decode(text)
            return obj
        except json.JSONDecodeError as exc:
            if start + len(data) >= size:
                raise TruncatedError(p, "truncated or corrupt trace metadata: "
                                        f"{exc.msg}") from None
            want *= 4


def read_trace(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Metadata and every event (the whole file parsed; for the fallback path)."""
    p = Path(path)
    meta = read_trace_meta(p)
    size, head = _open_checked(p)
    doc = _load_json(p, head, size)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise CorruptError(p, "trace has no traceEvents list")
    return meta, events


def events_to_frame(events: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The X events of a trace as a DataFrame (the columns the events carry)."""
    xs = [e for e in events if e.get("ph") == "X"]
    n = len(xs)
    args = [e.get("args") or {} for e in xs]

    def a(key: str, default: Any) -> list[Any]:
        return [x.get(key, default) for x in args]

    ts = np.array([e.get("ts", 0.0) for e in xs], dtype=np.float64)
    dur = np.array([e.get("dur", 0.0) for e in xs], dtype=np.float64)
    t_start = np.rint(ts * 1e3).astype(np.int64)
    dur_ns = np.rint(dur * 1e3).astype(np.int64)
    flags = np.array(a("flags", 0), dtype=np.int32) if n else np.zeros(0, np.int32)
    df = pd.DataFrame({
        "rank": np.array([e.get("pid", 0) for e in xs], dtype=np.int32),
        "backend": pd.Categorical([e.get("cat", "") for e in xs]),
        "op": pd.Categorical([e.get("name", "") for e in xs]),
        "t_start_ns": t_start,
        "t_end_ns": t_start + dur_ns,
        "dur_ns": dur_ns,
        "bytes": np.array(a("bytes", 0), dtype=np.int64),
        "count": np.array(a("count", 0), dtype=np.int64),
        "dtype": pd.Categorical(a("dtype", "")),
        "dtype_size": np.array(a("dtype_size", 0), dtype=np.int32),
        "redop": pd.Categorical(a("redop", "")),
        "flags": flags,
        "in_place": (flags & 0x1) != 0,
        "device": (flags & 0x8) != 0,
        "rc": np.array(a("rc", 0), dtype=np.int16),
        "comm": np.array([int(str(c), 0) for c in a("comm", "0x0")], dtype=np.uint64),
        "comm_size": np.array(a("comm_size", -1), dtype=np.int32),
        "comm_rank": np.array(a("comm_rank", -1), dtype=np.int32),
        "root": np.array(a("root", -1), dtype=np.int32),
        "seq": np.array(a("seq", -1), dtype=np.int64),
        "tag": np.array(a("tag", -1), dtype=np.int32),
        "track": np.array([e.get("tid", 0) for e in xs], dtype=np.int32),
        "kind": pd.Categorical(a("kind", "data")),
        "step": np.array(a("step", -1), dtype=np.int32),
    })
    if any(_NET_ARGS[0] in x for x in args):
        for c in _NET_ARGS:
            df[c] = np.array(a(c, -1), dtype=np.int64)
    return df


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
