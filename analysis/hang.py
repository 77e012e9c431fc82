"""Why a job hangs, from its profile directory alone: a live job's, one killed
by a scheduler, or one whose every rank was killed with SIGKILL.

Each rank's raw file holds its completed calls and, in the flight recorder,
the collective each thread is blocked in.  For every communicator:

* each member rank's completed calls (its next sequence number) and its call
  in flight;
* the first sequence number at which the ranks disagree: the ranks that
  entered it (completed it, or are in it) and the ranks that never did, with
  what those are doing instead (their own call in flight, their last completed
  call, their Python stack from the hang snapshot);
* mismatches at one (communicator, sequence): different collectives;
* point-to-point calls in flight (a rank blocked in MPI_Recv, MPI_Send,
  MPI_Sendrecv, MPI_Probe): named with their peer (a rank of their
  communicator) and tag; they have no sequence number, so they are not
  matched with the other ranks' collectives (a rank in one counts as stuck);
* ranks that died (their process is gone and the file says it never finished);
* tensors handed to Horovod by some ranks and not by others (the tensor
  records, profiler.collect.tensors): Horovod's own hang, where every MPI call
  completes (the response-cache allreduce goes on each cycle) but a tensor one
  rank never submits keeps the others waiting in hvd.synchronize.  The n-th
  submission of a name on one rank is the n-th on every other; the first
  names (in submission time) that some rank lacks are reported.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from profiler import layout
from profiler.errors import EmptyProfileError, ProfilerError
from profiler.formats import record as F
from profiler.formats.clock import ticks_to_job_ns
from profiler.formats.raw import RawFile, read_raw, writer_state

__all__ = ["RankState", "CommState", "TensorGap", "Diagnosis", "diagnose", "render"]


@dataclass
class Call:
    op: str
    seq: int
    t_start_s: float  # job axis
    age_s: float | None = None  # in flight: for how long (from the file's last clock)


@dataclass
class RankState:
    rank: int
    host: str
    state: str                      # running, dead, finalized, closed, unknown
    in_flight: list[dict[str, Any]] = field(default_factory=list)  # comm, op, seq, since
    last: dict[str, Any] | None = None  # the last completed collective
    stack: str | None = None         # the main thread's Python stack (hang snapshot)
    problems: list[str] = field(default_factory=list)
    completed_ops: dict[tuple[int, int], str] = field(default_factory=dict, repr=False)


@dataclass
class CommState:
    comm: int
    name: str
    size: int
    ranks: list[int]
    seq: int                                # the first sequence where ranks disagree
    entered: dict[int, str] = field(default_factory=dict)   # rank -> "op (in flight 35 s)"
    never: list[int] = field(default_factory=list)
    mismatch: dict[str, list[int]] = field(default_factory=dict)  # op -> ranks


@dataclass
class TensorGap:
    tensor: str
    occurrence: int                         # the n-th submission of that name (from 0)
    submitted: dict[int, float] = field(default_factory=dict)  # rank -> job time (s)
    missing: list[int] = field(default_factory=list)           # ranks that never did
    missing_last: dict[int, str] = field(default_factory=dict)  # rank -> its last tensor


@dataclass
class Diagnosis:
    directory: str
    world_size: int
    ranks: list[RankState]
    comms: list[CommState]
    missing_ranks: list[int]
    snapshot: bool
    tensors: list[TensorGap] = field(default_factory=list)

    @property
    def stuck(self) -> bool:
        return bool(self.comms) or bool(self.tensors) or any(r.state == "dead"
                                                              for r in self.ranks) or \
            any(f.get("seq") is None for r in self.ranks for f in r.in_flight)

    def lines(self) -> list[str]:
        """The diagnosis as text, one finding a line (render)."""
        return render(self)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self) | {"stuck": self.stuck}
        for r in d["ranks"]:
            r.pop("completed_ops", None)
        return d


def _comm_index(raw: RawFile) -> tuple[dict[int, int], dict[int, tuple[str, int]]]:
    """handle -> comm id (the latest valid entry), id -> (name, size)."""
    by_handle: dict[int, int] = {}
    info: dict[int, tuple[str, int]] = {}
    from profiler.formats.raw import c_string

    for c in raw.comms:
        cid = int(c["id"])
        by_handle[int(c["handle"])] = cid
        info[cid] = (c_string(c["name"]), int(c["size"]))
    return by_handle, info


def _stack(directory: Path, rank: int) -> str | None:
    p = directory / "hang" / f"rank-{rank:05d}.stacks.txt"
    try:
        text = p.read_text(errors="replace")
    except OSError:
        return None
    # faulthandler: one block per thread, "Current thread" or "Thread 0x..."; keep
    # the main thread's (the last block faulthandler writes), first lines only
    blocks = [b for b in text.split("\n\n") if b.strip()]
    main = [b for b in blocks if "<module>" in b] or blocks[-1:]
    lines = [ln.strip() for ln in main[0].splitlines() if ln.strip().startswith("File")]
    return "; ".join(lines[:3]) if lines else None


def _rank(directory: Path, raw: RawFile) -> tuple[RankState, dict[int, int], dict[int, Any],
                                                 dict[int, tuple[str, int]]]:
    """A rank's state; its next sequence number per communicator; its call in
    flight per communicator (op, seq); the names and sizes of its communicators."""
    h = raw.header
    r = RankState(rank=raw.rank, host=str(h.get("hostname", "")), state=writer_state(h),
                  problems=list(raw.problems))
    rec = raw.records
    by_handle, info = _comm_index(raw)
    # collectives only: point-to-point calls have no sequence number
    host = np.isin(rec["op"], [o for o, (_, name, b) in F.OPS.items()
                               if F.is_comm_op(name, b) and name not in F.P2P_OPS])
    host &= rec["comm"] != np.uint32(0xFFFFFFFF)
    host &= (rec["flags"] & F.FLAG_DEVICE) == 0
    ids = raw.comms["id"].astype(np.uint64) if len(raw.comms) else np.zeros(0, np.uint64)
    nxt: dict[int, int] = {}
    r_ops: dict[tuple[int, int], str] = {}  # (comm, seq) -> op of the last calls
    sel = rec[host]
    last_t = -1
    for idx in np.unique(sel["comm"]) if len(sel) else []:
        if int(idx) >= len(ids):
            continue
        part = sel[sel["comm"] == idx]
        cid = int(ids[int(idx)])
        nxt[cid] = max(nxt.get(cid, 0), int(part["seq"].max()) + 1)
        recent = part[np.argsort(part["seq"], kind="stable")[-64:]]
        for s_, o_ in zip(recent["seq"].tolist(), recent["op"].tolist()):
            r_ops[(cid, int(s_))] = F.op_name(int(o_))
        j = int(np.argmax(part["t_end"]))
        if int(part["t_end"][j]) > last_t:
            last_t = int(part["t_end"][j])
            t = float(ticks_to_job_ns(np.array([part["t_start"][j]]), h)[0]) / 1e9
            r.last = {"comm": cid, "op": F.op_name(int(part["op"][j])),
                      "seq": int(part["seq"][j]), "t_start_s": t}
    flying: dict[int, Any] = {}
    for e in raw.inflight:
        found = by_handle.get(int(e["comm"]))
        if found is None:
            continue
        t = float(ticks_to_job_ns(np.array([e["t_start"]]), h)[0]) / 1e9
        op = F.op_name(int(e["op"]))
        if op in F.P2P_OPS:  # no sequence: not matched with the other ranks' collectives
            r.in_flight.append({"comm": found, "op": op, "seq": None, "since_s": t,
                                "track": int(e["track"]), "peer": int(e["peer"]),
                                "tag": int(e["tag"])})
            continue
        seq = nxt.get(found, 0)
        entry = {"comm": found, "op": op, "seq": seq, "since_s": t,
                 "track": int(e["track"])}
        r.in_flight.append(entry)
        flying[found] = entry
    r.stack = _stack(directory, raw.rank)
    r.completed_ops = r_ops
    return r, nxt, flying, info


_OP_TENSOR = next(v for v, (name, _, _) in F.OPS.items() if name == "APP_TENSOR")
#: The largest world size a raw header is believed about.
MAX_WORLD = 1 << 20
#: Tensor gaps reported at most (the earliest first).
MAX_TENSOR_GAPS = 5
#: A tensor the others submitted this long before the job's last record, and
#: one rank never did, is a gap even when that rank did not move on.
STALE_S = 1.0


def _tensors(raw: RawFile) -> dict[tuple[str, int], float]:
    """(name, occurrence) -> job time in s of each tensor this rank handed to Horovod."""
    from profiler.formats.raw import read_tensor_names

    rec = raw.records
    sel = rec[rec["op"] == _OP_TENSOR]
    if not len(sel):
        return {}
    names = read_tensor_names(raw.path)
    sel = sel[np.argsort(sel["t_start"], kind="stable")]
    t = ticks_to_job_ns(sel["t_start"], raw.header) / 1e9
    seen: dict[str, int] = {}
    out: dict[tuple[str, int], float] = {}
    for i, ts in zip(sel["seq"].tolist(), t.tolist()):
        name = names[i] if 0 <= i < len(names) else f"<name {i}>"
        n = seen.get(name, 0)
        seen[name] = n + 1
        out[(name, n)] = float(ts)
    return out


def _tensor_gaps(subs: dict[int, dict[tuple[str, int], float]], now_s: float
                 ) -> list[TensorGap]:
    """Tensors some ranks submitted and others did not, earliest first.

    A rank that lacks a tensor counts when it moved on without it (it handed
    Horovod a later tensor) or when the others submitted it more than
    STALE_S before the job's last record (`now_s`): a rank that is only a
    little behind, in a live job, is not reported."""
    ranks = sorted(subs)
    if len(ranks) < 2 or not any(subs.values()):
        return []
    first: dict[tuple[str, int], float] = {}
    for r in ranks:
        for k, t in subs[r].items():
            first[k] = min(t, first.get(k, t))
    last: dict[int, tuple[float, str]] = {}
    for r in ranks:
        if subs[r]:
            k, t = max(subs[r].items(), key=lambda kv: kv[1])
            last[r] = (t, f"{k[0]} #{k[1]} at {t:.3f} s")
    gaps: list[TensorGap] = []
    for key, t0 in sorted(first.items(), key=lambda kv: kv[1]):
        lack = [r for r in ranks if key not in subs[r]
                and ((r in last and last[r][0] > t0) or now_s - t0 > STALE_S)]
        if not lack:
            continue
        have = [r for r in ranks if key in subs[r]]
        gaps.append(TensorGap(tensor=key[0], occurrence=key[1],
                              submitted={r: subs[r][key] for r in have}, missing=lack,
                              missing_last={r: last[r][1] if r in last else "no tensor at all"
                                            for r in lack}))
        if len(gaps) >= MAX_TENSOR_GAPS:
            break
    return gaps


def diagnose(path: str | os.PathLike[str]) -> Diagnosis:
    """Read every rank's raw file under `path` (a profile directory) and say who
    is stuck where (module doc)."""
    d = layout.check_profile_dir(path)
    problems: list[str] = []
    raws = layout.rank_files(d, layout.RAW_DIR, "hvprof", problems)
    if not raws:
        raise EmptyProfileError(d, "no raw files: a hang is diagnosed from raw/rank-*.hvprof")
    states: list[RankState] = []
    nxt: dict[int, dict[int, int]] = {}
    flying: dict[int, dict[int, Any]] = {}
    names: dict[int, tuple[str, int]] = {}
    subs: dict[int, dict[tuple[str, int], float]] = {}
    now_s = float("-inf")
    world = 0
    for rank, p in sorted(raws.items()):
        try:
            raw = read_raw(p)
        except ProfilerError as exc:
            states.append(RankState(rank=rank, host="", state="unreadable",
                                    problems=[exc.line()]))
            continue
        world = max(world, int(raw.header.get("world_size") or 0))
        st, n, f, info = _rank(d, raw)
        subs[rank] = _tensors(raw)
        if len(raw.records):
            end = float(ticks_to_job_ns(np.array([raw.records["t_end"].max()]),
                                        raw.header)[0]) / 1e9
            now_s = max(now_s, end)
        states.append(st)
        nxt[rank], flying[rank] = n, f
        names.update(info)
    by_rank = {s.rank: s for s in states}
    members: dict[int, list[int]] = {}
    for rank in nxt:
        for cid in set(nxt[rank]) | set(flying[rank]):
            members.setdefault(cid, []).append(rank)
    comms: list[CommState] = []
    for cid, ranks in sorted(members.items()):
        name, size = names.get(cid, ("", len(ranks)))
        ranks = sorted(ranks)
        done = {r: nxt[r].get(cid, 0) for r in ranks}
        if not any(cid in flying[r] for r in ranks) and len(set(done.values())) <= 1:
            continue  # nothing in flight and everyone at the same place
        s = min(done.values())
        cs = CommState(comm=cid, name=name, size=size, ranks=ranks, seq=s)
        ops: dict[str, list[int]] = {}
        for r in ranks:
            fl = flying[r].get(cid)
            if fl is not None and fl["seq"] == s:
                cs.entered[r] = f"{fl['op']} (in flight since {fl['since_s']:.3f} s)"
                ops.setdefault(fl["op"], []).append(r)
            elif done[r] > s:
                op = by_rank[r].completed_ops.get((cid, s), "?")
                cs.entered[r] = f"{op} (completed it)"
                if op != "?":
                    ops.setdefault(op, []).append(r)
            else:
                cs.never.append(r)
        if len(ops) > 1:
            cs.mismatch = ops
        if not cs.never and not cs.mismatch and len(cs.entered) == len(ranks) and \
                all(v.endswith("(completed it)") for v in cs.entered.values()):
            continue
        comms.append(cs)
    present = {s.rank for s in states}
    if world > MAX_WORLD:  # a header that cannot be right: the files say who is there
        for st in states:
            st.problems.append(f"world size {world} in a raw header is not believable")
        world = max(present) + 1 if present else 0
    missing = [r for r in range(world) if r not in present]
    return Diagnosis(directory=str(d), world_size=world, ranks=states, comms=comms,
                     missing_ranks=missing, snapshot=(d / "hang").is_dir(),
                     tensors=_tensor_gaps(subs, now_s))


def _comm_label(c: Any) -> str:
    return f"{c.name} ({c.comm:#x})" if c.name else f"{c.comm:#x}"


def _peer_text(peer: int) -> str:
    """A point-to-point peer (a rank of the call's communicator, or the format's
    special values) in words."""
    if peer == F.PEER_PROC_NULL:
        return "MPI_PROC_NULL"
    if peer == F.PEER_ANY_SOURCE:
        return "any source"
    return f"rank {peer}"


def _flight_text(f: dict[str, Any], comm: bool = False) -> str:
    """A call in flight: a collective with its sequence number, a point-to-point
    call with its peer and tag (no sequence)."""
    where = f" on comm {f['comm']:#x}" if comm else ""
    if f.get("seq") is None:
        tag = "any" if f.get("tag") == F.TAG_ANY else f.get("tag")
        side = "from" if f["op"] in F.P2P_RECV_OPS or "probe" in f["op"] else "to"
        return f"{f['op']} {side} {_peer_text(int(f.get('peer', -1)))} tag {tag}{where}"
    return f"{f['op']}{where} seq {f['seq']}"


def render(dg: Any) -> list[str]:
    from profiler.errors import printable

    out = [f"{dg.directory}: {len(dg.ranks)} rank file(s) of {dg.world_size}"
           + (", hang snapshot present" if dg.snapshot else "")]
    if dg.missing_ranks:
        out.append(f"  ranks with no file: {dg.missing_ranks}")
    by_rank = {r.rank: r for r in dg.ranks}
    for r in dg.ranks:
        what = ", ".join(_flight_text(f) for f in r.in_flight) or "no collective"
        out.append(f"  rank {r.rank} ({r.host or '?'}): {r.state}; in flight: {what}")
    for r in dg.ranks:
        if r.state == "dead":
            out.append(f"rank {r.rank} DIED (its process is gone and its file says it never "
                       "finished): the others wait for a rank that will not come")
    for c in dg.comms:
        head = f"comm {_comm_label(c)}, seq {c.seq}:"
        if c.mismatch:
            parts = "; ".join(f"rank(s) {','.join(map(str, rs))} in {op}"
                              for op, rs in sorted(c.mismatch.items()))
            out.append(f"{head} MISMATCH: different collectives at the same call: {parts}")
        entered = ", ".join(f"rank {r} {v}" for r, v in sorted(c.entered.items()))
        if c.never:
            out.append(f"{head} entered by {entered or 'no rank'}; NEVER entered by rank(s) "
                       f"{','.join(map(str, c.never))}")
            for rk in c.never:
                r = by_rank.get(rk)
                if r is None:
                    continue
                doing = ", ".join(_flight_text(f, comm=True)
                                  for f in r.in_flight) or "no collective in flight"
                last = (f"last completed: {r.last['op']} seq {r.last['seq']} at "
                        f"{r.last['t_start_s']:.3f} s" if r.last else "no completed call")
                out.append(f"  rank {rk} instead: {doing}; {last}"
                           + (f"; Python: {r.stack}" if r.stack else ""))
        elif not c.mismatch:
            out.append(f"{head} every rank entered it: {entered}")
    for g in dg.tensors:
        when = ", ".join(f"rank {r} at {t:.3f} s" for r, t in sorted(g.submitted.items()))
        out.append(f"tensor {g.tensor} (submission #{g.occurrence}): handed to Horovod by "
                   f"{when}; NEVER by rank(s) {','.join(map(str, g.missing))}: Horovod "
                   "waits for every rank to submit a tensor (hvd.synchronize blocks)")
        for rk in g.missing:
            stack = by_rank[rk].stack if rk in by_rank else None
            out.append(f"  rank {rk}'s last tensor: {g.missing_last.get(rk, '?')}"
                       + (f"; Python: {stack}" if stack else ""))
    for r in dg.ranks:
        for f in r.in_flight:
            if f.get("seq") is None:
                out.append(f"rank {r.rank} BLOCKED in point-to-point {_flight_text(f, True)} "
                           f"since {f['since_s']:.3f} s (peer: a rank of that comm)")
    if not dg.stuck:
        out.append("nothing is stuck: no collective in flight, every rank at the same call")
    elif not dg.snapshot:
        out.append("no hang snapshot (Python stacks): the watchdog writes one after "
                   "HOROVOD_PROFILE_HANG_S seconds (default 120)")
    return [printable(x) for x in out]
