"""Read a raw file (hooks/hvprof_format.h) that is still being written, a
piece at a time: each `RawTail.poll()` returns only the records published
since the previous one.

The rules are the format's own (profiler.formats.raw reads a whole file by
them):

* a chunk's records are written before its header's nrec, so the first nrec
  slots of a chunk whose magic is HVPROF_CHUNK_MAGIC are complete; a slot
  past nrec, or past the end of the file, is not read yet;
* a chunk whose magic is 0 was allocated but not written: it is looked at
  again at the next poll; a chunk with any other magic is skipped for good;
* a chunk is finished once nrec equals its capacity: it is never read again.

Memory is bounded by the chunks still open (at most one per writing thread,
plus chunks allocated and not yet written), never by the records read.  The
reader opens the file read-only and reads it with pread: it takes no lock and
writes nothing, so the job records exactly what it would without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from profiler.errors import CorruptError, NotFoundError, TruncatedError
from profiler.formats import record as F
from profiler.formats.raw import (
    _MAX_CHUNK_BYTES,
    INFLIGHT_DTYPE,
    _check_header,
    header_to_dict,
    open_regular,
)

__all__ = ["RawTail", "TailRead", "inflight_entries"]


@dataclass
class TailRead:
    """What one poll found: the live header, the tables, the new records."""

    header: dict[str, Any]
    comms: np.ndarray  # COMM_ENTRY_DTYPE, the n_comms used entries
    tracks: np.ndarray  # TRACK_ENTRY_DTYPE
    records: np.ndarray  # RECORD_DTYPE, only those published since the last poll
    inflight: np.ndarray  # INFLIGHT_DTYPE, entries in progress now
    file_size: int = 0
    problems: list[str] = field(default_factory=list)


def inflight_entries(head: bytes, header: dict[str, Any]) -> np.ndarray:
    """The flight recorder's entries in progress (index = track) from the header bytes."""
    off, cap = int(header.get("inflight_offset") or 0), int(header.get("inflight_capacity") or 0)
    if (off == 0 and cap == 0) or off != F.INFLIGHT_OFFSET or \
            off + cap * F.INFLIGHT_ENTRY_DTYPE.itemsize > F.HEADER_BYTES:
        return np.zeros(0, INFLIGHT_DTYPE)
    tab = np.frombuffer(head, dtype=F.INFLIGHT_ENTRY_DTYPE, count=cap, offset=off)
    out = np.zeros(cap, dtype=INFLIGHT_DTYPE)
    out["track"] = np.arange(cap, dtype=np.int32)
    for n in ("state", "op", "comm", "t_start", "peer", "tag"):
        out[n] = tab[n]
    return out[out["state"] != 0]


class RawTail:
    """Incremental reader of one raw file (see the module's rules)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._next = 0  # chunks below this index are finished or in _open
        self._open: dict[int, int] = {}  # chunk index -> records already returned
        self._bad: set[int] = set()  # chunks with a bad magic, reported once
        self._layout: tuple[int, int] | None = None  # (first_chunk_offset, chunk_bytes)
        self._tables: tuple[int, int] = (-1, -1)
        self._comms = np.zeros(0, F.COMM_ENTRY_DTYPE)
        self._tracks = np.zeros(0, F.TRACK_ENTRY_DTYPE)
        self.records_read = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RawTail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def open_chunks(self) -> int:
        """Chunks not finished yet (what the reader keeps between polls)."""
        return len(self._open)

    def _pread(self, n: int, offset: int) -> bytes:
        assert self._fd is not None
        try:
            return os.pread(self._fd, n, offset)
        except OSError as exc:
            raise NotFoundError(self.path, f"cannot read: {exc.strerror or exc}") from None

    def poll(self) -> TailRead:
        """The header now and the records published since the previous poll."""
        if self._fd is None:
            f = open_regular(self.path, "a raw file")
            self._fd = os.dup(f.fileno())
            f.close()
        size = os.fstat(self._fd).st_size
        head = self._pread(F.HEADER_BYTES, 0)
        header = header_to_dict(_check_header(self.path, head, len(head)))
        problems: list[str] = []
        first, chunk_bytes = int(header["first_chunk_offset"]), int(header["chunk_bytes"])
        if (chunk_bytes < F.CHUNK_HEADER_BYTES + F.RECORD_BYTES
                or chunk_bytes % F.RECORD_BYTES or chunk_bytes > _MAX_CHUNK_BYTES
                or first < F.HEADER_BYTES):
            raise CorruptError(self.path, f"corrupt header: chunk size {chunk_bytes} bytes, "
                                          f"first chunk at offset {first}")
        if self._layout is None:
            self._layout = (first, chunk_bytes)
        elif self._layout != (first, chunk_bytes):
            raise CorruptError(self.path, "the file's chunk layout changed while it was read "
                                          "(a new file under the same name?)")
        self._read_tables(header, size)
        cap = (chunk_bytes - F.CHUNK_HEADER_BYTES) // F.RECORD_BYTES
        n_claimed = int(header["n_chunks"])
        for index in range(self._next, max(self._next, n_claimed)):
            self._open[index] = 0
        self._next = max(self._next, n_claimed)
        pieces: list[np.ndarray] = []
        for index in sorted(self._open):
            base = first + index * chunk_bytes
            if base + F.CHUNK_HEADER_BYTES > size:
                continue  # its header is not in the file yet
            ch = np.frombuffer(self._pread(F.CHUNK_HEADER_BYTES, base),
                               dtype=F.CHUNK_HEADER_DTYPE, count=1)[0]
            magic = int(ch["magic"])
            if magic == 0:
                continue  # allocated, not written yet
            if magic != F.CHUNK_MAGIC:
                if index not in self._bad:
                    self._bad.add(index)
                    problems.append(f"chunk {index} has a bad magic: skipped")
                del self._open[index]
                continue
            seen = self._open[index]
            nrec = min(int(ch["nrec"]), cap)
            avail = max(0, (size - base - F.CHUNK_HEADER_BYTES) // F.RECORD_BYTES)
            upto = min(nrec, avail)
            if upto > seen:
                data = self._pread((upto - seen) * F.RECORD_BYTES,
                                   base + F.CHUNK_HEADER_BYTES + seen * F.RECORD_BYTES)
                got = len(data) // F.RECORD_BYTES
                if got:
                    pieces.append(np.frombuffer(data[:got * F.RECORD_BYTES],
                                                dtype=F.RECORD_DTYPE).copy())
                    seen += got
                self._open[index] = seen
            if seen >= cap:
                del self._open[index]
        records = np.concatenate(pieces) if pieces else np.zeros(0, F.RECORD_DTYPE)
        self.records_read += len(records)
        return TailRead(header=header, comms=self._comms, tracks=self._tracks, records=records,
                        inflight=inflight_entries(head, header), file_size=size,
                        problems=problems)

    def _read_tables(self, header: dict[str, Any], size: int) -> None:
        """The communicator and track tables, read again only when they grew."""
        used = (min(int(header["n_comms"]), int(header["comm_table_capacity"])),
                min(int(header["n_tracks"]), int(header["track_table_capacity"])))
        if used == self._tables and bool(np.all(self._comms["valid"] == 1)) and \
                bool(np.all(self._tracks["valid"] == 1)):
            return  # an entry is final once valid
        out = []
        for (off_key, n, dt) in (("comm_table_offset", used[0], F.COMM_ENTRY_DTYPE),
                                 ("track_table_offset", used[1], F.TRACK_ENTRY_DTYPE)):
            off = int(header[off_key])
            if off < F.HEADER_BYTES or off + n * dt.itemsize > size:
                raise TruncatedError(self.path, f"table at [{off}, {off + n * dt.itemsize}) "
                                                f"lies outside the file ({size} bytes)")
            out.append(np.frombuffer(self._pread(n * dt.itemsize, off), dtype=dt,
                                     count=n).copy())
        self._comms, self._tracks = out
        self._tables = used
