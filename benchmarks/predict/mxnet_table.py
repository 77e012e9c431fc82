"""The MXNet proposal's table, predicted from a profile made here.

    python benchmarks/predict/mxnet_table.py OUT [--payload-mb 400]

The MXNet proposal (MPI_Allreduce for MXNet) measured a 400 MB reduction on 8
workers over 10 GbE: push+pull through 1, 2, 4 and 8 parameter servers took
6.5, 3.4, 2.0 and 1.2 s, MPI allreduce 1.0 s.

1. Profile the job of benchmarks/predict/job.py with one layer of
   --payload-mb of float32 (its gradient is the payload, reduced once a step)
   at 2 simulated hosts, the bridge's speed (OUT/profile).
2. `profiler bench --pattern ps --servers 1,2,4 --workers 4 --payload 8M
   --rate 200mbit` measures push+pull and MPI_Allreduce on this machine's
   simulated hosts (OUT/ps, the table of docs/SIMCLUSTER.md).
3. Predict, from the profile: (a) that bench's layout (4 workers, 200
   Mbit/s, S = 1, 2, 4, allreduce), set beside the bench's measured times
   scaled to the profile's payload (link-bound: times grow with the
   payload); (b) the proposal's (8 workers, 10 GbE, S = 1, 2, 4, 8,
   allreduce).  The figure compared is the predicted transfer part of the
   step (the payload is one tensor, ready at the end of the backward pass:
   its whole reduction comes after the last arrival).

Prints both tables, the neighbouring rows' ratios against the proposal's
and whether each lies within 25% of it; writes OUT/mxnet-table.json.
Needs root (simulated hosts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JOB = HERE / "job.py"
SEED_PS = {1: 6.5, 2: 3.4, 4: 2.0, 8: 1.2}
SEED_ALLREDUCE = 1.0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "profiler.cli", *args],
                          capture_output=True, text=True)


def profile(out: Path, payload_mb: float) -> Path:
    from profiler.bench.simcluster import SimCluster

    dest = out / "profile"
    if (dest / "trace.json").is_file():
        return dest / "trace.json"
    elems = int(payload_mb * 1e6 / 4)
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(dest.resolve()),
           "HOROVOD_PROFILE_MERGE_TIMEOUT": "120", "OMPI_MCA_mpi_yield_when_idle": "1"}
    with SimCluster(hosts=2, slots=1) as c:
        p = c.mpirun(2, [sys.executable, "-P", str(JOB), "--layers", str(elems),
                         "--steps", "8", "--warmup", "2", "--jitter-ms", "1"],
                     env=env, timeout=1800, per_host=1)
    if p.returncode != 0 or not (dest / "trace.json").is_file():
        raise SystemExit(f"profile failed ({p.returncode}):\n{p.stdout[-1500:]}\n"
                         f"{p.stderr[-2000:]}")
    return dest / "trace.json"


def ps_bench(out: Path) -> dict[str, Any]:
    doc = out / "ps" / "bench-ps.json"
    if not doc.is_file():
        p = _cli("bench", "--pattern", "ps", "--servers", "1,2,4", "--workers", "4",
                 "--payload", "8M", "--rate", "200mbit", "-o", str(out / "ps"))
        if p.returncode != 0:
            raise SystemExit(f"ps bench failed:\n{p.stderr[-2000:]}")
    return json.loads(doc.read_text())


def predicted_transfer_s(trace: Path, hosts: int, link: str, layout: str) -> float:
    p = _cli("predict", str(trace), "--hosts", str(hosts), "--ranks-per-host", "1",
             "--link", link, "--layout", layout, "--format", "json")
    doc = json.loads(p.stdout)
    if doc.get("no_prediction"):
        raise SystemExit(f"no prediction: {doc['no_prediction']}")
    return float(doc["breakdown"]["transfer"]) / 1e3


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/predict/mxnet_table.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--payload-mb", type=float, default=400.0)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    trace = profile(out, a.payload_mb)
    bench = ps_bench(out)
    payload = a.payload_mb * 1e6
    scale = payload / float(bench["bytes"])
    local = []
    for r in bench["results"]:
        s = int(r["servers"])
        local.append({"layout": f"ps:{s}", "measured_s": float(r["ps_median_s"]) * scale,
                      "predicted_s": predicted_transfer_s(trace, 4, "200mbit", f"ps:{s}")})
    ar = sorted(float(r["allreduce_median_s"]) for r in bench["results"])[len(bench["results"])
                                                                          // 2]
    local.append({"layout": "allreduce", "measured_s": ar * scale,
                  "predicted_s": predicted_transfer_s(trace, 4, "200mbit", "allreduce")})
    seed = [{"layout": f"ps:{s}", "proposal_s": v,
             "predicted_s": predicted_transfer_s(trace, 8, "10gbit", f"ps:{s}")}
            for s, v in SEED_PS.items()]
    seed.append({"layout": "allreduce", "proposal_s": SEED_ALLREDUCE,
                 "predicted_s": predicted_transfer_s(trace, 8, "10gbit", "allreduce")})
    ratios = []
    for x, y in zip(seed, seed[1:]):
        want = x["proposal_s"] / y["proposal_s"]
        got = x["predicted_s"] / y["predicted_s"]
        ratios.append({"rows": f"{x['layout']} / {y['layout']}", "proposal": want,
                       "predicted": got, "within_25pct": abs(got / want - 1) <= 0.25})
    order = [r["layout"] for r in sorted(seed, key=lambda r: -r["predicted_s"])]
    doc = {"payload_mb": a.payload_mb, "profile": str(trace), "local": local, "seed": seed,
           "ratios": ratios, "same_order": order == [r["layout"] for r in seed],
           "seconds": round(time.monotonic() - t0, 1),
           "command": f"python benchmarks/predict/mxnet_table.py OUT --payload-mb {a.payload_mb:g}"}
    (out / "mxnet-table.json").write_text(json.dumps(doc, indent=1))
    print(f"this machine: 4 workers, 200 Mbit/s (bench scaled to {a.payload_mb:g} MB)")
    print(f"{'':12}{'measured (s)':>14}{'predicted (s)':>15}")
    for r in local:
        print(f"{r['layout']:12}{r['measured_s']:>14.2f}{r['predicted_s']:>15.2f}")
    print(f"\nthe MXNet proposal: {a.payload_mb:g} MB, 8 workers, 10 GbE")
    print(f"{'':12}{'proposal (s)':>14}{'predicted (s)':>15}")
    for r in seed:
        print(f"{r['layout']:12}{r['proposal_s']:>14.2f}{r['predicted_s']:>15.2f}")
    print("\nneighbouring rows' ratios:")
    for r in ratios:
        print(f"  {r['rows']:22} proposal {r['proposal']:.2f}  predicted {r['predicted']:.2f}  "
              f"{'within 25%' if r['within_25pct'] else 'OUTSIDE 25%'}")
    print(f"same order: {doc['same_order']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
