"""profiler.formats.raw: validation of the raw header, and taking what is valid from
damaged or still-growing files (files written by tests/rawgen.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rawgen

from profiler.errors import (
    CorruptError,
    LayoutError,
    NotATraceError,
    NotFoundError,
    ProfilerError,
    TruncatedError,
    VersionError,
)
from profiler.formats import record as F
from profiler.formats.raw import read_header, read_raw, writer_state


def two_threads(chunk_bytes: int = 4096, n_main: int = 150, n_other: int = 70) -> rawgen.RawWriter:
    w = rawgen.RawWriter(rank=3, world_size=4, chunk_bytes=chunk_bytes)
    w.add_comm(0x1111, 4, 3, "MPI_COMM_WORLD")
    w.add_comm(0x2222, 2, 1, "")
    main = w.add_track(500, is_main=True)
    other = w.add_track(501, name="bg", caller="mpi_lib.cpython-311.so")
    w.add(main, rawgen.records(n_main, t_start=np.arange(n_main) * 100, seq=np.arange(n_main),
                               op=rawgen.op("allreduce"), bytes=8, comm=0))
    w.add(other, rawgen.records(n_other, t_start=np.arange(n_other) * 100 + 50,
                                seq=np.arange(n_other), op=rawgen.op("bcast"), bytes=16,
                                comm=1, root=0))
    return w


def test_reads_every_record_across_chunks(tmp_path: Path) -> None:
    w = two_threads()
    assert w.capacity == 63
    p = w.write(tmp_path / "r.hvprof")
    raw = read_raw(p)
    assert raw.problems == []
    assert raw.rank == 3 and raw.header["world_size"] == 4
    assert raw.header["n_chunks"] == 3 + 2  # ceil(150/63) + ceil(70/63)
    assert len(raw.records) == 220
    main = raw.records[raw.records["track"] == 0]
    other = raw.records[raw.records["track"] == 1]
    assert (main["seq"] == np.arange(150)).all()  # per-track call order kept
    assert (other["seq"] == np.arange(70)).all()
    assert (other["root"] == 0).all() and (main["root"] == -1).all()
    assert len(raw.comms) == 2 and len(raw.tracks) == 2
    assert raw.tracks[1]["caller"].startswith(b"mpi_lib")
    assert raw.complete
    assert raw.header["hostname"] == "testhost"
    assert raw.header["state_names"] == ["open", "mpi_init", "finalized", "closed"]


def test_header_only_read(tmp_path: Path) -> None:
    p = two_threads().write(tmp_path / "r.hvprof")
    h = read_header(p)
    assert h["rank"] == 3 and h["file_size"] == p.stat().st_size
    assert "reserved" not in h


def test_nrec_beyond_capacity_is_capped(tmp_path: Path) -> None:
    w = two_threads()
    data = bytearray(w.to_bytes())
    off = rawgen.chunk_offset(data, 0)
    data[off + 8:off + 16] = (10_000).to_bytes(8, "little")
    p = tmp_path / "r.hvprof"
    p.write_bytes(bytes(data))
    raw = read_raw(p)
    assert len(raw.records) == 220  # chunk 0 was full (63): capping loses nothing
    assert any("capacity 63" in s for s in raw.problems)


def test_bad_chunk_magic_skips_that_chunk(tmp_path: Path) -> None:
    data = bytearray(two_threads().to_bytes())
    off = rawgen.chunk_offset(data, 1)  # chunk 1: the first 63 bcast records
    data[off:off + 4] = b"XXXX"
    p = tmp_path / "r.hvprof"
    p.write_bytes(bytes(data))
    raw = read_raw(p)
    assert len(raw.records) == 220 - 63
    assert any("bad magic" in s for s in raw.problems)


def test_truncated_inside_a_chunk_keeps_complete_slots(tmp_path: Path) -> None:
    data = two_threads().to_bytes()
    last = rawgen.chunk_offset(data, 4)  # chunk 4: main's last 24 records
    cut = last + F.CHUNK_HEADER_BYTES + 10 * F.RECORD_BYTES + 17
    p = tmp_path / "r.hvprof"
    p.write_bytes(data[:cut])
    raw = read_raw(p)
    assert len(raw.records) == 220 - 24 + 10
    assert any("ends inside chunk 4" in s and "14 of its 24" in s for s in raw.problems)


def test_chunk_counted_but_absent(tmp_path: Path) -> None:
    data = two_threads().to_bytes()
    cut = rawgen.chunk_offset(data, 4)
    p = tmp_path / "r.hvprof"
    p.write_bytes(data[:cut])
    raw = read_raw(p)
    assert len(raw.records) == 220 - 24
    assert any("not in the file" in s for s in raw.problems)


def test_chunk_allocated_but_not_yet_written(tmp_path: Path) -> None:
    """A writer caught between taking a chunk and writing its header: zero chunk."""
    w = two_threads()
    data = bytearray(w.to_bytes())
    data += bytes(w.chunk_bytes)
    data = bytearray(rawgen.patch_header(data, n_chunks=6))
    p = tmp_path / "r.hvprof"
    p.write_bytes(bytes(data))
    raw = read_raw(p)
    assert len(raw.records) == 220 and raw.problems == []


def test_dropped_records_reported(tmp_path: Path) -> None:
    w = two_threads()
    w.dropped = 7
    raw = read_raw(w.write(tmp_path / "r.hvprof"))
    assert any("7 record(s) dropped" in s for s in raw.problems)
    assert "truncated" in raw.header["state_names"]


def test_no_records(tmp_path: Path) -> None:
    w = rawgen.RawWriter()
    w.add_comm(1, 1, 0, "MPI_COMM_WORLD")
    raw = read_raw(w.write(tmp_path / "r.hvprof"))
    assert len(raw.records) == 0 and raw.records.dtype == F.RECORD_DTYPE


@pytest.mark.parametrize(
    "mutate, error, text",
    [
        (lambda d: b"", NotATraceError, "empty file"),
        (lambda d: b"PK\x03\x04" + d[4:], NotATraceError, "bad magic"),
        (lambda d: b"{\"traceEvents\": []}", NotATraceError, "bad magic"),
        (lambda d: d[:10], TruncatedError, "truncated"),
        (lambda d: d[:2000], TruncatedError, "truncated"),
        (lambda d: rawgen.patch_header(d, version=2), VersionError, "version 2 is newer"),
        (lambda d: rawgen.patch_header(d, version=0), VersionError, "older"),
        (lambda d: rawgen.patch_header(d, record_bytes=48), LayoutError, "record 48 B"),
        (lambda d: rawgen.patch_header(d, header_bytes=8192), LayoutError, "header 8192 B"),
        (lambda d: rawgen.patch_header(d, chunk_bytes=100), CorruptError, "chunk size"),
        (lambda d: rawgen.patch_header(d, comm_table_offset=1 << 30), TruncatedError,
         "communicator table"),
    ],
)
def test_refused(tmp_path: Path, mutate, error: type[ProfilerError], text: str) -> None:
    p = tmp_path / "r.hvprof"
    p.write_bytes(mutate(two_threads().to_bytes()))
    with pytest.raises(error) as info:
        read_raw(p)
    assert text in str(info.value)
    assert str(p) in str(info.value) and "\n" not in str(info.value)
    if error in (NotATraceError, VersionError, LayoutError):
        with pytest.raises(error):  # the 4 KiB header-only reader refuses the same
            read_header(p)


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        read_raw(tmp_path / "nope.hvprof")
    with pytest.raises(NotATraceError):
        read_raw(tmp_path)


def test_fuzz_never_crashes(tmp_path: Path) -> None:
    """Random byte damage anywhere: a typed error or a (partial) read, nothing else."""
    base = two_threads().to_bytes()
    rng = random.Random(1234)
    p = tmp_path / "f.hvprof"
    outcomes = {"read": 0, "refused": 0}
    for _ in range(300):
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            region = rng.choice([(0, 200), (0, len(data)), (rawgen.chunk_offset(base, 0),
                                                            rawgen.chunk_offset(base, 0) + 64)])
            i = rng.randrange(*region)
            data[i] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        p.write_bytes(bytes(data))
        try:
            raw = read_raw(p)
        except ProfilerError:
            outcomes["refused"] += 1
        else:
            outcomes["read"] += 1
            assert len(raw.records) <= 220 + 5 * 63
    assert outcomes["read"] > 50 and outcomes["refused"] > 10


def test_live_and_dead_writers(tmp_path: Path) -> None:
    import socket

    w = two_threads()
    w.state = F.STATE_OPEN | F.STATE_MPI_INIT
    w.hostname = socket.gethostname()
    w.pid = os.getpid()
    h = read_header(w.write(tmp_path / "live.hvprof"))
    assert writer_state(h) == "running"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    w.pid = dead.pid
    h = read_header(w.write(tmp_path / "dead.hvprof"))
    assert writer_state(h) == "dead"
    assert not read_raw(tmp_path / "dead.hvprof").complete
    w.hostname = "some-other-host"
    assert writer_state(read_header(w.write(tmp_path / "far.hvprof"))) == "unknown"
    w.state |= F.STATE_CLOSED
    assert writer_state(read_header(w.write(tmp_path / "done.hvprof"))) == "closed"


def test_growing_file_snapshot(tmp_path: Path) -> None:
    """A file read while its writer appends: each read is a consistent prefix."""
    w = rawgen.RawWriter(chunk_bytes=4096, state=F.STATE_OPEN | F.STATE_MPI_INIT)
    w.add_comm(1, 1, 0, "MPI_COMM_WORLD")
    t = w.add_track(1, is_main=True)
    w.add(t, rawgen.records(100, seq=np.arange(100), op=1))
    full = w.to_bytes()
    off = rawgen.chunk_offset(full, 1)
    # the writer has published 20 of chunk 1's slots so far (nrec = 20)
    data = bytearray(full)
    data[off + 8:off + 16] = (20).to_bytes(8, "little")
    p = tmp_path / "g.hvprof"
    p.write_bytes(bytes(data))
    raw = read_raw(p)
    assert (raw.records["seq"] == np.arange(83)).all()
    assert not raw.complete


def test_large_file(tmp_path: Path) -> None:
    n = 200_000
    w = rawgen.RawWriter(chunk_bytes=1 << 20)
    w.add_comm(1, 2, 0, "MPI_COMM_WORLD")
    t = w.add_track(1, is_main=True)
    w.add(t, rawgen.records(n, seq=np.arange(n), t_start=np.arange(n), op=1))
    raw = read_raw(w.write(tmp_path / "big.hvprof"))
    assert len(raw.records) == n and (raw.records["seq"] == np.arange(n)).all()


def test_aggregate_file(tmp_path: Path) -> None:
    from profiler.formats.raw import read_agg
    from profiler.layout import agg_path_for

    assert agg_path_for(tmp_path / "raw" / "rank-00003.hvprof").name == "rank-00003.agg"
    e = np.concatenate([rawgen.agg_from_durations(1, 3000, [100, 200, 300]),
                        rawgen.agg_from_durations(4, 64, [50] * 7)])
    p = tmp_path / "rank-00000.agg"
    p.write_bytes(rawgen.agg_bytes(e, overflow=2))
    agg = read_agg(p)
    assert agg.entries["calls"].tolist() == [3, 7]
    assert agg.entries["hist"].sum(axis=1).tolist() == [3, 7]
    assert any("2 call(s) not aggregated" in s for s in agg.problems)
    p.write_bytes(rawgen.agg_bytes(e)[:-10])  # cut inside the second entry
    agg = read_agg(p)
    assert len(agg.entries) == 1 and any("1 of 2" in s for s in agg.problems)
    for content, error in [(b"", NotATraceError), (b"HVPROF\0\0" + bytes(100), NotATraceError),
                           (rawgen.agg_bytes(e)[:30], TruncatedError),
                           (rawgen.agg_bytes(e, version=3), VersionError)]:
        p.write_bytes(content)
        with pytest.raises(error):
            read_agg(p)
