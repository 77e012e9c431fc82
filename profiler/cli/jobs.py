"""`profiler jobs`: every job's record, across a site's store.

    profiler jobs list --user alice --since 2026-12-01
    profiler jobs rank --top 20           # node-hours lost to communication and waiting
    profiler jobs regressions             # each job name's latest run against its history
    profiler jobs regressions --by script # or each script's, whatever the jobs were named
    profiler jobs interconnects           # the same job's communication per interconnect
    profiler jobs html -o jobs.html       # an offline page over the store
    profiler jobs ingest DIR              # load records left beside profiles (DIR: any tree)
    profiler jobs init-db --store postgresql://...   # an administrator, once
    profiler jobs compact --store DIR     # fold a directory store into its catalog (cron)

The store is --store, else HOROVOD_PROFILE_STORE: a directory, or a
postgresql:// URL.  Filters (every query): --user, --name, --partition,
--framework, --since, --until (ISO 8601 dates or times, UTC).  A record of a
newer schema, or a corrupted or partial one, is skipped with one line naming
it; the rest are kept.  `rank --top N` ranks in the store's SQL and reads
only the N records it shows.  See docs/guide/site.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

QUERIES = ("list", "rank", "regressions", "interconnects", "html")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "jobs", help="every job's record across a site's store: list, rank by node-hours "
                     "lost, regressions, interconnects, an HTML page",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=(*QUERIES, "ingest", "init-db", "compact"), nargs="?",
                   default="list", help="what to do (default: list)")
    p.add_argument("paths", nargs="*", metavar="DIR",
                   help="ingest: profile directories, or trees holding them")
    p.add_argument("--store", default=None,
                   help="a directory or a postgresql:// URL (default: HOROVOD_PROFILE_STORE)")
    for name in ("user", "name", "partition", "framework"):
        p.add_argument(f"--{name}", default=None, help=f"only jobs of this {name}")
    p.add_argument("--since", default=None, help="only jobs that started at or after (ISO)")
    p.add_argument("--until", default=None, help="only jobs that started before (ISO)")
    p.add_argument("--top", type=int, default=None, help="rank: the first N jobs only")
    p.add_argument("--by", choices=("name", "script"), default="name",
                   help="regressions: a run against the history of its job name (default) "
                        "or of its script")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("-o", "--output", default=None, help="html: the page to write")
    return p


def _iso(text: str | None, what: str) -> str | None:
    from datetime import datetime, timezone

    from profiler.errors import UsageError

    if text is None:
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(None, f"{what} {text!r}: not an ISO 8601 date or time") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).isoformat(timespec="seconds")


def _store(args: argparse.Namespace) -> Any:
    from profiler._env import text
    from profiler.errors import UsageError
    from profiler.site.store import StoreError, open_store

    url = args.store if args.store is not None else (text("HOROVOD_PROFILE_STORE") or "")
    try:
        return open_store(url)
    except StoreError as exc:
        raise UsageError(None, str(exc)) from None


def _ingest(args: argparse.Namespace) -> int:
    from profiler.errors import UsageError
    from profiler.site.record import RECORD_NAME, RecordError, record_of
    from profiler.site.store import BATCH, StoreError

    if not args.paths:
        raise UsageError(None, "jobs ingest: name at least one DIR")
    store = _store(args)
    if hasattr(store, "connect"):  # a database that is down: one line, not one per record
        try:
            store.connect().close()
        except StoreError as exc:
            raise UsageError(None, str(exc)) from None
    found: list[Path] = []
    for top in args.paths:
        t = Path(top)
        if not t.is_dir():
            raise UsageError(top, "not a directory")
        for dirpath, dirnames, filenames in os.walk(t):
            dirnames[:] = sorted(d for d in dirnames if d not in ("raw", "ranks"))
            if RECORD_NAME in filenames or "trace.json" in filenames:
                found.append(Path(dirpath))
    loaded = failed = 0

    def warn(d: Path, what: str) -> None:
        nonlocal failed
        print(f"profiler: warning: {d}: {what}", file=sys.stderr)
        failed += 1

    # records read one by one, written in batches (a database: one connection
    # and transaction a batch); a batch the store refuses is written one by
    # one, so that one bad record names itself and costs only itself
    batch: list[tuple[Path, Any]] = []

    def flush() -> None:
        nonlocal loaded
        try:
            loaded += store.put_many([r for _, r in batch])
        except (RecordError, StoreError, OSError):
            for d, rec in batch:
                try:
                    store.put(rec)
                    loaded += 1
                except (RecordError, StoreError, OSError) as exc:
                    warn(d, f"{' '.join(str(exc).split())}: not loaded")
        batch.clear()

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar = Progress(TextColumn("profiler jobs ingest"), BarColumn(), MofNCompleteColumn(),
                   console=Console(stderr=True), transient=True,
                   disable=not sys.stderr.isatty() or len(found) < 50)
    with bar:
        task = bar.add_task("ingest", total=len(found))
        for d in found:
            try:
                batch.append((d, record_of(d)))
            except (RecordError, OSError) as exc:
                warn(d, f"{' '.join(str(exc).split())}: not loaded")
            except Exception as exc:  # a trace the analysis cannot read: one line, go on
                warn(d, f"no record: {' '.join(str(exc).split())[:200]}")
            if len(batch) >= BATCH:
                flush()
            bar.advance(task)
        flush()
    print(f"{loaded} job record(s) loaded into {store}" + (f", {failed} not" if failed else ""))
    return 0 if failed == 0 and loaded > 0 else 2


def _text(rows: list[dict[str, Any]], cols: list[str]) -> str:
    from profiler.errors import printable
    from profiler.units import fmt_number

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return fmt_number(v)
        if isinstance(v, list):
            return "; ".join(str(x) for x in v)
        return printable("" if v is None else str(v))

    table = [cols] + [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [min(max(len(row[i]) for row in table), 60) for i in range(len(cols))]
    return "\n".join("  ".join(v[:60].ljust(w) for v, w in zip(row, widths)).rstrip()
                     for row in table)


COLUMNS = {
    "list": ["start", "user", "name", "partition", "framework", "hosts", "ranks", "step_ms",
             "images_per_s", "interconnect", "id"],
    "rank": ["name", "user", "lost_node_hours", "comm_node_hours", "wait_node_hours",
             "node_hours", "finding", "id"],
    "regressions": ["name", "metric", "value", "history_mean", "interval", "changed", "id"],
    "interconnects": ["name", "interconnect", "runs", "ranks", "comm_ms", "step_ms",
                      "comm_share"],
}


def run(args: argparse.Namespace) -> int:
    from profiler.errors import UsageError
    from profiler.site import query
    from profiler.site.store import Filters, StoreError

    if args.action == "ingest":
        return _ingest(args)
    if args.paths:
        raise UsageError(None, f"jobs {args.action} takes no DIR")
    if args.top is not None and args.top < 1:
        raise UsageError(None, "--top: 1 or more")
    if args.action == "html" and not args.output:
        raise UsageError(None, "jobs html: name the page with -o PAGE")
    store = _store(args)
    try:
        if args.action == "init-db":
            if not hasattr(store, "init"):
                raise UsageError(None, "init-db: the store is a directory (create it with "
                                       "install -d, docs/guide/site.md)")
            store.init()
            print(f"store {store} ready")
            return 0
        if args.action == "compact":
            if not hasattr(store, "compact"):
                raise UsageError(None, "compact: the store is PostgreSQL, which needs none")
            n, path = store.compact()
            print(f"{path}: {n} job record(s)")
            return 0
        flt = Filters(user=args.user, name=args.name, partition=args.partition,
                      framework=args.framework, since=_iso(args.since, "--since"),
                      until=_iso(args.until, "--until"))
        sel = store.select(flt, top=args.top if args.action == "rank" else None)
    except StoreError as exc:
        raise UsageError(None, str(exc)) from None
    for line in sel.skipped:
        print(f"profiler: warning: {line}", file=sys.stderr)
    if args.action == "html":
        from profiler.site.page import write_page

        path = write_page(sel.records, args.output, sel.skipped)
        print(f"{path}: {len(sel.records)} job record(s)")
        return 0
    rows = {"list": query.listing, "rank": lambda r: query.ranking(r, args.top),
            "regressions": lambda r: query.regressions(r, args.by),
            "interconnects": query.interconnects}[args.action](sel.records)
    if args.format == "json":
        import orjson

        sys.stdout.buffer.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2) + b"\n")
    elif rows:
        cols = COLUMNS[args.action]
        if args.action == "regressions" and args.by != "name":
            cols = [args.by if c == "name" else c for c in cols]
        print(_text(rows, cols))
    else:
        print(f"no {'regression' if args.action == 'regressions' else 'job'} found "
              f"({len(sel.records)} record(s) read)")
    return 0
