"""A stand-in for Horovod 0.28's background loop that writes the records the
profiler would (tensor records and the calls of Horovod's thread, per rank),
with the ground truth of which tensors rode in which call: for tests of the
fusion lineage at scales and ambiguities real runs on 2 cores cannot reach
in the suite's time.

What it reproduces (horovod/common/operations.cc RunLoopOnce, controller.cc
ComputeResponseList and FuseResponses, response_cache.cc at v0.28.1): each
rank's thread sleeps out its cycle, pops the requests queued so far, makes
the response cache's MPI_BAND allreduce (8 bytes), then performs the cycle's
responses: the tensors popped on every rank, cached ones in the order of
their first response (cache bits), new ones after them in the order they
became ready; packed front to back into fused calls of one dtype up to the
threshold (a tensor larger than the threshold alone), each call in the
fusion buffer, or in the tensor's own memory when it carries one.  A
training loop enqueues every gradient in backward order, waits until all
were reduced (hvd.DistributedOptimizer.step), then starts the next step:
so a name is never queued twice at once.  Times are in ns on one clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

FUSION_BUF = 0x0F00D000
COMM = 77


@dataclass
class SimJob:
    frames: dict[int, pd.DataFrame]
    names: dict[int, list[str]]
    truth: pd.DataFrame          # tensor, occurrence, call_comm, call_seq (rank 0's calls)
    calls_per_step: float


def bert_sizes(layers: int = 12, hidden: int = 64, vocab: int = 1000, max_len: int = 64,
               classes: int = 2) -> list[tuple[str, int]]:
    """(name, bytes) of a BERT-style encoder's float32 gradients, in parameter
    order (profiler.workloads.corpus.Bert)."""
    h, f = hidden, 4 * hidden
    out = [("word.weight", vocab * h), ("position.weight", max_len * h),
           ("token_type.weight", 2 * h), ("ln.weight", h), ("ln.bias", h)]
    for i in range(layers):
        p = f"layers.{i}."
        for m in ("query", "key", "value", "out"):
            out += [(p + m + ".weight", h * h), (p + m + ".bias", h)]
        out += [(p + "ln1.weight", h), (p + "ln1.bias", h),
                (p + "ffn_in.weight", h * f), (p + "ffn_in.bias", f),
                (p + "ffn_out.weight", f * h), (p + "ffn_out.bias", h),
                (p + "ln2.weight", h), (p + "ln2.bias", h)]
    out += [("pooler.weight", h * h), ("pooler.bias", h), ("classifier.weight", h * classes),
            ("classifier.bias", classes)]
    return [(n, 4 * k) for n, k in out]


def simulate(sizes: Sequence[tuple[str, int]], *, steps: int = 10, ranks: int = 2,
             cycle_ns: int = 1_000_000, threshold: int = 128 << 20, backward_ns: int = 2_000_000,
             forward_ns: int = 1_000_000, gap_ns: int = 20_000, jitter_ns: int = 200_000,
             burst: int = 1, seed: int = 0) -> SimJob:
    """A data-parallel job of `steps` steps over gradients `sizes` (name,
    bytes), backward in reverse order spread over `backward_ns` (tensors come
    `burst` at a time, at one instant: layers that finish together), each rank
    with its own jitter; `gap_ns` between a cycle's pop and its first call
    (a tensor enqueued in it waits for the next cycle, though it came before
    the call: the ambiguity the lineage must state)."""
    rng = np.random.default_rng(seed)
    names = ["allreduce." + n for n, _ in sizes]
    nbytes = np.asarray([b for _, b in sizes], dtype=np.int64)
    T = len(names)
    bufs = [0x10000000 + 0x1000 * i for i in range(T)]
    offs = rng.integers(0, cycle_ns // 2, size=ranks)
    order = list(range(T))[::-1]  # backward: the last layer first
    # per rank: the enqueue times of the step being run (None until it starts)
    enq: list[dict[int, int]] = [dict() for _ in range(ranks)]
    step_of = [0] * ranks
    start_next = [forward_ns + int(offs[r]) for r in range(ranks)]
    done_step = [[False] * T for _ in range(ranks)]
    tensor_rows: list[list[dict]] = [[] for _ in range(ranks)]
    call_rows: list[list[dict]] = [[] for _ in range(ranks)]
    seq = 0
    bits: dict[int, int] = {}
    truth = []
    occ = [0] * T
    t_free = [0] * ranks       # when each rank's thread is free
    cycle_start = [int(offs[r]) for r in range(ranks)]
    finished = [False] * ranks
    n_calls = 0

    def begin_step(r: int, t0: int) -> None:
        enq[r] = {}
        k = 0
        while k < T:
            t = t0 + int(backward_ns * k / T) + int(rng.integers(0, jitter_ns))
            for i in order[k:k + burst]:
                enq[r][i] = t
            k += burst
        for i, t in enq[r].items():
            tensor_rows[r].append({"op": "tensor", "backend": "app", "kind": "app",
                                   "t_start_ns": t, "t_end_ns": t + 2_000, "dur_ns": 2_000,
                                   "bytes": int(nbytes[i]), "dtype": "ncclFloat32",
                                   "redop": "avg", "buf": bufs[i], "root": -1, "seq": i,
                                   "comm": 0, "comm_size": -1, "thread_kind": "main",
                                   "track": 0, "step": step_of[r], "rc": 0})
        done_step[r] = [False] * T

    for r in range(ranks):
        begin_step(r, start_next[r])
    pending: list[int] = []  # tensors queued on some rank, not yet reduced, this step
    guard = 0
    while not all(finished) and guard < 10_000_000:
        guard += 1
        # every rank's cycle: sleep out the cycle, pop (at its start)
        pops = [max(cycle_start[r] + cycle_ns, t_free[r]) for r in range(ranks)]
        for r in range(ranks):
            cycle_start[r] = pops[r]
        ready = [i for i in range(T)
                 if all(not finished[r] and i in enq[r] and not done_step[r][i]
                        and enq[r][i] + 1_000 < pops[r] for r in range(ranks))]
        # the control call: the bit-vector allreduce, together on every rank
        c0 = [pops[r] + gap_ns for r in range(ranks)]
        c_end = max(c0) + 5_000
        seq += 1
        for r in range(ranks):
            call_rows[r].append(_call(c0[r], c_end, 8, "MPI_LONG_LONG_INT", "band", 0, seq,
                                      step_of[r]))
        t = c_end
        if ready:
            new = sorted((i for i in ready if i not in bits),
                         key=lambda i: (max(enq[r][i] for r in range(ranks)), i))
            resp = sorted((i for i in ready if i in bits), key=lambda i: bits[i]) + new
            calls: list[list[int]] = []
            while resp:
                first = resp.pop(0)
                group, size = [first], int(nbytes[first])
                while resp and size + int(nbytes[resp[0]]) <= threshold:
                    size += int(nbytes[resp[0]])
                    group.append(resp.pop(0))
                calls.append(group)
            for group in calls:
                seq += 1
                n_calls += 1
                b = int(nbytes[group].sum())
                buf = bufs[group[0]] if len(group) == 1 else FUSION_BUF
                dur = 2_000 + b // 10
                for r in range(ranks):
                    call_rows[r].append(_call(t + 1_000, t + 1_000 + dur, b, "MPI_FLOAT", "sum",
                                              buf, seq, step_of[r], kind="data"))
                for i in group:
                    bits.setdefault(i, len(bits))
                    truth.append({"tensor": names[i], "occurrence": occ[i],
                                  "call_comm": COMM, "call_seq": seq})
                    occ[i] += 1
                    for r in range(ranks):
                        done_step[r][i] = True
                t += 1_000 + dur
        for r in range(ranks):
            t_free[r] = t
            if not finished[r] and all(done_step[r]):
                step_of[r] += 1
                if step_of[r] >= steps:
                    finished[r] = True
                else:
                    begin_step(r, t + forward_ns + int(rng.integers(0, jitter_ns)))
        del pending
        pending = []
    frames = {}
    for r in range(ranks):
        df = pd.DataFrame(tensor_rows[r] + call_rows[r])
        frames[r] = df.sort_values("t_start_ns", kind="stable").reset_index(drop=True)
    tr = pd.DataFrame(truth)
    return SimJob(frames, {r: list(names) for r in range(ranks)}, tr, n_calls / steps)


def _call(t0: int, t1: int, nbytes: int, dtype: str, redop: str, buf: int, seq: int, step: int,
          kind: str = "control") -> dict:
    return {"op": "allreduce", "backend": "mpi", "kind": kind, "t_start_ns": t0, "t_end_ns": t1,
            "dur_ns": t1 - t0, "bytes": nbytes, "dtype": dtype, "redop": redop, "buf": buf,
            "root": -1, "seq": seq, "comm": COMM, "comm_size": 2, "thread_kind": "horovod",
            "track": 1, "step": step, "rc": 0}


def truth_table(job: SimJob) -> pd.DataFrame:
    """The truth as a lineage table fusion.compare reads (the oracle's side)."""
    t = job.truth
    return pd.DataFrame({"tensor": t["tensor"], "occurrence": t["occurrence"],
                         "matched": True, "call_comm": t["call_comm"].astype(np.uint64),
                         "call_seq": t["call_seq"], "candidates": "", "confidence": 1.0})
