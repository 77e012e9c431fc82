"""How long `profiler jobs` takes over a store of N job records (issue 48).

    .venv/bin/python benchmarks/site_store.py --records 10000 --store /tmp/hvprof-store

Writes N copies of the committed fixture's record (tests/data/analysis/fused),
varied (50 job names, 20 users, one start every ~15 minutes), straight into
a directory store's layout (no fsync: the writers are not what is timed),
then times reading and checking every record (DirStore.select), one filter
(--user), the ranking over every record (query.ranking), and the ranking's
top 20 chosen in SQL (select(top=20), what `profiler jobs rank --top 20`
runs) before and after `compact` (whose time it prints too), and prints
the peak memory (--skip-full leaves out reading every record).
With --postgres URL the same records go into that PostgreSQL store first
(PgStore.put_many in batches of BATCH, as `profiler jobs ingest`
loads a folder; its time is printed), and the same queries run there;
--postgres auto starts a throwaway server of Debian's PostgreSQL 15 (fsync
off) for the run.  Figures go to docs/validation.md with this command;
never timed in a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from site_fixtures import Postgres, base_record, varied  # noqa: E402

from profiler.site import query  # noqa: E402
from profiler.site.schema import dumps  # noqa: E402
from profiler.site.store import BATCH, DirStore, Filters, PgStore  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--store", default="/tmp/hvprof-site-bench")
    ap.add_argument("--postgres", default=None, help="also a PostgreSQL store at this URL")
    ap.add_argument("--skip-full", action="store_true",
                    help="time only the top-20 ranking (and compaction), not reading all")
    a = ap.parse_args()
    base = base_record()
    recs = []
    for i in range(a.records):
        r = varied(base, i % 1000, name=f"job{i % 50}", user=f"u{i % 20}", day=i / 100)
        r["job"]["id"] = f"slurm-{i}"
        recs.append(r)
    shutil.rmtree(a.store, ignore_errors=True)
    mine = Path(a.store) / "bench"
    mine.mkdir(parents=True)
    for r in recs:
        (mine / f"{r['job']['id']}.json").write_bytes(dumps(r))
    stores: list[tuple[str, DirStore | PgStore]] = [("directory", DirStore(a.store))]
    server = None
    if a.postgres == "auto":
        server = Postgres()
        server.start()
        a.postgres = server.url("postgres")
    try:
        if a.postgres:
            pg = PgStore(a.postgres)
            pg.init()
            t = time.perf_counter()
            for i in range(0, len(recs), BATCH):
                pg.put_many(recs[i:i + BATCH])
            print(f"postgres: {a.records} records in batches of {BATCH}: "
                  f"{time.perf_counter() - t:.1f} s")
            stores.append(("postgres", pg))
        _queries(a, stores)
    finally:
        if server is not None:
            server.stop()
    print(f"peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB "
          f"(pid {os.getpid()})")
    return 0


def _queries(a: argparse.Namespace, stores: list[tuple[str, DirStore | PgStore]]) -> None:
    def top20(st: DirStore | PgStore) -> str:
        t = time.perf_counter()
        rows = query.ranking(st.select(top=20).records, 20)
        return f"{time.perf_counter() - t:.2f} s ({len(rows)} rows)"

    for label, st in stores:
        if not a.skip_full:
            t = time.perf_counter()
            sel = st.select()
            t_sel = time.perf_counter() - t
            t = time.perf_counter()
            query.ranking(sel.records, 20)
            t_rank = time.perf_counter() - t
            t = time.perf_counter()
            one = st.select(Filters(user="u3"))
            t_user = time.perf_counter() - t
            print(f"{label}: {len(sel.records)} records: read and check {t_sel:.2f} s, rank "
                  f"{t_rank:.3f} s; --user u3 ({len(one.records)}) {t_user:.2f} s")
        print(f"{label}: rank --top 20 in SQL: {top20(st)}")
        if isinstance(st, DirStore):
            t = time.perf_counter()
            n, _ = st.compact()
            print(f"{label}: compact {n} records: {time.perf_counter() - t:.2f} s")
            print(f"{label}: rank --top 20 over the catalog: {top20(st)}, again {top20(st)}")


if __name__ == "__main__":
    sys.exit(main())
