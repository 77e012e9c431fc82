"""The gather's cost at rank 0 (hooks/mpi_gather.c): time and memory, against
the ranks and bytes it moves, on simulated hosts whose profile folder is
private (profiler.bench.simcluster, private=PATH), with gathering on and off
in alternation.

    python benchmarks/gather/gather_scale.py [--per-host 1,4,16] [--records 100000]
        [--rounds 3] [--json out.json]

Two hosts; the ranks on the second host send their files to rank 0 at
MPI_Finalize.  Each rank first writes --records application records through
the library (64 bytes each, no communication: benchmarks/gather/gather_job.c,
an LD_PRELOAD C program), so the bytes moved are the raw files' size.  Per
configuration: rank 0's MPI_Finalize time with and without the gather
(medians), the gather's own seconds and bytes (raw/gather.json), and rank
0's peak memory growth across MPI_Finalize (VmHWM).  Then the 1024-rank
figure from the fitted time per byte and per rank: a model, stated as such.
The machine's other load changes the times: say how loaded it was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from profiler.bench.simcluster import SimCluster  # noqa: E402
from profiler.collect.native import library_path  # noqa: E402


def build(out: Path) -> Path:
    exe = out / "gather_job"
    subprocess.run(["mpicc", "-O1", "-Wall", "-Wextra", "-Werror", str(HERE / "gather_job.c"),
                    "-o", str(exe), "-ldl"], check=True)
    return exe


def one(c: SimCluster, exe: Path, prof: Path, np_: int, per_host: int, records: int,
        gather: bool) -> dict:
    for h in range(2):  # each run starts with empty folders
        subprocess.run(["rm", "-rf", str(c.private_dir(h))], check=True)
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
           "HOROVOD_PROFILE_GATHER": "1" if gather else "0", "HOROVOD_PROFILE_MERGE": "0",
           "HOROVOD_PROFILE_CPU": "0", "LD_PRELOAD": library_path()}
    p = c.mpirun(np_, [str(exe), str(records)], env=env, per_host=per_host, timeout=900,
                 cwd=prof.parent)
    if p.returncode != 0:
        raise SystemExit(f"job failed ({p.returncode}):\n{p.stderr[-3000:]}")
    line = next(x for x in p.stdout.splitlines() if x.startswith("{"))
    out = json.loads(line)
    g = c.private_dir(0) / "raw" / "gather.json"
    out["gather"] = json.loads(g.read_text()) if g.is_file() else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-host", default="1,4,16")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hvprof-gather-") as tmp:
        t = Path(tmp)
        exe = build(t)
        prof = t / "prof"
        with SimCluster(hosts=2, slots=1, private=prof) as c:
            for k in [int(x) for x in a.per_host.split(",")]:
                np_ = 2 * k
                on: list[dict] = []
                off: list[dict] = []
                for _ in range(a.rounds):  # alternating
                    on.append(one(c, exe, prof, np_, k, a.records, True))
                    off.append(one(c, exe, prof, np_, k, a.records, False))
                g = [r["gather"] for r in on]
                row = {
                    "ranks": np_, "sent_ranks": k, "records": a.records,
                    "bytes": g[0]["bytes"] if g[0] else 0,
                    "gather_s": statistics.median(x["seconds"] for x in g if x),
                    "decide_s": statistics.median(x["decide_seconds"] for x in g if x),
                    "finalize_on_s": statistics.median(r["finalize_s"] for r in on),
                    "finalize_off_s": statistics.median(r["finalize_s"] for r in off),
                    "hwm_growth_on_kb": max(r["hwm_after_kb"] - r["hwm_before_kb"] for r in on),
                    "hwm_growth_off_kb": max(r["hwm_after_kb"] - r["hwm_before_kb"]
                                             for r in off),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    b = np.array([r["bytes"] for r in rows], dtype=float)
    s = np.array([r["gather_s"] - r["decide_s"] for r in rows], dtype=float)
    per_byte = float((s * b).sum() / (b * b).sum())  # the transfers, through the origin
    decide = max(r["decide_s"] for r in rows)  # identities, visibility, who sends
    big_ranks, big_bytes = 1023, 1023 * 64 * 100_000
    model = {"per_byte_s": per_byte, "rate_MB_s": 1e-6 / per_byte if per_byte else None,
             "decide_s_max": decide,
             "model_1024x100k_s": decide * 1024 / max(r["ranks"] for r in rows)
             + per_byte * big_bytes,
             "model_note": f"{big_ranks} ranks x 100k records (64 B each) sent over the "
                           "measured rate; the decision scaled linearly with the ranks",
             "rank0_memory_note": "one 4 MiB chunk, plus 28 bytes per rank of identities "
                                  "and flags (1024 ranks: 28 KiB)"}
    print(json.dumps(model), flush=True)
    print(f"load average: {os.getloadavg()}")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "model": model}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
