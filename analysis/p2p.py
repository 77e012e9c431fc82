"""MPI point-to-point messages, matched across ranks.

`match_p2p(df)` pairs each send (send, isend, the send half of sendrecv) with
its receive (recv, irecv, the receive half of sendrecv) by (communicator,
sender, receiver, tag, order).  MPI's non-overtaking rule: two messages from
one sender to one receiver on one communicator that a receive could both
match arrive in the order they were sent; so the k-th send of a (comm,
sender, receiver, tag) -- in the order of its start on the sender -- is the
k-th receive of it, in the order of its start (its post) on the receiver.

Receives are keyed by what their completion status said (profiler.formats
.record.FLAG_FROM_STATUS: the actual source and tag, MPI_ANY_SOURCE and
MPI_ANY_TAG resolved); a request never completed (no_completion) matches
nothing and is reported unmatched (a receive of it with MPI_ANY_SOURCE, whose
peer is unknown, is left out).  Sends to and receives from MPI_PROC_NULL move
nothing and are left out.

Peers are recorded as ranks of the record's communicator (hvprof_format.h);
they become world ranks through the frame's own (comm, comm_rank) -> rank
pairs: every rank that made a call on a communicator says its rank there, so
a peer that recorded nothing on that communicator cannot be named (its
messages come out unmatched).  Intercommunicators (the peer is a rank of the
remote group) are not told apart from intracommunicators here.  Limits: a
wildcard receive posted before a specific one for the same source may have
matched in another order than the one assumed; several threads sending to one
peer with one tag are ordered by start time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiler.formats import record as F

from ._frame import isin, require

__all__ = ["PAIR_COLUMNS", "match_p2p", "p2p_summary"]

PAIR_COLUMNS = [
    "comm", "sender", "receiver", "tag", "n", "send_op", "recv_op", "bytes", "recv_bytes",
    "send_start_ns", "send_end_ns", "recv_start_ns", "recv_end_ns", "transfer_ns",
    "late_sender_ns", "matched",
]

_NEED = ["rank", "op", "comm", "comm_rank", "root", "tag", "bytes", "t_start_ns", "t_end_ns"]


def _world_ranks(df: pd.DataFrame) -> dict[tuple[int, int], int]:
    """(comm id, rank in comm) -> world rank, from the frame's own rows."""
    pairs = df[["comm", "comm_rank", "rank"]].drop_duplicates()
    return {(int(c), int(cr)): int(r) for c, cr, r in
            zip(pairs["comm"].to_numpy(), pairs["comm_rank"].to_numpy(),
                pairs["rank"].to_numpy()) if int(cr) >= 0}


def _side(df: pd.DataFrame, ops: frozenset[str], world: dict[tuple[int, int], int],
          send: bool) -> pd.DataFrame:
    sel = df.loc[isin(df["op"], ops)]
    sel = sel.loc[sel["root"].to_numpy() >= 0]
    done = (sel["flags"].to_numpy() & F.FLAG_NO_COMPLETION) == 0 if "flags" in sel.columns \
        else np.ones(len(sel), dtype=bool)
    comm = sel["comm"].to_numpy()
    peer = np.array([world.get((int(c), int(p)), -1)
                     for c, p in zip(comm, sel["root"].to_numpy())], dtype=np.int64)
    me = sel["rank"].to_numpy(dtype=np.int64)
    out = pd.DataFrame({
        "comm": comm.astype(np.uint64),
        "sender": me if send else peer,
        "receiver": peer if send else me,
        "tag": sel["tag"].to_numpy(dtype=np.int64),
        "op": sel["op"].astype(str).to_numpy(),
        "bytes": sel["bytes"].to_numpy(dtype=np.int64),
        "start": sel["t_start_ns"].to_numpy(dtype=np.float64),
        "end": sel["t_end_ns"].to_numpy(dtype=np.float64),
        "done": done,
    })
    out = out.loc[(out["sender"] >= 0) & (out["receiver"] >= 0)]
    out = out.sort_values(["comm", "sender", "receiver", "tag", "start"], kind="stable")
    # the order among the calls that completed; one never completed takes no
    # place in it and matches nothing (n < 0, unique)
    key = ["comm", "sender", "receiver", "tag", "done"]
    k = out.groupby(key, sort=False).cumcount().to_numpy(dtype=np.int64)
    out["n"] = np.where(out["done"].to_numpy(), k, -1 - k)
    return out.drop(columns="done").reset_index(drop=True)


def match_p2p(df: pd.DataFrame) -> pd.DataFrame:
    """One row per message (PAIR_COLUMNS): a send and its receive, or one side
    alone (matched False: the other side's op is "" and its times NaN).

    bytes: what the send sent; recv_bytes: what the receive says arrived (or
    posted).  transfer_ns: from the later of the two starts (both sides there)
    to the receive's end; late_sender_ns: how long the receive waited for a
    send not yet started (0 when the send came first)."""
    require(df, _NEED, "match_p2p")
    world = _world_ranks(df)
    s = _side(df, F.P2P_SEND_OPS, world, True)
    r = _side(df, F.P2P_RECV_OPS, world, False)
    keys = ["comm", "sender", "receiver", "tag", "n"]
    m = s.merge(r, on=keys, how="outer", suffixes=("_s", "_r"), sort=True)
    send_start = m["start_s"].to_numpy(dtype=np.float64)
    recv_start = m["start_r"].to_numpy(dtype=np.float64)
    recv_end = m["end_r"].to_numpy(dtype=np.float64)
    matched = ~(np.isnan(send_start) | np.isnan(recv_start))
    out = pd.DataFrame({
        "comm": m["comm"].to_numpy(dtype=np.uint64),
        "sender": m["sender"].to_numpy(dtype=np.int64),
        "receiver": m["receiver"].to_numpy(dtype=np.int64),
        "tag": m["tag"].to_numpy(dtype=np.int64),
        "n": m["n"].to_numpy(dtype=np.int64),
        "send_op": m["op_s"].fillna("").astype(str).to_numpy(),
        "recv_op": m["op_r"].fillna("").astype(str).to_numpy(),
        "bytes": m["bytes_s"].fillna(-1).to_numpy(dtype=np.int64),
        "recv_bytes": m["bytes_r"].fillna(-1).to_numpy(dtype=np.int64),
        "send_start_ns": send_start,
        "send_end_ns": m["end_s"].to_numpy(dtype=np.float64),
        "recv_start_ns": recv_start,
        "recv_end_ns": recv_end,
        "transfer_ns": np.where(matched, recv_end - np.fmax(send_start, recv_start), np.nan),
        "late_sender_ns": np.where(matched, np.maximum(send_start - recv_start, 0.0), np.nan),
        "matched": matched,
    })
    return out[PAIR_COLUMNS]


def p2p_summary(pairs: pd.DataFrame) -> dict[str, Any]:
    """Counts and times of match_p2p's table: messages matched, their bytes,
    sends and receives left unmatched, transfer time p50 / p95 (ns)."""
    ok = pairs["matched"].to_numpy(dtype=bool)
    t = pairs["transfer_ns"].to_numpy(dtype=np.float64)[ok]
    return {
        "matched": int(ok.sum()),
        "bytes": int(pairs["bytes"].to_numpy()[ok].sum()),
        "unmatched_sends": int(((pairs["send_op"] != "") & ~ok).sum()),
        "unmatched_recvs": int(((pairs["recv_op"] != "") & ~ok).sum()),
        "transfer_p50_ns": float(np.percentile(t, 50)) if len(t) else None,
        "transfer_p95_ns": float(np.percentile(t, 95)) if len(t) else None,
    }
