"""The row schema (docs/ARCHITECTURE.md section 3) and the summary-mode aggregate
schema: column names, which are categories, the column kinds every parquet read
checks, the required columns, and the delta-encoded ones."""

from __future__ import annotations

import pyarrow as pa

COLUMNS = [
    "rank", "backend", "op", "t_start_ns", "t_end_ns", "dur_ns", "bytes", "count",
    "dtype", "dtype_size", "redop", "flags", "in_place", "device", "rc", "comm",
    "comm_size", "comm_rank", "comm_name", "root", "seq", "tag", "track", "tid",
    "thread_kind", "thread_name", "group", "buf", "kind", "step",
]


CATEGORY_COLUMNS = ("backend", "op", "dtype", "redop", "comm_name", "thread_kind",
                    "thread_name", "kind")


_DICT_TYPE = pa.dictionary(pa.int32(), pa.string())


AGG_COLUMNS = [
    "rank", "backend", "op", "bytes", "dtype", "redop", "flags", "comm", "comm_size",
    "comm_rank", "comm_name", "track", "tid", "thread_kind", "thread_name", "kind", "calls",
    "errors", "total_ns", "min_ns", "max_ns", "first_ns", "ns_per_tick", "hist",
]


# Times, sequence and step numbers grow within a rank: delta encoding (instead of
# dictionaries) halves the dataset, 24 -> 12 bytes per row at 100k calls per rank.
DELTA_COLUMNS = ("t_start_ns", "t_end_ns", "dur_ns", "seq", "step")


# The column kinds of the two parquet schemas (the row schema and the
# summary-mode aggregates), checked on every file read: a dataset written or
# edited by another tool is refused with the column's name (CorruptError)
# instead of failing later in an analysis.  tests/test_dataset.py checks these
# against the frames raw_to_frame and agg_to_frame build.
ROW_KINDS: dict[str, str] = {
    c: "str" if c in CATEGORY_COLUMNS else "bool" if c in ("in_place", "device") else "int"
    for c in COLUMNS}


AGG_KINDS: dict[str, str] = {
    c: ("str" if c in CATEGORY_COLUMNS else "float" if c == "ns_per_tick"
        else "list" if c == "hist" else "int") for c in AGG_COLUMNS}


ROW_REQUIRED = ("rank", "op", "t_start_ns", "dur_ns", "bytes")


AGG_REQUIRED = ("rank", "op", "bytes", "calls", "total_ns")
