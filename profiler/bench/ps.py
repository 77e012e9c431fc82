"""Parameter server (push + pull) against MPI_Allreduce on simulated hosts.

    profiler bench --pattern ps --servers 1,2,4 --workers 4 -o DIR
                   [--payload 8M] [--rate 200mbit] [--rounds 2]
                   [--allreduce-algorithm ring|default]

The MXNet design proposal "Extend MXNet Distributed Training by MPI
AllReduce" measured a 400 MB reduction on 8 workers: parameter server push+pull 6.5 s with 1 server,
3.4 s with 2, 2.0 s with 4, 1.2 s with 8; MPI_Allreduce 1.0 s.  This bench
rebuilds that table on a cluster simulated on this machine
(profiler.bench.simcluster): one rank per simulated host, every host's link
rate-limited (tbf) to --rate, the workers on the first hosts, the servers on
hosts of their own.

One job per server count S (W workers + S servers, Open MPI over TCP):

- push + pull: the parameters (--payload bytes of float32) are sharded into S
  contiguous parts; every worker sends part j to server j (MPI_Isend), each
  server receives the W parts (MPI_Irecv), sums them and sends the sum back
  to every worker; the time is the slowest rank's, from a barrier to the
  last worker holding the whole sum.
- MPI_Allreduce of the same payload among the W workers, on the same hosts
  and links, while the servers wait: Open MPI's ring algorithm (the
  bandwidth-optimal one, as in Horovod; coll_tuned_allreduce_algorithm 4),
  or with --allreduce-algorithm default, whatever Open MPI's tuned rules pick.

Waiting ranks poll their requests with short sleeps, and Open MPI runs with
mpi_yield_when_idle 1 (the simulated hosts share this machine's cores).
Each time is the median of --rounds timed runs
after one warm-up.  The defaults (8 MiB, 200 Mbit/s) keep the run to about
half a minute on 2 cores while the transfers, not the shared CPUs, set the
times; faster links make the CPUs that emulate them the bottleneck.
Rank 0 prints one `PSRESULT {json}` line; the launcher
prints the table beside the proposal's, with what the link rate alone predicts:
push then pull through S server links, 2 W P / (S R); a ring allreduce,
2 (W - 1) P / (W R).  The job runs under HOROVOD_PROFILE=1: DIR/servers-S/
holds each job's trace (its MPI_Allreduce calls).

    python -m profiler.bench.ps --job --workers 4 --servers 2 --bytes 16777216

is the job itself (one process per rank, under mpirun).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The MXNet proposal's table (400 MB, 8 workers), seconds.
SEED_PS = {1: 6.5, 2: 3.4, 4: 2.0, 8: 1.2}
SEED_ALLREDUCE = 1.0
SEED_LABEL = "MXNet proposal: 400 MB, 8 workers"

POLL_S = 0.0002


# ---------------------------------------------------------------------------
# the job (one process per rank)


def _wait(reqs: list[Any]) -> None:
    from mpi4py import MPI

    while not MPI.Request.Testall(reqs):
        time.sleep(POLL_S)


def _barrier(comm: Any) -> None:
    _wait([comm.Ibarrier()])


def job(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="profiler.bench.ps --job")
    ap.add_argument("--job", action="store_true")
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--servers", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args(argv)

    import numpy as np
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    W, S = a.workers, a.servers
    if size != W + S:
        print(f"ps: {size} ranks for {W} workers + {S} servers", file=sys.stderr)
        return 2
    n = a.bytes // 4
    bounds = np.linspace(0, n, S + 1).astype(np.int64)  # shard j: [bounds[j], bounds[j+1])
    is_worker = rank < W
    workers = world.Split(0 if is_worker else 1, rank)
    want = float(W * (W + 1) // 2)
    grad = np.full(n, rank + 1, dtype=np.float32) if is_worker else None

    def push_pull() -> float:
        _barrier(world)
        t0 = MPI.Wtime()
        if is_worker:
            assert grad is not None
            out = np.empty_like(grad)
            reqs = []
            for j in range(S):
                lo, hi = int(bounds[j]), int(bounds[j + 1])
                reqs.append(world.Irecv(out[lo:hi], source=W + j, tag=2))
                reqs.append(world.Isend(grad[lo:hi], dest=W + j, tag=1))
            _wait(reqs)
            if not (out[0] == want and out[-1] == want):
                raise SystemExit(f"ps: wrong sum at rank {rank}: {out[0]} != {want}")
        else:
            j = rank - W
            m = int(bounds[j + 1] - bounds[j])
            parts = np.empty((W, m), dtype=np.float32)
            _wait([world.Irecv(parts[w], source=w, tag=1) for w in range(W)])
            total = parts.sum(axis=0)
            _wait([world.Isend(total, dest=w, tag=2) for w in range(W)])
        dt = MPI.Wtime() - t0
        return float(world.allreduce(dt, op=MPI.MAX))

    def allreduce() -> float:
        _barrier(world)
        t0 = MPI.Wtime()
        if is_worker:
            assert grad is not None
            out = np.empty_like(grad)
            workers.Allreduce(grad, out, op=MPI.SUM)
            if not (out[0] == want and out[-1] == want):
                raise SystemExit(f"ps: wrong allreduce at rank {rank}")
        dt = MPI.Wtime() - t0 if is_worker else 0.0
        return float(world.allreduce(dt, op=MPI.MAX))

    ps_t = [push_pull() for _ in range(a.iters + 1)][1:]
    ar_t = [allreduce() for _ in range(a.iters + 1)][1:]
    if rank == 0:
        print("PSRESULT " + json.dumps({
            "workers": W, "servers": S, "bytes": n * 4, "ps_s": ps_t, "allreduce_s": ar_t,
            "ps_median_s": statistics.median(ps_t),
            "allreduce_median_s": statistics.median(ar_t)}), flush=True)
    _barrier(world)
    return 0


# ---------------------------------------------------------------------------
# the launcher


def predicted(workers: int, servers: int | None, nbytes: int, rate_bits: float) -> float:
    """Seconds the link rate alone allows: push then pull through `servers`
    links (None: a ring allreduce among the workers), one worker per host;
    the bytes the busiest link carries are profiler.analysis.predict's
    (algorithm_cost, the one definition)."""
    from profiler.analysis.predict import algorithm_cost

    alg = "ring" if servers is None else "ps"
    _, factor = algorithm_cost(alg, workers, 1, servers or 0)
    return factor * nbytes * 8 / rate_bits


ALGORITHMS = {"ring": ["--mca", "coll_tuned_use_dynamic_rules", "1",
                       "--mca", "coll_tuned_allreduce_algorithm", "4"],
              "default": []}
# The simulated hosts share this machine's few cores: ranks blocked in MPI
# yield the CPU (Open MPI's setting for oversubscribed nodes) instead of
# spinning against the ranks that have data to move.
OVERSUBSCRIBED = ["--mca", "mpi_yield_when_idle", "1"]


def table(results: list[dict[str, Any]], workers: int, nbytes: int, rate: str,
          rate_bits: float, algorithm: str = "ring") -> str:
    lines = [f"parameter server vs MPI_Allreduce: {workers} workers, {nbytes / 2**20:.1f} MiB "
             f"of float32, one rank per simulated host, links {rate} (tbf), Open MPI TCP, "
             f"allreduce algorithm: {algorithm}",
             "",
             f"{'':18}{'this cluster':>14}{'link-bound':>12}    {SEED_LABEL}",
             f"{'':18}{'median (s)':>14}{'model (s)':>12}"]
    seen = set()
    for r in results:
        s = int(r["servers"])
        seen.add(s)
        seed = SEED_PS.get(s)
        lines.append(f"{f'PS, {s} server(s)':18}{r['ps_median_s']:>14.3f}"
                     f"{predicted(workers, s, nbytes, rate_bits):>12.3f}    "
                     + (f"{seed:.1f}" if seed is not None else "-"))
    for s, seed in SEED_PS.items():
        if s not in seen:
            lines.append(f"{f'PS, {s} server(s)':18}{'-':>14}{'-':>12}    {seed:.1f}")
    ar = statistics.median(r["allreduce_median_s"] for r in results)
    lines.append(f"{'MPI_Allreduce':18}{ar:>14.3f}"
                 f"{predicted(workers, None, nbytes, rate_bits):>12.3f}    {SEED_ALLREDUCE:.1f}")
    return "\n".join(lines)


def run(workers: int, servers: Sequence[int], nbytes: int, rate: str, out: Path, *,
        iters: int = 2, timeout: float = 600, python: str = sys.executable,
        algorithm: str = "ring") -> dict[str, Any]:
    from profiler.bench import simcluster

    ok, why = simcluster.available(rate=True)
    if not ok:
        raise simcluster.SimClusterError(why)
    rate_bits = simcluster._rate_bits(rate)
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    with simcluster.SimCluster(hosts=workers + max(servers), rate=rate, slots=1) as c:
        for s in servers:
            prof = out / f"servers-{s}"
            env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof.resolve()),
                   "HOROVOD_PROFILE_MERGE_TIMEOUT": "30"}
            p = c.mpirun(workers + s, [python, "-P", "-m", "profiler.bench.ps", "--job",
                                       "--workers", str(workers), "--servers", str(s),
                                       "--bytes", str(nbytes), "--iters", str(iters)],
                         env=env, timeout=timeout, per_host=1,
                         extra=[*OVERSUBSCRIBED, *ALGORITHMS[algorithm]])
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("PSRESULT ")), None)
            if p.returncode != 0 or line is None:
                raise RuntimeError(f"ps bench with {s} server(s) failed ({p.returncode}):\n"
                                   f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            results.append(json.loads(line.split(" ", 1)[1]))
    text = table(results, workers, nbytes, rate, rate_bits, algorithm)
    doc = {"pattern": "ps", "workers": workers, "servers": list(servers), "bytes": nbytes,
           "rate": rate, "rounds": iters, "allreduce_algorithm": algorithm,
           "results": results, "table": text,
           "seed": {"ps_s": SEED_PS, "allreduce_s": SEED_ALLREDUCE, "label": SEED_LABEL}}
    (out / "bench-ps.json").write_text(json.dumps(doc, indent=1))
    return doc


def run_from_args(args: argparse.Namespace) -> int:
    """`profiler bench --pattern ps` (profiler/cli/bench.py)."""
    from profiler.bench import parse_size
    from profiler.bench.simcluster import SimClusterError
    from profiler.errors import UsageError

    try:
        servers = [int(x) for x in str(args.servers).split(",") if x.strip()]
    except ValueError:
        raise UsageError(None, f"--servers {args.servers!r}: comma-separated counts") from None
    if not servers or min(servers) < 1 or args.workers < 2:
        raise UsageError(None, "--servers needs counts >= 1 and --workers >= 2")
    if args.workers + max(servers) > 16:
        raise UsageError(None, "workers + servers: at most 16 simulated hosts")
    nbytes = parse_size(args.payload)
    if nbytes < 4 * max(servers):
        raise UsageError(None, f"--payload {args.payload}: too small")
    nbytes -= nbytes % 4
    try:
        doc = run(args.workers, servers, nbytes, args.rate, Path(args.output),
                  iters=args.rounds, timeout=args.timeout, algorithm=args.allreduce_algorithm)
    except SimClusterError as exc:
        raise UsageError(None, f"--pattern ps needs simulated hosts: {exc}") from None
    print(doc["table"])
    print(f"profiler: ps bench: {Path(args.output) / 'bench-ps.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if "--job" in sys.argv[1:]:
        sys.exit(job(sys.argv[1:]))
    print(__doc__)
    sys.exit(2)
