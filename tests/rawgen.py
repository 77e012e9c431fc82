"""Test-only writer of raw files (hooks/hvprof_format.h), independent of the C library.

Used by the reader tests, the CLI bad-input tests, fuzzing and the scale
generator (benchmarks/summarize_1m.py).  It follows the header's layout through
profiler.formats.record's dtypes (checked against the header by tests/test_format.py):

    header (4096) | comm table | track table | chunks (chunk_bytes each)

Chunks are handed to tracks round-robin, the way concurrent threads would get
them from the shared counter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from profiler.formats import record as F

ALL_DONE = F.STATE_OPEN | F.STATE_MPI_INIT | F.STATE_FINALIZED | F.STATE_CLOSED


def records(n: int, **fields: object) -> np.ndarray:
    """n zeroed records; keyword arguments set fields (scalars or arrays)."""
    rec = np.zeros(n, dtype=F.RECORD_DTYPE)
    rec["root"] = -1
    for name, value in fields.items():
        rec[name] = value  # type: ignore[index]
    return rec


def op(name: str) -> int:
    return F.OP_BY_NAME[name]


def dtype(name: str) -> int:
    return F.DTYPE_BY_NAME[name]


def redop(name: str) -> int:
    return F.REDOP_BY_NAME[name]


@dataclass
class RawWriter:
    """Build one rank's raw file in memory and write it."""

    rank: int = 0
    world_size: int = 1
    chunk_bytes: int = 4096
    state: int = ALL_DONE
    clock_kind: int = 2  # CLOCK_MONOTONIC ns: ticks == ns
    ticks_per_ns: float = 1.0
    cal0: tuple[int, int] = (0, 0)
    cal1: tuple[int, int] = (0, 0)
    offset_ns: int = 0
    offset_err_ns: int = 0
    job_t0_ns: int = 0
    job_id: int = 0xABCDEF
    hostname: str = "testhost"
    mpi_version: str = "Open MPI v4.1 (rawgen)"
    pid: int = 4242
    self_converts: int = 0  # 1: the rank converts its own file at exit (Python)
    dropped: int = 0
    version: int = F.FORMAT_VERSION
    record_bytes: int = F.RECORD_BYTES
    comm_capacity: int = 16
    track_capacity: int = 16
    comms: list[tuple[int, int, int, int, str]] = field(default_factory=list)
    tracks: list[tuple[int, int, int, str, str, int]] = field(default_factory=list)
    per_track: dict[int, list[np.ndarray]] = field(default_factory=dict)

    # -- tables -----------------------------------------------------------
    def add_comm(self, comm_id: int, size: int, rank: int, name: str = "",
                 backend: int = 0) -> int:
        self.comms.append((comm_id, size, rank, backend, name))
        return len(self.comms) - 1

    def add_track(self, tid: int, *, is_main: bool = False, name: str = "python",
                  caller: str = "", stream: bool = False) -> int:
        kind = F.TRACK_KIND_STREAM if stream else F.TRACK_KIND_THREAD
        self.tracks.append((tid, kind, int(is_main), name, caller, 0 if stream else -1))
        return len(self.tracks) - 1

    def add(self, track: int, recs: np.ndarray, *, keep_track: bool = False) -> None:
        """recs into `track`'s chunks; their track field becomes `track` unless
        keep_track (records about another thread: APP_CPU)."""
        recs = recs.copy()
        if not keep_track:
            recs["track"] = track
        self.per_track.setdefault(track, []).append(recs)

    @property
    def capacity(self) -> int:
        return (self.chunk_bytes - F.CHUNK_HEADER_BYTES) // F.RECORD_BYTES

    # -- layout -----------------------------------------------------------
    def comm_offset(self) -> int:
        return F.HEADER_BYTES

    def track_offset(self) -> int:
        return self.comm_offset() + self.comm_capacity * F.COMM_ENTRY_BYTES

    def first_chunk_offset(self) -> int:
        end = self.track_offset() + self.track_capacity * F.TRACK_ENTRY_BYTES
        return (end + 4095) // 4096 * 4096

    def _chunks(self) -> list[tuple[int, np.ndarray]]:
        """(track, records) per chunk, tracks interleaved round-robin."""
        pieces: dict[int, list[np.ndarray]] = {}
        for track, lst in self.per_track.items():
            allrec = np.concatenate(lst) if lst else records(0)
            cap = self.capacity
            pieces[track] = [allrec[i:i + cap] for i in range(0, len(allrec), cap)]
        out: list[tuple[int, np.ndarray]] = []
        i = 0
        while any(i < len(p) for p in pieces.values()):
            for track in sorted(pieces):
                if i < len(pieces[track]):
                    out.append((track, pieces[track][i]))
            i += 1
        return out

    def header(self, n_chunks: int) -> np.ndarray:
        h = np.zeros(1, dtype=F.HEADER_DTYPE)
        h["magic"] = F.MAGIC
        h["version"] = self.version
        h["header_bytes"] = F.HEADER_BYTES
        h["record_bytes"] = self.record_bytes
        h["chunk_bytes"] = self.chunk_bytes
        h["comm_table_offset"] = self.comm_offset()
        h["comm_table_capacity"] = self.comm_capacity
        h["track_table_offset"] = self.track_offset()
        h["track_table_capacity"] = self.track_capacity
        h["first_chunk_offset"] = self.first_chunk_offset()
        h["rank"] = self.rank
        h["world_size"] = self.world_size
        h["local_rank"] = self.rank
        h["pid"] = self.pid
        h["self_converts"] = self.self_converts
        h["state"] = self.state | (F.STATE_TRUNCATED if self.dropped else 0)
        h["n_comms"] = len(self.comms)
        h["n_tracks"] = len(self.tracks)
        h["thread_level"] = 3
        h["n_chunks"] = n_chunks
        h["dropped_records"] = self.dropped
        h["clock_kind"] = self.clock_kind
        h["offset_method"] = 1 if self.world_size > 1 else 0
        h["ticks_per_ns"] = self.ticks_per_ns
        h["cal0_ticks"], h["cal0_mono_ns"] = self.cal0
        h["cal1_ticks"], h["cal1_mono_ns"] = self.cal1
        h["cal0_realtime_ns"] = 1_700_000_000_000_000_000
        h["offset_ns"] = self.offset_ns
        h["offset_err_ns"] = self.offset_err_ns
        h["job_id"] = self.job_id
        h["hostname"] = self.hostname.encode()
        h["mpi_version"] = self.mpi_version.encode()
        h["job_t0_ns"] = self.job_t0_ns
        return h

    def to_bytes(self) -> bytes:
        chunks = self._chunks()
        buf = bytearray(self.first_chunk_offset() + len(chunks) * self.chunk_bytes)
        buf[0:F.HEADER_BYTES] = self.header(len(chunks)).tobytes()
        ct = np.zeros(self.comm_capacity, dtype=F.COMM_ENTRY_DTYPE)
        for i, (cid, size, rank, backend, name) in enumerate(self.comms):
            ct[i] = (0x1000 + i, cid, size, rank, 0, backend, 1, name.encode())
        off = self.comm_offset()
        buf[off:off + ct.nbytes] = ct.tobytes()
        tt = np.zeros(self.track_capacity, dtype=F.TRACK_ENTRY_DTYPE)
        for i, (tid, kind, is_main, name, caller, device) in enumerate(self.tracks):
            tt[i] = (0x7000 + i, tid, kind, 1, is_main, device, name.encode(),
                     caller.encode())
        off = self.track_offset()
        buf[off:off + tt.nbytes] = tt.tobytes()
        for index, (track, recs) in enumerate(chunks):
            base = self.first_chunk_offset() + index * self.chunk_bytes
            ch = np.zeros(1, dtype=F.CHUNK_HEADER_DTYPE)
            ch["magic"] = F.CHUNK_MAGIC
            ch["track"] = track
            ch["nrec"] = len(recs)
            ch["index"] = index
            buf[base:base + F.CHUNK_HEADER_BYTES] = ch.tobytes()
            body = recs.tobytes()
            buf[base + F.CHUNK_HEADER_BYTES:base + F.CHUNK_HEADER_BYTES + len(body)] = body
        return bytes(buf)

    def write(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(self.to_bytes())
        return p


def chunk_offset(data: bytes | bytearray, index: int) -> int:
    """Byte offset of chunk `index` in a raw file image (for corruption tests)."""
    h = np.frombuffer(bytes(data[:F.HEADER_BYTES]), dtype=F.HEADER_DTYPE)[0]
    return int(h["first_chunk_offset"]) + index * int(h["chunk_bytes"])


def patch_header(data: bytes | bytearray, **fields: object) -> bytes:
    """A copy of a raw file image with header fields replaced."""
    out = bytearray(data)
    h = np.frombuffer(bytes(out[:F.HEADER_BYTES]), dtype=F.HEADER_DTYPE).copy()
    for name, value in fields.items():
        h[name] = value  # type: ignore[index]
    out[:F.HEADER_BYTES] = h.tobytes()
    return bytes(out)


def simple_rank(rank: int = 0, world_size: int = 1, *, n: int = 10, op_name: str = "allreduce",
                nbytes: int = 4096, t0: int = 1000, gap: int = 10_000, dur: int = 2_000,
                **kw: object) -> RawWriter:
    """A rank with one main thread doing `n` calls of one op on MPI_COMM_WORLD."""
    w = RawWriter(rank=rank, world_size=world_size, **kw)  # type: ignore[arg-type]
    w.add_comm(0x5EED, world_size, rank, "MPI_COMM_WORLD")
    tr = w.add_track(1000 + rank, is_main=True, name="python")
    starts = t0 + np.arange(n, dtype=np.uint64) * gap
    w.add(tr, records(n, t_start=starts, t_end=starts + dur, bytes=nbytes,
                      count=nbytes // 4, seq=np.arange(n), op=op(op_name),
                      dtype=dtype("MPI_FLOAT"), redop=redop("sum"), dtype_size=4))
    return w


def agg_entries(n: int, **fields: object) -> np.ndarray:
    """n zeroed summary-mode aggregate entries; keyword arguments set fields."""
    e = np.zeros(n, dtype=F.AGG_ENTRY_DTYPE)
    for name, value in fields.items():
        e[name] = value  # type: ignore[index]
    return e


def agg_from_durations(op_value: int, nbytes: int, durations: list[int], *, comm: int = 0,
                       track: int = 0, t0: int = 0, dtype_value: int = 14,
                       redop_value: int = 1) -> np.ndarray:
    """One aggregate entry summarizing calls of the given durations (ticks)."""
    e = agg_entries(1, bytes=nbytes, calls=len(durations), sum_ticks=sum(durations),
                    min_ticks=min(durations), max_ticks=max(durations), first_ticks=t0,
                    comm=comm, track=track, op=op_value, dtype=dtype_value, redop=redop_value)
    for d in durations:
        e["hist"][0, F.agg_bucket(d)] += 1
    return e


def agg_bytes(entries: np.ndarray, *, rank: int = 0, overflow: int = 0,
              n_entries: int | None = None, version: int = F.FORMAT_VERSION) -> bytes:
    """An rank-R.agg file image."""
    h = np.zeros(1, dtype=F.AGG_HEADER_DTYPE)
    h["magic"] = F.AGG_MAGIC
    h["version"] = version
    h["entry_bytes"] = F.AGG_ENTRY_BYTES
    h["n_entries"] = len(entries) if n_entries is None else n_entries
    h["rank"] = rank
    h["buckets"] = F.AGG_BUCKETS
    h["overflow_calls"] = overflow
    return h.tobytes() + entries.tobytes()
