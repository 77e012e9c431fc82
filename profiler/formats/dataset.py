"""Raw file -> per-rank DataFrame (row schema of docs/ARCHITECTURE.md section 3).

`raw_to_frame` converts one rank's records: ticks -> nanoseconds on the job axis,
enum codes -> categories, communicator and track indices -> their table
entries, thread kind, call kind (Horovod classification hook) and step number.
`convert_raw` writes `ranks/rank-RRRRR.parquet` and `ranks/rank-RRRRR.json`
(parquet first, then the json, each by an atomic rename: a json file means the
rank's dataset is complete).  `read_dataset` reads parquet files back with
pyarrow.dataset, pushing a rank filter down.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from profiler.errors import CorruptError, NotATraceError, NotFoundError
from profiler.formats.raw import (
    printable,
)
from profiler.formats.rows import empty_frame
from profiler.formats.schema import (
    _DICT_TYPE,
    AGG_KINDS,
    AGG_REQUIRED,
    CATEGORY_COLUMNS,
    DELTA_COLUMNS,
    ROW_KINDS,
    ROW_REQUIRED,
)


# ---------------------------------------------------------------------------
# write / read
# ---------------------------------------------------------------------------
def frame_to_table(df: pd.DataFrame) -> pa.Table:
    """DataFrame -> arrow table with int32-indexed string dictionaries everywhere."""
    # nthreads=1: from_pandas would otherwise convert large frames on a Python
    # ThreadPoolExecutor, which refuses work once the interpreter is shutting
    # down ("cannot schedule new futures after interpreter shutdown"): the
    # exit work of any job that imported concurrent.futures (torch does).
    table = pa.Table.from_pandas(df, preserve_index=False, nthreads=1)
    fields = []
    for f in table.schema:
        fields.append(pa.field(f.name, _DICT_TYPE) if pa.types.is_dictionary(f.type) else f)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


def write_parquet(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """Write a rank's rows as the dataset stores them (zstd, delta-encoded times)."""
    names = table.schema.names
    delta = [c for c in DELTA_COLUMNS if c in names]
    pq.write_table(table, path, compression="zstd",
                   use_dictionary=[c for c in names if c not in delta],
                   column_encoding={c: "DELTA_BINARY_PACKED" for c in delta})


MAX_META_BYTES = 64 << 20  # a rank's metadata is a few KiB (tables of 1024 entries: ~300 KiB)
_INT64 = 1 << 63
# Fields the readers compute with: a document whose fields have other types is
# refused here rather than failing somewhere downstream.
_META_COUNTS = ("calls", "rows", "aggregated_calls", "unsampled_calls")
_META_LISTS = ("comms", "tracks")
_META_STRINGS = ("host", "mode", "profiler_version", "parquet", "aggregates", "executable",
                 "steps_marked_by", "tensors_not_recorded")
_HEADER_INTS = ("world_size", "state", "dropped_records", "pid", "n_chunks", "job_id",
                "offset_ns", "offset_err_ns", "job_t0_ns", "local_rank", "thread_level",
                "clock_kind", "offset_method", "mode", "unsampled_calls", "aggregated_calls",
                "rank", "n_comms", "n_tracks", "cal0_realtime_ns", "offset_at_ns",
                "offset_end_ns", "offset_end_err_ns", "offset_end_at_ns")
_HEADER_STRINGS = ("hostname", "mpi_version", "clock")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64 * 2


def check_meta(p: Path, data: Any) -> dict[str, Any]:
    """Refuse a rank metadata document whose fields have the wrong types."""
    if not isinstance(data, dict) or "header" not in data or "rank" not in data:
        raise NotATraceError(p, "not a horovod-profiler rank metadata file")

    def bad(what: str) -> CorruptError:
        return CorruptError(p, f"corrupt rank metadata: {what}")

    rank = data["rank"]
    if not _is_int(rank) or not 0 <= rank < 1 << 31:
        raise bad(f"rank {rank!r}")
    h = data["header"]
    if not isinstance(h, dict):
        raise bad("header is not an object")
    for k in _HEADER_INTS:
        if k in h and not _is_int(h[k]):
            raise bad(f"header.{k} = {h[k]!r}")
    for k in _HEADER_STRINGS:
        if k in h and not isinstance(h[k], str):
            raise bad(f"header.{k} = {h[k]!r}")
    if "ticks_per_ns" in h and not (isinstance(h["ticks_per_ns"], (int, float))
                                    and not isinstance(h["ticks_per_ns"], bool)):
        raise bad(f"header.ticks_per_ns = {h['ticks_per_ns']!r}")
    if not isinstance(h.get("state_names", []), list):
        raise bad("header.state_names is not a list")
    for k in _META_COUNTS:
        if k in data and not (_is_int(data[k]) and data[k] >= 0):
            raise bad(f"{k} = {data[k]!r}")
    for k in _META_STRINGS:
        if data.get(k) is not None and not isinstance(data[k], str):
            raise bad(f"{k} = {data[k]!r}")
    for k in _META_LISTS:
        rows = data.get(k, [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise bad(f"{k} is not a list of objects")
        for i, r in enumerate(rows):
            for f in ("index", "tid", "id", "size", "rank", "device"):
                if f in r and not _is_int(r[f]):
                    raise bad(f"{k}[{i}].{f} = {r[f]!r}")
            if "name" in r and not isinstance(r["name"], str):
                raise bad(f"{k}[{i}].name = {r['name']!r}")
    if not isinstance(data.get("problems", []), list):
        raise bad("problems is not a list")
    if data.get("env") is not None and not isinstance(data["env"], dict):
        raise bad("env is not an object")
    if data.get("argv") is not None and not isinstance(data["argv"], list):
        raise bad("argv is not a list")
    for k in ("totals", "source", "nccl", "gpus"):
        if data.get(k) is not None and not isinstance(data[k], (dict, list)):
            raise bad(f"{k} = {data[k]!r}")
    for i, r in enumerate(data.get("tracks", [])):
        if not _is_int(r.get("index")):
            raise bad(f"tracks[{i}] has no index")
    for k in ("steps", "totals"):  # counters and rates computed with downstream
        block = data.get(k)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise bad(f"{k} = {block!r}")
        for f, v in block.items():
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                      and abs(v) < _INT64):
                raise bad(f"{k}.{f} = {v!r}")
    return data


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A ranks/rank-R.json document (types checked: see check_meta)."""
    from profiler.formats.raw import read_regular

    p = Path(path)
    raw = read_regular(p, "a rank metadata file", MAX_META_BYTES)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise NotATraceError(p, "not a rank metadata file (not JSON)") from None
    return check_meta(p, data)


def _is_str(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _kind_ok(t: pa.DataType, kind: str) -> bool:
    if kind == "str":
        return _is_str(t)
    if kind == "bool":
        return bool(pa.types.is_boolean(t) or pa.types.is_integer(t))
    if kind == "float":
        return bool(pa.types.is_floating(t) or pa.types.is_integer(t))
    if kind == "list":
        return bool((pa.types.is_list(t) or pa.types.is_large_list(t))
                    and pa.types.is_integer(t.value_type))
    return bool(pa.types.is_integer(t))


def _plain(t: pa.DataType) -> bool:
    """A column type every reader converts (other tools' extra columns)."""
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t)
                or pa.types.is_boolean(t) or _is_str(t))


def schema_columns(schema: pa.Schema, aggregates: bool = False) -> list[str]:
    """The columns of a parquet schema to read: those of the row (or aggregate)
    schema, each of the expected kind, plus other tools' extra columns of plain
    types (others are skipped).  Raises CorruptError (path None) naming the first
    column of the wrong kind, or a required column that is absent."""
    kinds = AGG_KINDS if aggregates else ROW_KINDS
    required = AGG_REQUIRED if aggregates else ROW_REQUIRED
    names = list(schema.names)
    if len(set(names)) != len(names):
        raise CorruptError(None, "a column name appears twice in the parquet schema")
    missing = [c for c in required if c not in names]
    if missing:
        raise CorruptError(None, f"not a horovod-profiler dataset: no {missing[0]} column")
    out = []
    for field in schema:
        kind = kinds.get(field.name)
        if kind is not None:
            if not _kind_ok(field.type, kind):
                raise CorruptError(None, f"column {printable(field.name)} has type "
                                         f"{field.type}, expected {kind}")
            out.append(field.name)
        elif _plain(field.type):
            out.append(field.name)
    return out


def read_dataset(files: Iterable[str | os.PathLike[str]], *,
                 ranks: Iterable[int] | None = None,
                 columns: Sequence[str] | None = None,
                 filter: Any = None, aggregates: bool = False) -> pd.DataFrame:
    """Parquet files of the row schema (or, aggregates=True, of the summary-mode
    aggregates) -> one DataFrame, the rank filter and any other pyarrow.dataset
    `filter` expression (a callable of the column names -> expression, or None)
    pushed down to the scan.  Every way a file can be bad ends in CorruptError
    or NotFoundError."""
    paths = [str(p) for p in files]
    for p in paths:
        if not os.path.isfile(p):
            raise NotFoundError(p, "dataset file missing")
    if not paths:
        return empty_frame(columns)
    where = paths[0] if len(paths) == 1 else os.path.dirname(paths[0])
    try:
        dataset = pads.dataset(paths, format="parquet")
        try:
            usable = schema_columns(dataset.schema, aggregates)
        except CorruptError as exc:
            raise CorruptError(where, exc.message) from None
        cols = (usable if columns is None
                else [c for c in dict.fromkeys(columns) if c in usable])
        flt = filter(set(usable)) if callable(filter) else filter
        if ranks is not None:
            by_rank = pads.field("rank").isin([int(r) for r in ranks])
            flt = by_rank if flt is None else by_rank & flt
        table = dataset.to_table(columns=cols, filter=flt)
        # to_pandas reads the pandas metadata stored in the file (JSON): a
        # corrupt one fails there with ValueError / KeyError / TypeError.
        return table_to_frame(table)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError,
            OverflowError) as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise CorruptError(where, f"unreadable parquet dataset: {printable(text)}") from None


def printable_columns(df: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """`df` with the control characters of its names spelled \\xNN (profiler.errors.
    printable), in place: the given columns, else every column that is not
    numeric or boolean.  Categorical columns are fixed through their categories
    (a handful of names, whatever the number of rows); the others value by value."""
    chosen = list(df.columns) if columns is None else [c for c in columns if c in df.columns]
    for c in chosen:
        col = df[c]
        if isinstance(col.dtype, pd.CategoricalDtype):
            cats = [str(x) for x in col.cat.categories]
            safe = [printable(x) for x in cats]
            if safe == cats:
                continue
            if len(set(safe)) == len(safe):
                df[c] = col.cat.rename_categories(safe)
            else:  # two names that differ only by the escaping: merge them
                df[c] = col.astype(str).map(printable).astype("category")
        elif not (pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col)):
            df[c] = col.map(lambda v: printable(v) if isinstance(v, str) else v)
    return df


def table_to_frame(table: pa.Table) -> pd.DataFrame:
    # Categories for every string dictionary, even across files with different
    # dictionaries (to_pandas unifies them).  Names written by another tool may
    # hold control characters: spelled \xNN like the converter does, so that
    # no reader ever passes an escape sequence on to a terminal or a page.
    df = table.to_pandas()
    for c in CATEGORY_COLUMNS:
        if c in df.columns and not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("category")
    return printable_columns(df, CATEGORY_COLUMNS)


