"""The stores (profiler.site.store): a directory written by many jobs at once
loses or tears no record; users read their own records and the store's group
reads all, by file modes (directory) and row-level security (a real
PostgreSQL server, Debian's postgresql, started here in a temporary folder);
filters reach SQL as parameters, hostile names included; a corrupted, partial
or newer record is skipped with one line, the rest kept."""

from __future__ import annotations

import multiprocessing
import os
import pwd
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from site_fixtures import PG_BIN, Postgres, as_user, base_record, shared_tmp, varied

from profiler.site.record import SCHEMA_VERSION, dumps
from profiler.site.store import DirStore, Filters, PgStore, StoreError, open_store

HOSTILE = "x'); DROP TABLE hvprof_job_records; --<script>alert(1)</script>"


def _put_one(args: tuple[str, dict[str, Any]]) -> str:
    store, rec = args
    return str(open_store(store).put(rec))


def test_directory_store_many_writers_at_once_lose_nothing(tmp_path: Path) -> None:
    """64 writers in parallel processes, 48 distinct jobs (16 written twice, as
    an exit and a later ingest would): every job there once, every file whole."""
    store = tmp_path / "store"
    store.mkdir()
    base = base_record()
    recs = [varied(base, i % 48) for i in range(64)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(16) as pool:
        pool.map(_put_one, [(str(store), r) for r in recs], chunksize=1)
    sel = DirStore(store).select()
    assert sel.skipped == []
    assert sorted(r["job"]["id"] for r in sel.records) == sorted({r["job"]["id"] for r in recs})
    assert len(sel.records) == 48
    assert [p.name for p in (store / pwd.getpwuid(os.geteuid()).pw_name).iterdir()
            if p.name.startswith(".")] == []  # no temporary file left


def test_directory_store_filters_and_bad_records(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    base = base_record()
    recs = [varied(base, 0, user="alice", name="resnet"),
            varied(base, 1, user="bob", name="bert", partition="cpu", framework="tensorflow"),
            varied(base, 2, user="alice", name=HOSTILE),
            varied(base, 3, user="bob", name="resnet")]
    for r in recs:
        store.put(r)
    me = tmp_path / pwd.getpwuid(os.geteuid()).pw_name
    (me / "cut.json").write_bytes(dumps(recs[0])[:300])
    (me / "newer.json").write_bytes(dumps({**recs[0], "schema_version": SCHEMA_VERSION + 1}))
    (me / "other.json").write_text('{"some": "document"}')

    def ids(**kw: Any) -> list[str]:
        return sorted(r["job"]["job_id"] for r in store.select(Filters(**kw)).records)

    sel = store.select()
    assert sorted(r["job"]["job_id"] for r in sel.records) == ["1000", "1001", "1002", "1003"]
    assert len(sel.skipped) == 3
    assert any(s.startswith(str(me / "cut.json")) and "partial or corrupted" in s
               for s in sel.skipped)
    assert any(str(me / "newer.json") in s and "newer than this reader's" in s
               for s in sel.skipped)
    assert ids(user="alice") == ["1000", "1002"]
    assert ids(name="resnet") == ["1000", "1003"]
    assert ids(name=HOSTILE) == ["1002"]
    assert ids(partition="cpu") == ["1001"] and ids(framework="tensorflow") == ["1001"]
    assert ids(since="2026-11-02T08:00:00+00:00") == ["1001", "1002", "1003"]
    assert ids(since="2026-11-02", until="2026-11-03T00:00:00+00:00") == ["1001"]


@pytest.mark.parametrize("compacted", [False, True])
def test_directory_store_ranks_the_top_in_sql_with_or_without_its_catalog(
        tmp_path: Path, compacted: bool) -> None:
    """`select(top=N)` gives the N records query.ranking puts first, and a
    compacted catalog changes no answer: records written, rewritten or
    removed after it, and corrupted files, read as without it."""
    from profiler.site import query

    store = DirStore(tmp_path)
    base = base_record()
    recs = [varied(base, i, user=("alice", "bob")[i % 2], name=f"job{i % 3}", hours=1 + i % 7,
                   hosts=1 + i % 3) for i in range(30)]
    recs[4]["node_hours_comm"] = recs[4]["node_hours_wait"] = None  # lost time unknown: last
    for r in recs:
        store.put(r)
    me = tmp_path / pwd.getpwuid(os.geteuid()).pw_name
    (me / "cut.json").write_bytes(dumps(recs[0])[:300])

    def answers() -> tuple[list[str], list[str], list[str], list[str]]:
        every = store.select()
        top = store.select(top=5)
        alice = store.select(Filters(user="alice"), top=3)
        return ([r["job"]["id"] for r in every.records],
                [r["id"] for r in query.ranking(top.records, 5)],
                [r["id"] for r in query.ranking(alice.records, 3)],
                sorted(every.skipped))

    plain = answers()
    assert plain[1] == [r["id"] for r in query.ranking(recs, 5)]
    assert plain[2] == [r["id"] for r in query.ranking(
        [r for r in recs if r["job"]["user"] == "alice"], 3)]
    assert len(plain[3]) == 1
    assert query.ranking(store.select(top=30).records)[-1]["id"] == recs[4]["job"]["id"]
    if not compacted:
        return
    n, path = store.compact()
    assert n == 30 and path == tmp_path / ".catalog.parquet"
    assert oct(os.stat(path).st_mode & 0o777) == "0o640"
    assert answers() == plain
    # after the catalog: one rewritten (now the costliest), one new, one removed
    recs[7]["node_hours_comm"] = 1e6
    time.sleep(0.01)
    store.put(recs[7])
    new = varied(base, 99, user="alice", name="late")
    store.put(new)
    gone = recs[9]
    (me / f"{gone['job']['id']}.json").unlink()
    ids = [r["job"]["id"] for r in store.select().records]
    assert new["job"]["id"] in ids and gone["job"]["id"] not in ids and len(ids) == 30
    assert store.select(top=1).records == [recs[7]]


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to other users (needs root)")
def test_directory_store_users_read_their_own_the_group_reads_all() -> None:
    """Store folder 3777 (setgid, sticky) of group G: nobody and a second user
    write; each reads only their own; a member of G reads both."""
    G = 4242
    users = [(65534, 65534), (pwd.getpwnam("postgres").pw_uid, 65534)]
    code = ("import sys; from pathlib import Path; from profiler.site.store import open_store; "
            "from profiler.site.record import loads; "
            "open_store(sys.argv[1]).put(loads(Path(sys.argv[2]).read_bytes()))")
    read = ("import sys; from profiler.site.store import open_store; "
            "print(sorted(r['job']['user'] for r in open_store(sys.argv[1]).select().records))")
    env: dict[str, str] = {}
    with shared_tmp() as tmp:
        store = tmp / "store"
        store.mkdir()
        os.chown(store, 0, G)
        os.chmod(store, 0o3777)
        for i, (uid, gid) in enumerate(users):
            rec = tmp / f"rec{i}.json"
            rec.write_bytes(dumps(varied(base_record(), i, user=f"u{i}")))
            os.chmod(rec, 0o644)
            p = as_user(uid, gid, [sys.executable, "-c", code, str(store), str(rec)], env)
            assert p.returncode == 0, p.stderr
        for i, (uid, gid) in enumerate(users):
            p = as_user(uid, gid, [sys.executable, "-c", read, str(store)], env)
            assert p.returncode == 0 and p.stdout.split() == [f"['u{i}']"], p.stderr
        p = as_user(1234, 1234, [sys.executable, "-c", read, str(store)], env, groups=(G,))
        assert p.stdout.split() == ["['u0',", "'u1']"], p.stderr
        # a member of G compacts: the catalog holds both users' records, yet even
        # made readable to all, each user reads from it only their own
        compact = ("import sys; from profiler.site.store import open_store; "
                   "print(open_store(sys.argv[1]).compact()[0])")
        p = as_user(1234, 1234, [sys.executable, "-c", compact, str(store)], env, groups=(G,))
        assert p.returncode == 0 and p.stdout.split() == ["2"], p.stderr
        os.chmod(store / ".catalog.parquet", 0o644)
        for i, (uid, gid) in enumerate(users):
            p = as_user(uid, gid, [sys.executable, "-c", read, str(store)], env)
            assert p.returncode == 0 and p.stdout.split() == [f"['u{i}']"], p.stderr
        os.unlink(store / ".catalog.parquet")
        modes = sorted(oct(os.stat(d).st_mode & 0o7777) for d in store.iterdir() if d.is_dir())
        assert modes == ["0o2750", "0o2750"]
        assert {os.stat(d).st_gid for d in store.iterdir()} == {G}


# ---------------------------------------------------------------- PostgreSQL

@pytest.fixture(scope="session")
def pg() -> Iterator[Postgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL 15's server is not installed: apt-get install postgresql")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root without a 'postgres' user to run the server as")
    server = Postgres()
    try:
        server.start()
        import psycopg

        with psycopg.connect(server.url("postgres"), autocommit=True) as con:
            for role in ("alice", "bob", "carol"):
                con.execute(f"CREATE ROLE {role} LOGIN")
        PgStore(server.url("postgres")).init()
        with psycopg.connect(server.url("postgres"), autocommit=True) as con:
            con.execute("GRANT hvprof_admin TO carol")
        yield server
    finally:
        server.stop()


def _pg_put(args: tuple[str, dict[str, Any]]) -> None:
    PgStore(args[0]).put(args[1])


def test_postgres_round_trip_concurrent_writers_and_row_level_security(pg: Postgres) -> None:
    base = base_record()
    alice = [varied(base, i, user="alice", name="resnet" if i % 2 else HOSTILE,
                    hours=1 + (i * 7) % 5) for i in range(24)]
    bob = [varied(base, 100 + i, user="bob", name="bert") for i in range(8)]
    work = ([(pg.url("alice"), r) for r in alice] + [(pg.url("bob"), r) for r in bob]
            + [(pg.url("alice"), r) for r in alice[:8]])  # written twice: stored once
    with multiprocessing.get_context("fork").Pool(16) as pool:
        pool.map(_pg_put, work, chunksize=1)
    a = PgStore(pg.url("alice")).select()
    assert a.skipped == [] and len(a.records) == 24
    # read back exactly as written
    assert {r["job"]["id"]: r for r in a.records} == {r["job"]["id"]: r for r in alice}
    assert len(PgStore(pg.url("bob")).select().records) == 8
    assert len(PgStore(pg.url("carol")).select().records) == 32  # the administrator
    assert len(PgStore(pg.url("carol")).select(Filters(name=HOSTILE)).records) == 12
    assert len(PgStore(pg.url("carol")).select(Filters(user="bob")).records) == 8
    assert len(PgStore(pg.url("carol")).select(
        Filters(since="2026-11-05", until="2026-11-07")).records) == 2
    # the ranking's first records, chosen in SQL, as query.ranking chooses them
    from profiler.site import query

    every = PgStore(pg.url("carol")).select().records
    top = PgStore(pg.url("carol")).select(Filters(user="alice"), top=4).records
    assert len(top) == 4 and [r["id"] for r in query.ranking(top)] == [
        r["id"] for r in query.ranking([r for r in every if r["job"]["user"] == "alice"], 4)]
    # the top N come from the ranking's index (the same expression as the
    # ORDER BY), not from reading every record: at 100,000 the difference
    # is seconds (docs/validation.md, the site store)
    import psycopg

    from profiler.site import store as site_store

    with psycopg.connect(pg.url("carol")) as con:
        con.execute("SET enable_seqscan = off")  # 32 rows: a scan would be cheaper
        plan = "\n".join(r[0] for r in con.execute(
            f"EXPLAIN SELECT id FROM {site_store.TABLE} {site_store._pg_order(4)}"))
    assert f"{site_store.TABLE}_lost" in plan, plan
    # bob may not overwrite alice's record, nor write one under her name
    with pytest.raises(StoreError, match="row-level security"):
        PgStore(pg.url("bob")).put(alice[0])
    assert len(PgStore(pg.url("carol")).select().records) == 32
    # a batch (jobs ingest) is one transaction: all of it or none
    more = [varied(base, 200 + i, user="bob", name="bert") for i in range(3)]
    with pytest.raises(StoreError, match="row-level security"):
        PgStore(pg.url("bob")).put_many([*more, alice[0]])
    assert len(PgStore(pg.url("carol")).select().records) == 32
    assert PgStore(pg.url("bob")).put_many(more) == 3
    assert len(PgStore(pg.url("carol")).select(Filters(user="bob")).records) == 11


def test_postgres_unreachable_is_one_line_and_quick(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from profiler.cli import main

    url = f"postgresql://u:secret@/db?host={tmp_path}"
    t = time.monotonic()
    with pytest.raises(StoreError) as exc:
        PgStore(url).select()
    assert time.monotonic() - t < 5
    assert "\n" not in str(exc.value) and "secret" not in str(exc.value)
    # ingest into it: one line for the store, not one per record
    assert main(["jobs", "ingest", str(tmp_path), "--store", url]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("profiler: error: store postgresql://***@/db")
