"""Control vs data classification (profiler.horovod.classify).

Unit tests build one rank's frame the way Horovod 0.28.1 issues its calls
(read from horovod/common/mpi/mpi_controller.cc, response_cache.cc,
ops/mpi_operations.cc); the end-to-end tests run real Horovod under mpirun
with the profiler on and check the classified records.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from profiler.horovod.classify import classify, horovod_comms, horovod_tracks

HVD_COMM = 7001
WORLD = 1
MAIN, BG = 0, 1


def row(op: str, *, dtype: str = "MPI_FLOAT", redop: str = "none", count: int = 1,
        root: int = -1, track: int = BG, thread_kind: str | None = None,
        comm: int = HVD_COMM, backend: str = "mpi", dtype_size: int = 4) -> dict[str, Any]:
    if thread_kind is None:
        thread_kind = "horovod" if track == BG else "main"
    return {
        "rank": 0, "backend": backend, "op": op, "dtype": dtype, "redop": redop,
        "count": count, "bytes": count * dtype_size, "dtype_size": dtype_size, "root": root,
        "track": track, "thread_kind": thread_kind, "comm": comm, "in_place": False,
    }


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for c in ("backend", "op", "dtype", "redop", "thread_kind"):
        df[c] = df[c].astype("category")
    return df


def bitvector(redop: str = "band", count: int = 1) -> dict[str, Any]:
    return row("allreduce", dtype="MPI_LONG_LONG_INT", redop=redop, count=count, dtype_size=8)


def negotiation(rank_is_coordinator: bool = True) -> list[dict[str, Any]]:
    """Gather(1 int) + Gatherv(bytes) + Bcast(1 int) + Bcast(bytes), root 0."""
    return [
        row("gather", dtype="MPI_INT", count=1, root=0),
        row("gatherv", dtype="MPI_BYTE", count=0 if rank_is_coordinator else 57, root=0,
            dtype_size=1),
        row("bcast", dtype="MPI_INT", count=1, root=0),
        row("bcast", dtype="MPI_BYTE", count=211, root=0, dtype_size=1),
    ]


def horovod_job_rows() -> tuple[list[dict[str, Any]], list[str]]:
    """A short Horovod job on one rank with the expected kind of every row."""
    rows: list[dict[str, Any]] = []
    kinds: list[str] = []

    def add(r: dict[str, Any], k: str) -> None:
        rows.append(r)
        kinds.append(k)

    add(row("init", dtype="unknown", count=0, comm=WORLD), "control")
    # DoInitialization: Allgather(IN_PLACE, local comm) and Allgather(1 int).
    add(row("allgather", dtype="MPI_INT", count=1, comm=HVD_COMM + 1), "control")
    add(row("allgather", dtype="MPI_INT", count=1), "control")
    # Idle cycles.
    for _ in range(3):
        add(bitvector(), "control")
    # Parameter broadcast: negotiation, then one typed MPI_Bcast per tensor.
    add(bitvector(), "control")
    for r in negotiation():
        add(r, "control")
    for count, dt in ((128, "MPI_FLOAT"), (16, "MPI_FLOAT"), (1, "MPI_INT64_T"),
                      (10, "MPI_UINT8_T"), (3, "MPI_INT32_T")):
        add(row("bcast", dtype=dt, count=count, root=0), "data")
    # A step: cache hit -> bit vector only; one fused float allreduce in place.
    add(bitvector(), "control")
    add(row("allreduce", dtype="MPI_FLOAT", redop="sum", count=212), "data")
    # Invalid cache bits: a BOR round.
    add(bitvector("bor"), "control")
    # float16 gradients: derived type + user op.
    add(row("allreduce", dtype="derived", redop="user", count=64, dtype_size=2), "data")
    add(row("allreduce", dtype="MPI_DOUBLE", redop="sum", count=8, dtype_size=8), "data")
    add(row("allreduce", dtype="MPI_INT64_T", redop="max", count=2, dtype_size=8), "data")
    # allgather / alltoall / reducescatter data, alltoall splits control.
    add(row("allgatherv", dtype="MPI_FLOAT", count=32), "data")
    add(row("alltoall", dtype="MPI_INT", count=1), "control")
    add(row("alltoallv", dtype="MPI_FLOAT", count=32), "data")
    add(row("reduce_scatter", dtype="MPI_FLOAT", redop="sum", count=32), "data")
    # NCCL id broadcast (128 bytes), hvd.barrier().
    add(row("bcast", dtype="MPI_BYTE", count=128, root=0, dtype_size=1), "control")
    add(row("barrier", dtype="unknown", count=0), "control")
    # The application's own calls on the main thread (mpi4py) stay data.
    add(row("allreduce", dtype="MPI_LONG_LONG_INT", redop="sum", count=1, track=MAIN,
            comm=WORLD, dtype_size=8), "data")
    add(row("bcast", dtype="MPI_BYTE", count=100, root=0, track=MAIN, comm=WORLD,
            dtype_size=1), "data")
    add(row("barrier", dtype="unknown", count=0, track=MAIN, comm=WORLD), "data")
    add(row("step", dtype="unknown", count=64, track=MAIN, backend="app", comm=0), "app")
    add(row("mark", dtype="unknown", count=0, track=MAIN, backend="app", comm=0), "app")
    add(row("finalize", dtype="unknown", count=0, track=MAIN, comm=WORLD), "control")
    return rows, kinds


def test_horovod_patterns_row_by_row() -> None:
    rows, expected = horovod_job_rows()
    df = frame(rows)
    got = classify(df)
    assert isinstance(got.dtype, pd.CategoricalDtype)
    assert list(got.cat.categories) == ["data", "control", "app"]
    assert got.index.equals(df.index)
    mismatches = [
        (i, r["op"], r["dtype"], r["redop"], e, g)
        for i, (r, e, g) in enumerate(zip(rows, expected, got.astype(str)))
        if e != g
    ]
    assert mismatches == []
    counts = got.value_counts()
    assert counts["control"] == expected.count("control") == 17
    assert counts["data"] == expected.count("data") == 15
    assert counts["app"] == 2


def test_signature_identifies_horovod_thread_without_thread_kind() -> None:
    rows, expected = horovod_job_rows()
    df = frame(rows).drop(columns=["thread_kind"])
    assert horovod_tracks(df) == {BG}
    assert list(classify(df).astype(str)) == expected


def test_signature_with_cache_off_uses_negotiation_gather() -> None:
    # HOROVOD_CACHE_CAPACITY=0: no bit vector at all, every cycle negotiates.
    rows: list[dict[str, Any]] = []
    for _ in range(5):
        rows += negotiation(rank_is_coordinator=False)
    rows.append(row("allreduce", dtype="MPI_FLOAT", redop="sum", count=100))
    df = frame(rows)
    df["thread_kind"] = pd.Categorical(["other"] * len(df))  # caller unresolved
    kinds = classify(df).astype(str).tolist()
    assert kinds == ["control"] * 20 + ["data"]


def test_horovod_comms_are_the_bitvector_comm() -> None:
    rows, _ = horovod_job_rows()
    assert horovod_comms(frame(rows)) == {HVD_COMM}


def test_main_thread_is_never_horovod() -> None:
    # A pure mpi4py job whose main thread happens to issue Horovod-like calls.
    df = frame([
        row("init", dtype="unknown", count=0, track=MAIN, comm=WORLD),
        row("allreduce", dtype="MPI_LONG_LONG_INT", redop="band", count=1, track=MAIN,
            comm=WORLD, dtype_size=8),
        row("bcast", dtype="MPI_INT", count=1, root=0, track=MAIN),
        row("gather", dtype="MPI_INT", count=1, root=0, track=MAIN),
        row("nccl_allreduce", dtype="ncclFloat32", redop="sum", count=10, track=MAIN,
            backend="nccl"),
        row("finalize", dtype="unknown", count=0, track=MAIN, comm=WORLD),
    ])
    assert horovod_tracks(df) == set()
    assert classify(df).astype(str).tolist() == [
        "control", "data", "data", "data", "data", "control"]
    # Without thread attribution at all, the signature decides.
    bare = df.drop(columns=["thread_kind"])
    assert horovod_tracks(bare) == {MAIN}
    assert classify(bare).astype(str).tolist() == [
        "control", "control", "control", "control", "data", "control"]


def test_empty_and_minimal_frames() -> None:
    empty = frame([row("allreduce")]).iloc[:0]
    out = classify(empty)
    assert len(out) == 0 and list(out.cat.categories) == ["data", "control", "app"]
    minimal = pd.DataFrame({"op": ["allreduce", "step"], "backend": ["mpi", "app"]})
    assert classify(minimal).astype(str).tolist() == ["data", "app"]


def test_nan_and_unknown_values_do_not_crash() -> None:
    df = frame([row("allreduce"), row("bcast")])
    df["dtype"] = pd.Categorical([None, "MPI_BYTE"])
    df["redop"] = pd.Categorical([None, None])
    assert classify(df).astype(str).tolist() == ["data", "control"]


@pytest.mark.parametrize("n", [1, 2])
def test_index_is_preserved(n: int) -> None:
    rows, _ = horovod_job_rows()
    df = frame(rows[:n])
    df.index = pd.Index(range(100, 100 + n))
    assert list(classify(df).index) == list(df.index)
