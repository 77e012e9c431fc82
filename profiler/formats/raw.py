"""Read one raw file (hooks/hvprof_format.h) into numpy arrays.

`read_raw(path)` validates the file header (magic, version, header and record
size: mismatches are refused with a typed ProfilerError), then takes every
record that is valid and reports, in `RawFile.problems`, what was not:
chunks whose nrec exceeds their capacity (capped), chunks with a bad magic
(skipped), a file that ends inside a chunk (a killed writer, a copy cut short:
the complete slots are kept), chunks counted in the header but not yet on disk.
A file still being written by a live process is read as a snapshot.

Records are gathered with strided numpy views over a read-only mmap: one
boolean mask selects the published slots of every chunk at once.
"""

from __future__ import annotations

import mmap
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson

from profiler.errors import (
    CorruptError,
    LayoutError,
    NotATraceError,
    NotFoundError,
    TruncatedError,
    VersionError,
    printable,
)
from profiler.formats import record as F
from profiler.layout import sidecar_path

_MAX_CHUNK_BYTES = 1 << 34
_MAX_CLOCK_NS = 1 << 62  # about 146 years
# 2048 slots x 1024 threads x 704 B: the most the library ever writes, rounded up
MAX_AGG_BYTES = 2 << 30


#: A thread's call in progress, as read: its track, then the entry's fields.
INFLIGHT_DTYPE = np.dtype([("track", "<i4"), ("state", "<u4"), ("op", "<u2"), ("comm", "<u8"),
                           ("t_start", "<u8"), ("peer", "<i4"), ("tag", "<i4")])


@dataclass
class RawFile:
    """One rank's raw file, read."""

    path: Path
    header: dict[str, Any]
    comms: np.ndarray  # COMM_ENTRY_DTYPE, the n_comms used entries
    tracks: np.ndarray  # TRACK_ENTRY_DTYPE, the n_tracks used entries
    records: np.ndarray  # RECORD_DTYPE, chunk order (per track: call order)
    problems: list[str] = field(default_factory=list)
    file_size: int = 0
    # INFLIGHT_ENTRY_DTYPE, the entries whose state says a call is in progress
    # (the flight recorder; empty for files written before it)
    inflight: np.ndarray = field(default_factory=lambda: np.zeros(0, INFLIGHT_DTYPE))

    @property
    def rank(self) -> int:
        return int(self.header["rank"])

    @property
    def state(self) -> int:
        return int(self.header["state"])

    @property
    def complete(self) -> bool:
        """True when the writer reached MPI_Finalize or exited cleanly."""
        return bool(self.state & (F.STATE_FINALIZED | F.STATE_CLOSED))


def c_string(value: bytes) -> str:
    """A NUL-terminated C string from a raw file, as printable text."""
    return printable(value.split(b"\0", 1)[0].decode("utf-8", "replace"))


def header_to_dict(h: np.void) -> dict[str, Any]:
    """A header record as plain Python values (strings decoded, reserved dropped)."""
    out: dict[str, Any] = {}
    names = h.dtype.names or ()
    for name in names:
        if name in ("reserved", "inflight"):
            continue
        v = h[name]
        if isinstance(v, bytes):
            out[name] = c_string(v) if name != "magic" else v.decode("latin-1")
        elif isinstance(v, np.floating):
            out[name] = float(v)
        else:
            out[name] = int(v)
    out["state_names"] = F.state_names(out["state"])
    out["clock"] = F.CLOCK_KINDS.get(out["clock_kind"], f"clock_{out['clock_kind']}")
    return out


def _check_header(path: Path, buf: bytes | mmap.mmap, size: int) -> np.void:
    if size == 0:
        raise NotATraceError(path, "empty file, not a horovod-profiler raw file")
    if size < len(F.MAGIC) or bytes(buf[: len(F.MAGIC)]) != F.MAGIC:
        raise NotATraceError(path, "not a horovod-profiler raw file (bad magic)")
    if size < 24:
        raise TruncatedError(path, f"truncated raw file: {size} bytes, header is "
                             f"{F.HEADER_BYTES}")
    version, header_bytes, record_bytes = np.frombuffer(bytes(buf[8:20]), dtype="<u4")
    if version != F.FORMAT_VERSION:
        newer = "newer than" if version > F.FORMAT_VERSION else "older than"
        raise VersionError(
            path,
            f"raw format version {int(version)} is {newer} this reader's version "
            f"{F.FORMAT_VERSION}: read it with the horovod-profiler that wrote it",
        )
    if header_bytes != F.HEADER_BYTES or record_bytes != F.RECORD_BYTES:
        raise LayoutError(
            path,
            f"layout mismatch: header {int(header_bytes)} B / record {int(record_bytes)} B, "
            f"this reader expects {F.HEADER_BYTES} B / {F.RECORD_BYTES} B",
        )
    if size < F.HEADER_BYTES:
        raise TruncatedError(path, f"truncated raw file: {size} bytes, header is "
                             f"{F.HEADER_BYTES}")
    return np.frombuffer(bytes(buf[: F.HEADER_BYTES]), dtype=F.HEADER_DTYPE)[0]


def open_regular(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """Open a regular file for reading, refusing anything else at once.

    A FIFO would block open() until a writer comes (forever); a directory, a
    device or a socket is no profile file either.  The file is opened
    non-blocking, checked with fstat, then switched back to blocking reads."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotFoundError(p, "no such file") from None
    except OSError as exc:
        raise NotFoundError(p, f"cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "a device")
            raise NotATraceError(p, f"is {kind}, not {what}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """The whole of a regular file of at most max_bytes (open_regular's checks)."""
    p = Path(path)
    with open_regular(p, what) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise NotATraceError(p, f"{size} bytes: too large for {what} (limit "
                                        f"{max_bytes} bytes)")
            # read() of n bytes allocates n first: ask for what the file holds
            data = f.read(min(size, max_bytes) + 1)
        except OSError as exc:
            raise NotFoundError(p, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise NotATraceError(p, f"too large for {what} (limit {max_bytes} bytes)")
    return data


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Only the validated header of a raw file (4 KiB read), as a dict."""
    p = Path(path)
    with open_regular(p, "a raw file") as f:
        try:
            head = f.read(F.HEADER_BYTES)
            size = os.fstat(f.fileno()).st_size
        except OSError as exc:
            raise NotFoundError(p, f"cannot read: {exc.strerror or exc}") from None
    h = header_to_dict(_check_header(p, head, len(head)))
    h["file_size"] = size
    return h


def _table(path: Path, buf: mmap.mmap, size: int, offset: int, capacity: int, used: int,
           dtype: np.dtype, what: str, problems: list[str]) -> np.ndarray:
    if used > capacity:
        problems.append(f"{what} table: {used} entries used, capacity {capacity} (capped)")
        used = capacity
    end = offset + used * dtype.itemsize
    if offset < F.HEADER_BYTES or end > size:
        raise TruncatedError(path, f"{what} table at [{offset}, {end}) lies outside the "
                             f"file ({size} bytes)")
    return np.frombuffer(buf, dtype=dtype, count=used, offset=offset).copy()


def read_raw(path: str | os.PathLike[str]) -> RawFile:
    """Read a raw file: validated header, tables and every published record."""
    p = Path(path)
    f = open_regular(p, "a raw file")
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise NotATraceError(p, "empty file, not a horovod-profiler raw file")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _read_mapped(p, buf, size)
        finally:
            buf.close()


def _read_mapped(p: Path, buf: mmap.mmap, size: int) -> RawFile:
    hv = _check_header(p, buf, size)
    header = header_to_dict(hv)
    problems: list[str] = []

    comms = _table(p, buf, size, header["comm_table_offset"], header["comm_table_capacity"],
                   header["n_comms"], F.COMM_ENTRY_DTYPE, "communicator", problems)
    tracks = _table(p, buf, size, header["track_table_offset"],
                    header["track_table_capacity"], header["n_tracks"],
                    F.TRACK_ENTRY_DTYPE, "track", problems)

    chunk_bytes = header["chunk_bytes"]
    first = header["first_chunk_offset"]
    if (chunk_bytes < F.CHUNK_HEADER_BYTES + F.RECORD_BYTES or chunk_bytes % F.RECORD_BYTES
            or chunk_bytes > _MAX_CHUNK_BYTES):
        raise CorruptError(p, f"corrupt header: chunk size {chunk_bytes} bytes")
    if first < F.HEADER_BYTES:
        raise CorruptError(p, f"corrupt header: first chunk at offset {first}")
    for name in ("offset_ns", "job_t0_ns", "cal0_mono_ns", "cal1_mono_ns"):
        # clock values (ns): far from the int64 limits, or times cannot be converted
        if abs(int(header[name])) > _MAX_CLOCK_NS:
            raise CorruptError(p, f"corrupt header: {name} = {header[name]}")
    cap = (chunk_bytes - F.CHUNK_HEADER_BYTES) // F.RECORD_BYTES
    n_claimed = header["n_chunks"]
    on_disk = max(0, (size - first) // chunk_bytes)  # chunks wholly in the file
    partial_tail = size > first + on_disk * chunk_bytes and (
        size - first - on_disk * chunk_bytes >= F.CHUNK_HEADER_BYTES)
    n_full = min(n_claimed, on_disk)
    if n_claimed > on_disk + (1 if partial_tail else 0):
        missing = n_claimed - on_disk - (1 if partial_tail else 0)
        problems.append(f"{missing} chunk(s) counted in the header are not in the file "
                        f"(file ends at {size} bytes)")

    pieces: list[np.ndarray] = []
    if n_full:
        ch = np.ndarray((n_full,), dtype=F.CHUNK_HEADER_DTYPE, buffer=buf, offset=first,
                        strides=(chunk_bytes,))
        magic = ch["magic"]
        nrec = ch["nrec"].astype(np.int64)
        good = magic == F.CHUNK_MAGIC
        empty = magic == 0
        bad = ~good & ~empty
        if bad.any():
            idx = np.flatnonzero(bad)
            problems.append(f"{len(idx)} chunk(s) with a bad magic skipped (first: chunk "
                            f"{int(idx[0])})")
        if empty.any():
            # allocated, header not yet written: a writer caught mid-refill
            if int((nrec[empty] != 0).sum()):
                problems.append("chunk(s) without magic but with records skipped")
        over = good & ((nrec > cap) | (nrec < 0))
        if over.any():
            idx = np.flatnonzero(over)
            problems.append(f"{len(idx)} chunk(s) claim more records than their capacity "
                            f"{cap} (capped; first: chunk {int(idx[0])}, nrec "
                            f"{int(ch['nrec'][idx[0]])})")
        n_valid = np.where(good, np.clip(nrec, 0, cap), 0)
        if n_valid.any():
            slots = np.ndarray((n_full, cap), dtype=F.RECORD_DTYPE, buffer=buf,
                               offset=first + F.CHUNK_HEADER_BYTES,
                               strides=(chunk_bytes, F.RECORD_BYTES))
            mask = np.arange(cap)[None, :] < n_valid[:, None]
            pieces.append(slots[mask])
    if partial_tail and n_claimed > on_disk:
        index = on_disk
        base = first + index * chunk_bytes
        ch1 = np.frombuffer(buf, dtype=F.CHUNK_HEADER_DTYPE, count=1, offset=base)[0]
        avail = (size - base - F.CHUNK_HEADER_BYTES) // F.RECORD_BYTES
        if int(ch1["magic"]) == F.CHUNK_MAGIC:
            nrec1 = int(ch1["nrec"])
            take = max(0, min(nrec1, cap, avail))
            if nrec1 > take:
                problems.append(f"file ends inside chunk {index}: {nrec1 - take} of its "
                                f"{nrec1} records lost")
            if take:
                pieces.append(np.frombuffer(buf, dtype=F.RECORD_DTYPE, count=take,
                                            offset=base + F.CHUNK_HEADER_BYTES).copy())
        elif int(ch1["magic"]) != 0:
            problems.append(f"chunk {index} (cut short by the end of the file) has a bad "
                            "magic: skipped")
    elif size > first + on_disk * chunk_bytes and n_claimed > on_disk:
        problems.append(f"file ends inside the header of chunk {on_disk}")

    records = np.concatenate(pieces) if pieces else np.zeros(0, dtype=F.RECORD_DTYPE)
    if header["dropped_records"]:
        problems.append(f"{header['dropped_records']} record(s) dropped by the writer "
                        "(disk full, write error or no free buffer)")
    return RawFile(path=p, header=header, comms=comms, tracks=tracks, records=records,
                   problems=problems, file_size=size, inflight=_inflight(p, buf, header,
                                                                         problems))


def _inflight(p: Path, buf: mmap.mmap, header: dict[str, Any],
              problems: list[str]) -> np.ndarray:
    """The flight recorder's entries in progress (index = track), from the header."""
    off, cap = int(header.get("inflight_offset") or 0), int(header.get("inflight_capacity") or 0)
    if off == 0 and cap == 0:
        return np.zeros(0, INFLIGHT_DTYPE)
    if off != F.INFLIGHT_OFFSET or off + cap * F.INFLIGHT_ENTRY_DTYPE.itemsize > F.HEADER_BYTES:
        problems.append(f"corrupt in-flight table (offset {off}, {cap} entries): ignored")
        return np.zeros(0, INFLIGHT_DTYPE)
    tab = np.frombuffer(buf, dtype=F.INFLIGHT_ENTRY_DTYPE, count=cap, offset=off).copy()
    out = np.zeros(cap, dtype=INFLIGHT_DTYPE)
    out["track"] = np.arange(cap, dtype=np.int32)
    for n in ("state", "op", "comm", "t_start", "peer", "tag"):
        out[n] = tab[n]
    return out[out["state"] != 0]


def writer_state(header: dict[str, Any]) -> str:
    """What became of the process that wrote this header.

    "closed" (exited cleanly), "finalized" (reached MPI_Finalize), "running"
    (same host, its pid is alive), "dead" (same host, pid gone without
    finishing), "unknown" (another host: cannot tell).
    """
    state = int(header.get("state", 0))
    if state & F.STATE_CLOSED:
        return "closed"
    alive = _pid_alive(header)
    if state & F.STATE_FINALIZED:
        return "dead" if alive is False else "finalized"
    if alive is None:
        return "unknown"
    return "running" if alive else "dead"


def _pid_alive(header: dict[str, Any]) -> bool | None:
    host = str(header.get("hostname", ""))
    if host and host != socket.gethostname():
        return None
    pid = int(header.get("pid", 0))
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed child not yet reaped) counts as dead.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
        if fields and fields[0] == b"Z":
            return False
    except OSError:
        pass
    return True


# ---------------------------------------------------------------------------
# Summary mode: raw/rank-R.agg (a snapshot rewritten whole by the library)
# ---------------------------------------------------------------------------
@dataclass
class AggFile:
    """One rank's summary-mode aggregates, read."""

    path: Path
    header: dict[str, Any]
    entries: np.ndarray  # AGG_ENTRY_DTYPE
    problems: list[str] = field(default_factory=list)


def read_agg(path: str | os.PathLike[str]) -> AggFile:
    """Read a summary-mode aggregate file (validated like a raw file)."""
    p = Path(path)
    data = read_regular(p, "an aggregate file", MAX_AGG_BYTES)
    if not data:
        raise NotATraceError(p, "empty file, not a horovod-profiler aggregate file")
    if data[: len(F.AGG_MAGIC)] != F.AGG_MAGIC:
        raise NotATraceError(p, "not a horovod-profiler aggregate file (bad magic)")
    if len(data) < F.AGG_HEADER_BYTES:
        raise TruncatedError(p, f"truncated aggregate file: {len(data)} bytes")
    h = np.frombuffer(data, dtype=F.AGG_HEADER_DTYPE, count=1)[0]
    version = int(h["version"])
    if version != F.FORMAT_VERSION:
        newer = "newer than" if version > F.FORMAT_VERSION else "older than"
        raise VersionError(p, f"raw format version {version} is {newer} this reader's "
                              f"version {F.FORMAT_VERSION}")
    if int(h["entry_bytes"]) != F.AGG_ENTRY_BYTES or int(h["buckets"]) != F.AGG_BUCKETS:
        raise LayoutError(p, f"layout mismatch: entry {int(h['entry_bytes'])} B / "
                             f"{int(h['buckets'])} buckets, this reader expects "
                             f"{F.AGG_ENTRY_BYTES} B / {F.AGG_BUCKETS}")
    header = {"rank": int(h["rank"]), "n_entries": int(h["n_entries"]),
              "snapshot_ticks": int(h["snapshot_ticks"]),
              "overflow_calls": int(h["overflow_calls"])}
    problems: list[str] = []
    have = (len(data) - F.AGG_HEADER_BYTES) // F.AGG_ENTRY_BYTES
    n = header["n_entries"]
    if n > have:
        problems.append(f"file ends after {have} of {n} aggregate entries")
        n = have
    entries = np.frombuffer(data, dtype=F.AGG_ENTRY_DTYPE, count=n,
                            offset=F.AGG_HEADER_BYTES).copy()
    if header["overflow_calls"]:
        problems.append(f"{header['overflow_calls']} call(s) not aggregated (table full)")
    return AggFile(path=p, header=header, entries=entries, problems=problems)


def read_sidecar(raw_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The NCCL document the library wrote next to a raw file, or None."""
    path = sidecar_path(raw_path)
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def read_tensor_names(raw_path: str | os.PathLike[str]) -> list[str]:
    """The names of the tensors a rank handed to Horovod (raw/rank-R.tensors,
    written by profiler.collect.tensors: one JSON string per line, line i is
    the name of id i, the seq of its APP_TENSOR records).  [] when absent; a
    line cut short by a crash ends the list."""
    from profiler.layout import tensor_names_path

    path = tensor_names_path(raw_path)
    try:
        # a regular file only: a FIFO in its place would block the reader
        if not stat.S_ISREG(os.stat(path).st_mode):
            return []
        data = path.read_bytes()
    except OSError:
        return []
    out: list[str] = []
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            name = orjson.loads(line)
        except orjson.JSONDecodeError:
            break
        out.append(name if isinstance(name, str) else str(name))
    return out
