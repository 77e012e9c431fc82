"""Python view of the raw format defined in hooks/hvprof_format.h.

Numpy structured dtypes for every on-disk struct and the enum tables of the
X-macros.  tests/test_format.py checks all of it against the header: against
the library's own `hvprof_layout_json()` and against a small C program compiled
from the header.  Change the header first, then this file, then the version.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

FORMAT_VERSION = 1
MAGIC = b"HVPROF\0\0"
CHUNK_MAGIC = 0x4B434F52  # "ROCK" little-endian
HEADER_BYTES = 4096
INFLIGHT_OFFSET = 2048  # hvprof_format.h HVPROF_INFLIGHT_OFFSET: the in-flight table
RECORD_BYTES = 64
CHUNK_HEADER_BYTES = 64
COMM_ENTRY_BYTES = 64
TRACK_ENTRY_BYTES = 64
COMM_TABLE_CAPACITY = 1024
TRACK_TABLE_CAPACITY = 1024
DEFAULT_CHUNK_BYTES = 1 << 18  # 4095 records per chunk

# State bits of hvprof_file_header.state
STATE_OPEN = 0x1
STATE_MPI_INIT = 0x2
STATE_FINALIZED = 0x4
STATE_CLOSED = 0x8
STATE_TRUNCATED = 0x10
STATES: dict[int, str] = {
    STATE_OPEN: "open",
    STATE_MPI_INIT: "mpi_init",
    STATE_FINALIZED: "finalized",
    STATE_CLOSED: "closed",
    STATE_TRUNCATED: "truncated",
}

CLOCK_KINDS: dict[int, str] = {0: "unknown", 1: "tsc", 2: "monotonic"}
TRACK_KIND_THREAD = 1
TRACK_KIND_STREAM = 2
COMM_BACKENDS: dict[int, str] = {0: "mpi", 1: "nccl", 2: "gloo"}


def _struct(fields: list[tuple[str, str, int]], itemsize: int) -> np.dtype:
    """A little-endian structured dtype with explicit offsets."""
    return np.dtype(
        {
            "names": [f[0] for f in fields],
            "formats": [f[1] for f in fields],
            "offsets": [f[2] for f in fields],
            "itemsize": itemsize,
        }
    )


RECORD_DTYPE = _struct(
    [
        ("t_start", "<u8", 0),
        ("t_end", "<u8", 8),
        ("bytes", "<u8", 16),
        ("count", "<u8", 24),
        ("seq", "<u4", 32),
        ("comm", "<u4", 36),
        ("track", "<u4", 40),
        ("root", "<i4", 44),
        ("op", "<u2", 48),
        ("dtype", "u1", 50),
        ("redop", "u1", 51),
        ("flags", "<u2", 52),
        ("rc", "<i2", 54),
        ("dtype_size", "<u4", 56),
        ("aux", "<u4", 60),
    ],
    RECORD_BYTES,
)

CHUNK_HEADER_DTYPE = _struct(
    [
        ("magic", "<u4", 0),
        ("track", "<u4", 4),
        ("nrec", "<u8", 8),
        ("index", "<u8", 16),
        ("reserved", "(5,)<u8", 24),
    ],
    CHUNK_HEADER_BYTES,
)

COMM_ENTRY_DTYPE = _struct(
    [
        ("handle", "<u8", 0),
        ("id", "<u8", 8),
        ("size", "<i4", 16),
        ("rank", "<i4", 20),
        ("world_rank0", "<i4", 24),
        ("backend", "<u2", 28),
        ("valid", "<u2", 30),
        ("name", "S32", 32),
    ],
    COMM_ENTRY_BYTES,
)

TRACK_ENTRY_DTYPE = _struct(
    [
        ("handle", "<u8", 0),
        ("tid", "<i4", 8),
        ("kind", "<u2", 12),
        ("valid", "<u2", 14),
        ("is_main", "<i4", 16),
        ("device", "<i4", 20),
        ("name", "S16", 24),
        ("caller", "S24", 40),
    ],
    TRACK_ENTRY_BYTES,
)

HEADER_DTYPE = _struct(
    [
        ("magic", "S8", 0),
        ("version", "<u4", 8),
        ("header_bytes", "<u4", 12),
        ("record_bytes", "<u4", 16),
        ("chunk_bytes", "<u4", 20),
        ("comm_table_offset", "<u4", 24),
        ("comm_table_capacity", "<u4", 28),
        ("track_table_offset", "<u4", 32),
        ("track_table_capacity", "<u4", 36),
        ("first_chunk_offset", "<u8", 40),
        ("rank", "<i4", 48),
        ("world_size", "<i4", 52),
        ("local_rank", "<i4", 56),
        ("pid", "<i4", 60),
        ("state", "<u4", 64),
        ("n_comms", "<u4", 68),
        ("n_tracks", "<u4", 72),
        ("thread_level", "<i4", 76),
        ("n_chunks", "<u8", 80),
        ("dropped_records", "<u8", 88),
        ("clock_kind", "<u4", 96),
        ("offset_method", "<u4", 100),
        ("ticks_per_ns", "<f8", 104),
        ("cal0_ticks", "<i8", 112),
        ("cal0_mono_ns", "<i8", 120),
        ("cal1_ticks", "<i8", 128),
        ("cal1_mono_ns", "<i8", 136),
        ("cal0_realtime_ns", "<i8", 144),
        ("offset_ns", "<i8", 152),
        ("offset_err_ns", "<i8", 160),
        ("init_start_ticks", "<i8", 168),
        ("init_end_ticks", "<i8", 176),
        ("finalize_ticks", "<i8", 184),
        ("job_id", "<u8", 192),
        ("hostname", "S64", 200),
        ("mpi_version", "S256", 264),
        ("job_t0_ns", "<i8", 520),
        ("mode", "<u4", 528),
        ("sampling", "<u4", 532),
        ("unsampled_calls", "<u8", 536),
        ("aggregated_calls", "<u8", 544),
        ("offset_at_ns", "<i8", 552),
        ("offset_end_ns", "<i8", 560),
        ("offset_end_err_ns", "<i8", 568),
        ("offset_end_at_ns", "<i8", 576),
        ("inflight_offset", "<u4", 584),
        ("inflight_capacity", "<u4", 588),
        ("call_cost_ns", "<f8", 592),
        ("helper_cpu_ns", "<i8", 600),
        ("self_converts", "<u4", 608),
        ("reserved", f"S{INFLIGHT_OFFSET - 612}", 612),
        ("inflight", f"S{HEADER_BYTES - INFLIGHT_OFFSET}", INFLIGHT_OFFSET),
    ],
    HEADER_BYTES,
)

# The flight recorder: each thread's collective while it is in progress
# (hvprof_format.h hvprof_inflight_entry), the table inside the header.
INFLIGHT_ENTRY_DTYPE = _struct(
    [
        ("state", "<u4", 0),
        ("op", "<u2", 4),
        ("pad0", "<u2", 6),
        ("comm", "<u8", 8),
        ("t_start", "<u8", 16),
        ("peer", "<i4", 24),
        ("tag", "<i4", 28),
        ("reserved", "S32", 32),
    ],
    64,
)

# Summary mode (HOROVOD_PROFILE=summary): raw/rank-R.agg = header + entries.
AGG_MAGIC = b"HVPAGG\0\0"
AGG_BUCKETS = 160
AGG_HEADER_BYTES = 64
AGG_ENTRY_BYTES = 64 + 4 * AGG_BUCKETS

AGG_HEADER_DTYPE = _struct(
    [
        ("magic", "S8", 0),
        ("version", "<u4", 8),
        ("entry_bytes", "<u4", 12),
        ("n_entries", "<u8", 16),
        ("rank", "<i4", 24),
        ("buckets", "<u4", 28),
        ("snapshot_ticks", "<u8", 32),
        ("overflow_calls", "<u8", 40),
        ("reserved", "(2,)<u8", 48),
    ],
    AGG_HEADER_BYTES,
)

AGG_ENTRY_DTYPE = _struct(
    [
        ("bytes", "<u8", 0),
        ("calls", "<u8", 8),
        ("sum_ticks", "<u8", 16),
        ("min_ticks", "<u8", 24),
        ("max_ticks", "<u8", 32),
        ("first_ticks", "<u8", 40),
        ("comm", "<u4", 48),
        ("track", "<u4", 52),
        ("op", "<u2", 56),
        ("dtype", "u1", 58),
        ("redop", "u1", 59),
        ("flags_or", "<u2", 60),
        ("errors", "<u2", 62),
        ("hist", f"({AGG_BUCKETS},)<u4", 64),
    ],
    AGG_ENTRY_BYTES,
)

MODE_FULL = 0
MODE_SUMMARY = 1
MODES: dict[int, str] = {MODE_FULL: "full", MODE_SUMMARY: "summary"}


def fold_ptr(address: int) -> int:
    """hvprof_fold_ptr: a buffer address in 32 bits (low half XOR high half),
    as MPI records keep their receive buffer (aux) and APP_TENSOR records the
    tensor's output."""
    v = int(address) & 0xFFFFFFFFFFFFFFFF
    return (v ^ (v >> 32)) & 0xFFFFFFFF


def agg_bucket(d: int) -> int:
    """Histogram bucket of a duration in ticks (hvprof_agg_bucket): 4 per power of two."""
    d = int(d)
    if d < 4:
        return d
    lg = d.bit_length() - 1
    b = 4 * (lg - 1) + ((d >> (lg - 2)) & 3)
    return min(b, AGG_BUCKETS - 1)


def agg_bucket_bounds(b: int) -> tuple[int, int]:
    """[lo, hi) ticks of histogram bucket b (the last bucket is open-ended)."""
    if b < 4:
        return b, b + 1
    lg = b // 4 + 1
    frac = b % 4
    lo = (1 << lg) + frac * (1 << (lg - 2))
    return lo, lo + (1 << (lg - 2))


STRUCTS: Mapping[str, np.dtype] = {
    "hvprof_record": RECORD_DTYPE,
    "hvprof_chunk_header": CHUNK_HEADER_DTYPE,
    "hvprof_comm_entry": COMM_ENTRY_DTYPE,
    "hvprof_track_entry": TRACK_ENTRY_DTYPE,
    "hvprof_file_header": HEADER_DTYPE,
    "hvprof_inflight_entry": INFLIGHT_ENTRY_DTYPE,
    "hvprof_agg_header": AGG_HEADER_DTYPE,
    "hvprof_agg_entry": AGG_ENTRY_DTYPE,
}

# ---------------------------------------------------------------------------
# Enum tables (X-macros of hvprof_format.h).  value -> (C NAME, "name", backend)
# ---------------------------------------------------------------------------
OPS: dict[int, tuple[str, str, str]] = {
    0: ("NONE", "none", "none"),
    1: ("MPI_ALLREDUCE", "allreduce", "mpi"),
    2: ("MPI_IALLREDUCE", "iallreduce", "mpi"),
    3: ("MPI_REDUCE", "reduce", "mpi"),
    4: ("MPI_BCAST", "bcast", "mpi"),
    5: ("MPI_ALLGATHER", "allgather", "mpi"),
    6: ("MPI_ALLGATHERV", "allgatherv", "mpi"),
    7: ("MPI_GATHER", "gather", "mpi"),
    8: ("MPI_GATHERV", "gatherv", "mpi"),
    9: ("MPI_ALLTOALL", "alltoall", "mpi"),
    10: ("MPI_ALLTOALLV", "alltoallv", "mpi"),
    11: ("MPI_REDUCE_SCATTER", "reduce_scatter", "mpi"),
    12: ("MPI_REDUCE_SCATTER_BLOCK", "reduce_scatter_block", "mpi"),
    13: ("MPI_BARRIER", "barrier", "mpi"),
    14: ("MPI_INIT", "init", "mpi"),
    15: ("MPI_FINALIZE", "finalize", "mpi"),
    16: ("MPI_SEND", "send", "mpi"),
    17: ("MPI_RECV", "recv", "mpi"),
    18: ("MPI_ISEND", "isend", "mpi"),
    19: ("MPI_IRECV", "irecv", "mpi"),
    20: ("MPI_SENDRECV", "sendrecv", "mpi"),
    21: ("MPI_SENDRECV_RECV", "sendrecv_recv", "mpi"),
    22: ("MPI_PROBE", "probe", "mpi"),
    23: ("MPI_IPROBE", "iprobe", "mpi"),
    32: ("APP_STEP", "step", "app"),
    33: ("APP_MARK", "mark", "app"),
    34: ("APP_SYNC", "sync", "app"),
    35: ("APP_TENSOR", "tensor", "app"),
    36: ("APP_CPU", "cpu", "app"),
    37: ("APP_JOIN", "join", "app"),
    64: ("NCCL_ALLREDUCE", "nccl_allreduce", "nccl"),
    65: ("NCCL_REDUCESCATTER", "nccl_reducescatter", "nccl"),
    66: ("NCCL_ALLGATHER", "nccl_allgather", "nccl"),
    67: ("NCCL_BROADCAST", "nccl_broadcast", "nccl"),
    68: ("NCCL_BCAST", "nccl_bcast", "nccl"),
    69: ("NCCL_REDUCE", "nccl_reduce", "nccl"),
    70: ("NCCL_SEND", "nccl_send", "nccl"),
    71: ("NCCL_RECV", "nccl_recv", "nccl"),
    72: ("NCCL_GROUP", "nccl_group", "nccl"),
    73: ("NCCL_NET", "nccl_net", "nccl"),
    80: ("GLOO_ALLREDUCE", "gloo_allreduce", "gloo"),
    81: ("GLOO_ALLGATHER", "gloo_allgather", "gloo"),
    82: ("GLOO_BROADCAST", "gloo_broadcast", "gloo"),
    83: ("GLOO_ALLTOALL", "gloo_alltoall", "gloo"),
    84: ("GLOO_REDUCESCATTER", "gloo_reducescatter", "gloo"),
    88: ("GLOO_BITAND", "gloo_bitand", "gloo"),
    89: ("GLOO_BITOR", "gloo_bitor", "gloo"),
    90: ("GLOO_CTL_BCAST", "gloo_ctl_bcast", "gloo"),
    91: ("GLOO_BARRIER", "gloo_barrier", "gloo"),
    92: ("GLOO_SPLITS", "gloo_splits", "gloo"),
    93: ("GLOO_ALLGATHER_INTS", "gloo_allgather_ints", "gloo"),
    94: ("GLOO_READY", "gloo_ready", "gloo"),
    95: ("GLOO_FINAL", "gloo_final", "gloo"),
}

#: Horovod's Gloo ops (hooks/gloo.c): the collectives its data ops run, and
#: its controller's negotiation and set-up (always kind "control").
GLOO_DATA_OPS = frozenset({"gloo_allreduce", "gloo_allgather", "gloo_broadcast",
                           "gloo_alltoall", "gloo_reducescatter"})
GLOO_CONTROL_OPS = frozenset({"gloo_bitand", "gloo_bitor", "gloo_ctl_bcast", "gloo_barrier",
                              "gloo_splits", "gloo_allgather_ints", "gloo_ready",
                              "gloo_final"})

#: What is not a call, defined once (every layer reads these):
#: MPI's set-up and tear-down.  Recorded, and their time is the job's, but
#: never communication: no call count, match or communication time holds them.
LIFECYCLE_OPS = frozenset({"init", "finalize"})
#: The application's rows (backend "app"): its steps, marks, synchronize and
#: join waits, tensor hand-overs, and per-thread CPU accounting.  Markers of
#: what the application did, not calls.
APP_OPS = frozenset(name for name, backend in (v[1:] for v in OPS.values())
                    if backend == "app")
#: Records that are not calls even as records (trace.json's event count and the
#: watcher's leave them out): per-thread CPU accounting and NCCL's network
#: activity under a collective.
NOT_CALL_RECORDS = frozenset({"cpu", "nccl_net"})
#: The kinds a call is classified as (profiler.postjob.classify), in the order
#: of the dataset's categorical kind column.
CALL_KINDS: tuple[str, ...] = ("data", "control", "app", "p2p")


def kind_key(kind: object) -> tuple[int, str]:
    """Sort key of a kind: CALL_KINDS' order (every table that lists kinds
    lists them so), an unknown kind after them by name."""
    k = str(kind)
    return (CALL_KINDS.index(k) if k in CALL_KINDS else len(CALL_KINDS), k)


def is_comm_op(name: str, backend: str) -> bool:
    """A communication call: an MPI or NCCL op that is not MPI's set-up or
    tear-down, nor NCCL's network activity under a call."""
    return (backend in ("mpi", "nccl") and name not in LIFECYCLE_OPS
            and name not in NOT_CALL_RECORDS)


# value -> (C NAME, "name")
DTYPES: dict[int, tuple[str, str]] = {
    0: ("UNKNOWN", "unknown"),
    1: ("DERIVED", "derived"),
    2: ("MPI_BYTE", "MPI_BYTE"),
    3: ("MPI_CHAR", "MPI_CHAR"),
    4: ("MPI_SIGNED_CHAR", "MPI_SIGNED_CHAR"),
    5: ("MPI_UNSIGNED_CHAR", "MPI_UNSIGNED_CHAR"),
    6: ("MPI_SHORT", "MPI_SHORT"),
    7: ("MPI_UNSIGNED_SHORT", "MPI_UNSIGNED_SHORT"),
    8: ("MPI_INT", "MPI_INT"),
    9: ("MPI_UNSIGNED", "MPI_UNSIGNED"),
    10: ("MPI_LONG", "MPI_LONG"),
    11: ("MPI_UNSIGNED_LONG", "MPI_UNSIGNED_LONG"),
    12: ("MPI_LONG_LONG_INT", "MPI_LONG_LONG_INT"),
    13: ("MPI_UNSIGNED_LONG_LONG", "MPI_UNSIGNED_LONG_LONG"),
    14: ("MPI_FLOAT", "MPI_FLOAT"),
    15: ("MPI_DOUBLE", "MPI_DOUBLE"),
    16: ("MPI_LONG_DOUBLE", "MPI_LONG_DOUBLE"),
    17: ("MPI_C_BOOL", "MPI_C_BOOL"),
    18: ("MPI_INT8_T", "MPI_INT8_T"),
    19: ("MPI_INT16_T", "MPI_INT16_T"),
    20: ("MPI_INT32_T", "MPI_INT32_T"),
    21: ("MPI_INT64_T", "MPI_INT64_T"),
    22: ("MPI_UINT8_T", "MPI_UINT8_T"),
    23: ("MPI_UINT16_T", "MPI_UINT16_T"),
    24: ("MPI_UINT32_T", "MPI_UINT32_T"),
    25: ("MPI_UINT64_T", "MPI_UINT64_T"),
    26: ("MPI_C_FLOAT_COMPLEX", "MPI_C_FLOAT_COMPLEX"),
    27: ("MPI_C_DOUBLE_COMPLEX", "MPI_C_DOUBLE_COMPLEX"),
    28: ("MPI_FLOAT_INT", "MPI_FLOAT_INT"),
    29: ("MPI_DOUBLE_INT", "MPI_DOUBLE_INT"),
    30: ("MPI_LONG_INT", "MPI_LONG_INT"),
    31: ("MPI_2INT", "MPI_2INT"),
    32: ("MPI_WCHAR", "MPI_WCHAR"),
    33: ("MPI_PACKED", "MPI_PACKED"),
    64: ("NCCL_INT8", "ncclInt8"),
    65: ("NCCL_UINT8", "ncclUint8"),
    66: ("NCCL_INT32", "ncclInt32"),
    67: ("NCCL_UINT32", "ncclUint32"),
    68: ("NCCL_INT64", "ncclInt64"),
    69: ("NCCL_UINT64", "ncclUint64"),
    70: ("NCCL_FLOAT16", "ncclFloat16"),
    71: ("NCCL_FLOAT32", "ncclFloat32"),
    72: ("NCCL_FLOAT64", "ncclFloat64"),
    73: ("NCCL_BFLOAT16", "ncclBfloat16"),
    74: ("NCCL_FLOAT8E4M3", "ncclFloat8e4m3"),
    75: ("NCCL_FLOAT8E5M2", "ncclFloat8e5m2"),
    76: ("INT16", "int16"),
    77: ("UINT16", "uint16"),
}

REDOPS: dict[int, tuple[str, str]] = {
    0: ("NONE", "none"),
    1: ("SUM", "sum"),
    2: ("PROD", "prod"),
    3: ("MIN", "min"),
    4: ("MAX", "max"),
    5: ("LAND", "land"),
    6: ("BAND", "band"),
    7: ("LOR", "lor"),
    8: ("BOR", "bor"),
    9: ("LXOR", "lxor"),
    10: ("BXOR", "bxor"),
    11: ("MINLOC", "minloc"),
    12: ("MAXLOC", "maxloc"),
    13: ("REPLACE", "replace"),
    14: ("NO_OP", "no_op"),
    15: ("AVG", "avg"),
    16: ("PREMULSUM", "premulsum"),
    255: ("USER", "user"),
}

FLAGS: dict[int, tuple[str, str]] = {
    0x0001: ("IN_PLACE", "in_place"),
    0x0002: ("ERROR", "error"),
    0x0004: ("NONBLOCKING", "nonblocking"),
    0x0008: ("DEVICE", "device"),
    0x0010: ("GROUPED", "grouped"),
    0x0020: ("DERIVED_TYPE", "derived_type"),
    0x0040: ("NO_COMPLETION", "no_completion"),
    0x0080: ("DEVICE_PENDING", "device_pending"),
    0x0100: ("FROM_STATUS", "from_status"),
}

FLAG_IN_PLACE = 0x0001
FLAG_ERROR = 0x0002
FLAG_NONBLOCKING = 0x0004
FLAG_DEVICE = 0x0008
FLAG_GROUPED = 0x0010
FLAG_DERIVED_TYPE = 0x0020
FLAG_NO_COMPLETION = 0x0040
FLAG_DEVICE_PENDING = 0x0080
FLAG_FROM_STATUS = 0x0100

#: APP_TENSOR flags bits 12-15 (hvprof_format.h HVPROF_TENSOR_OP_*): the
#: operation of a tensor whose name does not start with it (TensorFlow's node
#: names); 0: the name's prefix says it (horovod.torch's names)
TENSOR_OP_SHIFT = 12
TENSOR_OPS = {1: "allreduce", 2: "allgather", 3: "broadcast", 4: "alltoall", 5: "reducescatter"}

# MPI point-to-point (hvprof_format.h, ops 16..23): no per-communicator
# sequence number; root = the peer (a rank of the record's communicator, or
# PEER_PROC_NULL / PEER_ANY_SOURCE), seq = the tag (int32 bits).  Sends carry
# what the rank sends, receives what it received (FROM_STATUS) or posted;
# probes are neither (they move nothing).
P2P_SEND_OPS = frozenset({"send", "isend", "sendrecv"})
P2P_RECV_OPS = frozenset({"recv", "irecv", "sendrecv_recv"})
P2P_OPS = P2P_SEND_OPS | P2P_RECV_OPS | {"probe", "iprobe"}
PEER_PROC_NULL = -2
PEER_ANY_SOURCE = -3
TAG_ANY = -1

# Name -> value lookups (by the C NAME without prefix and by the short name).
OP_BY_NAME: dict[str, int] = {v[1]: k for k, v in OPS.items()}
OP_BY_CNAME: dict[str, int] = {v[0]: k for k, v in OPS.items()}
DTYPE_BY_NAME: dict[str, int] = {v[1]: k for k, v in DTYPES.items()}
REDOP_BY_NAME: dict[str, int] = {v[1]: k for k, v in REDOPS.items()}

OP_APP_STEP = OP_BY_CNAME["APP_STEP"]
OP_APP_MARK = OP_BY_CNAME["APP_MARK"]
OP_APP_CPU = OP_BY_CNAME["APP_CPU"]


def op_name(value: int) -> str:
    """Short name of an op value; unknown values (a newer writer) -> "op_<n>"."""
    entry = OPS.get(int(value))
    return entry[1] if entry else f"op_{int(value)}"


def op_backend(value: int) -> str:
    entry = OPS.get(int(value))
    return entry[2] if entry else "unknown"


def dtype_name(value: int) -> str:
    entry = DTYPES.get(int(value))
    return entry[1] if entry else f"dtype_{int(value)}"


def redop_name(value: int) -> str:
    entry = REDOPS.get(int(value))
    return entry[1] if entry else f"redop_{int(value)}"


def state_names(state: int) -> list[str]:
    return [name for bit, name in STATES.items() if state & bit]


def layout() -> dict[str, object]:
    """This module's view in the shape of hvprof_layout_json() (for comparison)."""
    structs: dict[str, object] = {}
    for name, dt in STRUCTS.items():
        fields = dt.fields
        assert fields is not None
        structs[name] = {
            "size": dt.itemsize,
            "fields": {f: int(spec[1]) for f, spec in fields.items()},
        }
    return {
        "version": FORMAT_VERSION,
        "structs": structs,
        "ops": {k: v[1] for k, v in OPS.items()},
        "dtypes": {k: v[1] for k, v in DTYPES.items()},
        "redops": {k: v[1] for k, v in REDOPS.items()},
        "flags": {k: v[1] for k, v in FLAGS.items()},
    }
