"""Control vs data classification of one rank's calls (the `kind` column).

Every rule below was read from Horovod 0.28.1's source (horovod/common/...)
and checked against records of real runs (tests/test_classify.py):

Horovod makes all of its MPI calls from its background thread
(operations.cc BackgroundThreadLoop).  On that thread:

control
  * the response-cache bit vector: MPI_Allreduce(MPI_IN_PLACE, ...,
    MPI_LONG_LONG_INT, MPI_BAND) every cycle, plus MPI_BOR when a rank has
    invalid cache entries (mpi_controller.cc CrossRankBitwiseAnd/Or, called
    from response_cache.cc CacheCoordinator::sync);
  * the negotiation of uncached tensors: MPI_Gather(1 x MPI_INT, root 0) +
    MPI_Gatherv(MPI_BYTE) of the request lists, then MPI_Bcast(1 x MPI_INT) +
    MPI_Bcast(MPI_BYTE) of the response list (Send/RecvReadyTensors,
    Send/RecvFinalTensors);
  * the NCCL unique-id broadcast and the oneCCL address broadcast:
    MPIController::Bcast, i.e. MPI_Bcast of MPI_BYTE (nccl_operations.cc);
  * set-up and bookkeeping: MPI_Allgather of MPI_INT (DoInitialization,
    Allgather2Ints for process sets), MPI_Alltoall of MPI_INT (the splits
    exchange before an alltoall), MPI_Barrier (hvd.barrier, NCCL set-up);
  * MPI_Init / MPI_Finalize.
data
  * everything else Horovod issues: gradient MPI_Allreduce (MPI_FLOAT,
    MPI_DOUBLE, MPI_INT*_T, MPI_UINT*_T, MPI_C_BOOL, or the derived float16 type
    with a user op; MPI_IN_PLACE when fused), parameter MPI_Bcast (typed, never
    MPI_BYTE/MPI_INT: Horovod maps uint8 to MPI_UINT8_T and int32 to
    MPI_INT32_T, mpi_context.cc GetMPIDataType), MPI_Allgatherv,
    MPI_Alltoallv, MPI_Reduce_scatter, and NCCL collectives.

Horovod over Gloo (horovodrun --gloo; hooks/gloo.c): the records name what
they are, backend "gloo".  The controller's calls (gloo_bitand/bitor: the
response-cache bit vector; gloo_ready, gloo_final: the negotiation, the
gather of requests and the broadcast of responses; gloo_ctl_bcast,
gloo_barrier, gloo_splits, gloo_allgather_ints: set-up and bookkeeping;
profiler.formats.record.GLOO_CONTROL_OPS) are
"control"; the collectives of its data ops (gloo_allreduce, gloo_allgather,
gloo_broadcast, gloo_alltoall, gloo_reducescatter) are "data".

Calls from other threads (the application's mpi4py calls, torch.distributed
NCCL calls) are "data", except MPI_Init/MPI_Finalize which are "control";
profiler records (backend "app": step, mark) are "app".  MPI point-to-point
calls (send, recv, isend, irecv, sendrecv, probe, ...; profiler.formats.record
.P2P_OPS), from any thread, are "p2p": they have no per-communicator sequence
number, so nothing that matches collectives across ranks by (comm, seq) takes
them (their own matching: profiler.analysis.p2p).

Horovod's thread is the track the core marks thread_kind == "horovod" (the
library that made the thread's first call).  When a frame has no such track
(thread_kind missing, or the caller could not be resolved), a track that is
not the main thread is taken as Horovod's from its signature: it issued a
bit-vector allreduce (MPI_BAND / MPI_BOR) or the MPI_Gather(1 x MPI_INT,
root 0) that opens every uncached negotiation.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from profiler.formats.record import APP_OPS, CALL_KINDS, GLOO_CONTROL_OPS, LIFECYCLE_OPS, P2P_OPS

__all__ = ["KINDS", "classify", "horovod_tracks", "horovod_comms", "is_horovod_row"]

KINDS = list(CALL_KINDS)

#: MPI datatypes Horovod uses only for its own control messages.
CONTROL_DTYPES = frozenset({"MPI_LONG_LONG_INT", "MPI_INT", "MPI_BYTE"})
#: Reductions Horovod uses only for the response-cache bit vector.
BITVECTOR_REDOPS = frozenset({"band", "bor"})
#: MPI ops that never carry Horovod data.
CONTROL_OPS = frozenset({"gather", "gatherv", "barrier"}) | LIFECYCLE_OPS
#: Ops Horovod uses only as control when not the v-variant.
CONTROL_ONLY_ON_HOROVOD = frozenset({"allgather", "alltoall"})


def _col(df: pd.DataFrame, name: str, default: object = "") -> np.ndarray:
    """A column as an object array of str (categoricals decoded), default if missing."""
    if name not in df.columns:
        return np.full(len(df), default, dtype=object)
    return np.asarray(df[name].astype(object).where(df[name].notna(), default), dtype=object)


def _isin(values: np.ndarray, allowed: Iterable[str]) -> np.ndarray:
    return np.isin(values, np.asarray(sorted(allowed), dtype=object))


def _bitvector_mask(df: pd.DataFrame) -> np.ndarray:
    op = _col(df, "op")
    return (op == "allreduce") & _isin(_col(df, "redop"), BITVECTOR_REDOPS)


def _negotiation_gather_mask(df: pd.DataFrame) -> np.ndarray:
    op = _col(df, "op")
    dtype = _col(df, "dtype")
    root = df["root"].to_numpy() if "root" in df.columns else np.full(len(df), -1)
    return (op == "gather") & (dtype == "MPI_INT") & (root == 0)


def horovod_tracks(df: pd.DataFrame) -> set[int]:
    """Track indices of Horovod's background thread(s) in one rank's frame."""
    if len(df) == 0 or "track" not in df.columns:
        return set()
    track = df["track"].to_numpy()
    sig = _bitvector_mask(df) | _negotiation_gather_mask(df)
    if "thread_kind" in df.columns:
        tk = _col(df, "thread_kind")
        marked = set(np.unique(track[tk == "horovod"]).tolist())
        if marked:
            return {int(t) for t in marked}
        # Horovod never calls MPI from the main thread or a device stream.
        sig &= ~_isin(tk, ("main", "stream"))
    return {int(t) for t in np.unique(track[sig]).tolist()}


def horovod_comms(df: pd.DataFrame) -> set[int]:
    """Communicator ids carrying Horovod's control traffic (its process-set comm)."""
    if len(df) == 0 or "comm" not in df.columns:
        return set()
    sig = _bitvector_mask(df) | _negotiation_gather_mask(df)
    return {int(c) for c in np.unique(df["comm"].to_numpy()[sig]).tolist()}


def is_horovod_row(df: pd.DataFrame) -> np.ndarray:
    """Boolean mask: rows made by Horovod's background thread."""
    tracks = horovod_tracks(df)
    if not tracks:
        return np.zeros(len(df), dtype=bool)
    return np.isin(df["track"].to_numpy(), np.asarray(sorted(tracks)))


def classify(df: pd.DataFrame) -> pd.Series:
    """"control" / "data" / "app" per row of one rank's frame (row schema).

    Needs op, backend and, for Horovod rows, dtype, redop and track
    (thread_kind and root when present).  Missing optional columns only make
    the rules less specific; the result never depends on the timeline.
    """
    n = len(df)
    if n == 0:
        return pd.Series(pd.Categorical([], categories=KINDS), index=df.index, name="kind")
    op = _col(df, "op")
    backend = _col(df, "backend")
    dtype = _col(df, "dtype")
    redop = _col(df, "redop")
    hvd = is_horovod_row(df)

    kind = np.full(n, "data", dtype=object)
    is_app = (backend == "app") | _isin(op, APP_OPS)
    is_mpi = backend == "mpi"

    control_hvd = hvd & is_mpi & (
        _isin(op, CONTROL_OPS)
        | _isin(op, CONTROL_ONLY_ON_HOROVOD)
        | ((op == "allreduce") & (_isin(redop, BITVECTOR_REDOPS) | (dtype == "MPI_LONG_LONG_INT")))
        | ((op == "bcast") & _isin(dtype, CONTROL_DTYPES))
    )
    control_any = is_mpi & _isin(op, LIFECYCLE_OPS)
    control_gloo = (backend == "gloo") & _isin(op, GLOO_CONTROL_OPS)
    kind[control_hvd | control_any | control_gloo] = "control"
    kind[is_mpi & _isin(op, P2P_OPS)] = "p2p"
    kind[is_app] = "app"
    return pd.Series(pd.Categorical(kind, categories=KINDS), index=df.index, name="kind")
