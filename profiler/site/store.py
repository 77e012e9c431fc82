"""Where job records go: HOROVOD_PROFILE_STORE (docs/guide/site.md).

* a directory (the embedded default): STORE/<writer>/<record id>.json, one
  file per job, written atomically (a temporary file renamed over: many jobs
  at once, on a shared file system, lose or tear nothing); DuckDB reads the
  files in place (read_text over the files this user may read) and filters
  them in SQL, with parameters.  `profiler jobs compact` (from cron, say)
  folds them into STORE/.catalog.parquet (the query columns and each
  record's text, one row a file, written atomically, mode 640): a query
  reads the catalog's rows of the files this user may read whose
  modification time it holds, and reads only the other files themselves, so
  a catalog never shows a record its reader may not read, nor an old one.
  Access by file modes: each writer's folder is 750 and its records 640, and
  both take the store's group (the administrators) from the store's setgid
  folder (which a 3777 store gives every folder in it), so the writer reads
  its own and the group reads all; nobody else does.
* postgresql://... (psycopg 3): one table, row-level security: a role reads
  and writes its own rows (owner = current_user), members of hvprof_admin
  read all.  `profiler jobs init-db --store URL` creates it (an
  administrator, once).

Every value reaches SQL as a parameter, never as text of the query.
Faults (unreachable server, full disk, read-only store) raise StoreError or
OSError; the record's writer turns them into one line (record.record_job).
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .schema import RecordError, check, dumps, loads, lost_node_hours, write_atomic

TABLE = "hvprof_job_records"
ADMIN_ROLE = "hvprof_admin"
CONNECT_TIMEOUT_S = 5


#: records a database store takes in one connection and transaction (put_many's
#: batches in `profiler jobs ingest`)
BATCH = 500


CATALOG = ".catalog.parquet"
#: node-hours lost (the ranking's order, query.ranking) from a record's JSON
#: text in DuckDB (`{doc}`): communication and waiting, NULL when neither is
#: known
#: (schema.lost_node_hours, in SQL)
LOST_SQL = ("CASE WHEN json_extract_string({doc}, '$.node_hours_comm') IS NULL AND "
            "json_extract_string({doc}, '$.node_hours_wait') IS NULL THEN NULL ELSE "
            "coalesce(TRY_CAST(json_extract_string({doc}, '$.node_hours_comm') AS DOUBLE), 0) "
            "+ coalesce(TRY_CAST(json_extract_string({doc}, '$.node_hours_wait') AS DOUBLE), 0) "
            "END")


class StoreError(Exception):
    """The store cannot be used: one line."""


@dataclass
class Filters:
    """What `profiler jobs` selects: exact user, name, partition and framework;
    start time from `since` to `until` (ISO 8601, UTC)."""

    user: str | None = None
    name: str | None = None
    partition: str | None = None
    framework: str | None = None
    since: str | None = None
    until: str | None = None


@dataclass
class Selection:
    """The records a query found, and one line per record skipped."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _writer() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _file_name(rec: Mapping[str, Any]) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(rec["job"]["id"]))[:200] + ".json"


class DirStore:
    """The embedded store: a directory of record files (module doc)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __str__(self) -> str:
        return str(self.root)

    def put(self, rec: Mapping[str, Any]) -> Path:
        check(dict(rec))
        if not self.root.is_dir():
            raise StoreError(f"store {self.root}: no such directory (an administrator "
                             "creates it: docs/guide/site.md)")
        mine = self.root / _writer()
        # The modes come from mkdir and open under this umask, never from chmod:
        # a writer outside the store's group may not set the setgid bit, and
        # chmod would clear the one mkdir inherits from the store's folder.
        old = os.umask(0o027)
        try:
            try:
                os.mkdir(mine, 0o750)
            except FileExistsError:
                st = os.lstat(mine)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                    raise StoreError(f"store {mine}: not a folder of this user's") from None
            path = mine / _file_name(rec)
            write_atomic(path, dumps(rec), 0o640)
        finally:
            os.umask(old)
        return path

    def put_many(self, recs: Sequence[Mapping[str, Any]]) -> int:
        """put() each record (a file each: atomic one by one); how many."""
        for rec in recs:
            self.put(rec)
        return len(recs)

    def files(self) -> list[str]:
        """The record files this user may read (another user's folder is simply
        not visible to one who is not in the store's group), by name."""
        return sorted(f for f, _ in self._files())

    def _files(self) -> list[tuple[str, int]]:
        """files(), each with its modification time (ns).  A file in the
        reader's own folder (put writes it 640) or read by root is not asked
        os.access: at 100,000 records that is a quarter of a query."""
        out: list[tuple[str, int]] = []
        me = os.geteuid()
        try:
            writers = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            raise StoreError(f"store {self.root}: no such directory") from None
        for w in writers:
            if not w.is_dir(follow_symlinks=False) or w.name.startswith("."):
                continue
            try:
                own = me == 0 or w.stat(follow_symlinks=False).st_uid == me
                entries = os.scandir(w.path)  # unsorted: the queries order by name
            except (PermissionError, FileNotFoundError):
                continue
            for e in entries:
                if not e.name.endswith(".json") or e.name.startswith("."):
                    continue
                try:
                    if not own and not os.access(e.path, os.R_OK):
                        continue
                    out.append((e.path, e.stat(follow_symlinks=False).st_mtime_ns))
                except FileNotFoundError:  # replaced or removed while listed
                    continue
        return out

    def _catalog(self) -> Path | None:
        path = self.root / CATALOG
        return path if path.is_file() and os.access(path, os.R_OK) else None

    def compact(self) -> tuple[int, Path]:
        """Fold the records this user may read into the catalog (module doc):
        every record a row, written whole or not at all; returns how many
        and where.  An administrator's catalog holds every record; anyone
        reads from it only the rows of files they may read themselves."""
        import duckdb

        files = self._files()
        path = self.root / CATALOG
        tmp = self.root / f".catalog.{os.getpid()}.tmp.parquet"
        con = _connect(duckdb, files)
        old = os.umask(0o027)
        try:
            docs = ("SELECT filename, content::VARCHAR AS doc FROM read_text(?) "
                    "WHERE json_valid(content)") if files else \
                "SELECT NULL::VARCHAR AS filename, NULL::VARCHAR AS doc WHERE FALSE"
            con.execute(
                f"COPY (SELECT d.filename, c.mtime_ns, {_columns('d.doc')}, d.doc "
                f"FROM ({docs}) d JOIN cur c USING (filename) ORDER BY d.filename) "
                f"TO '{_sql_path(tmp)}' (FORMAT parquet)",
                [[f for f, _ in files]] if files else [])
            got = con.execute(f"SELECT count(*) FROM '{_sql_path(tmp)}'").fetchone()
            n = int(got[0]) if got else 0
            os.replace(tmp, path)
        except (duckdb.Error, OSError) as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"store {self.root}: cannot write its catalog: "
                             f"{' '.join(str(exc).split())[:200]}") from None
        finally:
            os.umask(old)
            con.close()
        return n, path

    def select(self, flt: Filters | None = None, top: int | None = None) -> Selection:
        """The records this user may read that pass `flt`, by file name; with
        `top`, only the first `top` by node-hours lost (query.ranking's order).
        The filters and the ranking run on the catalog's columns and on the
        newer files' extracted ones; only the chosen records' text is read
        out and parsed."""
        import duckdb

        flt = flt or Filters()
        files = self._files()
        sel = Selection()
        if not files:
            return sel
        names = {"job.user": "job_user", "job.name": "name", "job.partition": "partition",
                 "versions.framework": "framework", "start": "start"}
        conds, params = _conditions(flt, lambda path: names[path])
        where = (" AND ".join(conds)) if conds else "TRUE"
        con = _connect(duckdb, files)
        try:
            catalog = self._catalog()
            if catalog is not None:  # its rows of files unchanged since, and the rest
                con.execute(f"CREATE VIEW k AS SELECT * FROM '{_sql_path(catalog)}'")
                con.execute("CREATE TABLE cat AS SELECT k.* EXCLUDE (doc, mtime_ns), "
                            "TRUE AS in_catalog FROM k "
                            "JOIN cur c ON k.filename = c.filename AND k.mtime_ns = c.mtime_ns")
                fresh = [r[0] for r in con.execute(
                    "SELECT filename FROM cur ANTI JOIN cat USING (filename)").fetchall()]
            else:
                con.execute(f"CREATE TABLE cat AS SELECT NULL::VARCHAR AS filename, "
                            f"{_columns('NULL::VARCHAR')}, TRUE AS in_catalog WHERE FALSE")
                fresh = [f for f, _ in files]
            # the newer files' columns only (orjson, a file at a time: DuckDB's
            # JSON functions over read_text held every text at once, GBs at
            # 100,000 records); their text is read again for the chosen
            cols = _fresh_columns(fresh)
            con.execute("CREATE TABLE new AS SELECT " + ", ".join(
                f"unnest(?::{t}[]) AS {c}" for c, t in FRESH_COLUMNS), [cols[c] for c, _ in
                                                                        FRESH_COLUMNS])
            # the ranking's order (query.ranking sorts what comes back again)
            order = (f"ORDER BY lost IS NULL, lost DESC, id LIMIT {int(top)}" if top else "")
            con.execute(
                "CREATE TABLE chosen AS SELECT filename, in_catalog FROM (SELECT * FROM cat "
                "UNION ALL BY NAME SELECT * EXCLUDE (ok), FALSE AS in_catalog FROM new WHERE ok) "
                f"WHERE {where} {order}", params)
            reread = [r[0] for r in con.execute(
                "SELECT filename FROM chosen WHERE NOT in_catalog").fetchall()]
            parts = ["SELECT filename, FALSE AS ok, NULL::VARCHAR AS doc FROM new WHERE NOT ok"]
            if catalog is not None:
                parts.append("SELECT c.filename, TRUE, k.doc FROM chosen c JOIN k "
                             "USING (filename) WHERE c.in_catalog")
            if reread:
                parts.append("SELECT filename, TRUE, content::VARCHAR FROM read_text(?)")
            rows = con.execute("SELECT * FROM (" + " UNION ALL ".join(parts) + ") ORDER BY 1",
                               [reread] if reread else []).fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"store {self.root}: {' '.join(str(exc).split())[:200]}") from None
        finally:
            con.close()
        for filename, ok, content in rows:
            _keep(sel, filename, content if ok else None)
        return sel


#: the catalog's query columns (_columns), as _fresh_columns gives them
FRESH_COLUMNS = (("filename", "VARCHAR"), ("ok", "BOOLEAN"), ("id", "VARCHAR"),
                 ("job_user", "VARCHAR"), ("name", "VARCHAR"), ("partition", "VARCHAR"),
                 ("framework", "VARCHAR"), ("start", "VARCHAR"), ("lost", "DOUBLE"))


def _fresh_columns(paths: list[str]) -> dict[str, list[Any]]:
    """_columns of each file read and parsed in turn (ok: it is a JSON object);
    a file removed since it was listed is left out."""
    import orjson


    out: dict[str, list[Any]] = {c: [] for c, _ in FRESH_COLUMNS}

    def text(v: Any) -> str | None:
        return None if v is None else v if isinstance(v, str) else orjson.dumps(v).decode()

    for path in paths:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            continue
        try:
            d = orjson.loads(data)
        except ValueError:
            d = None
        ok = isinstance(d, dict)
        rec: dict[str, Any] = d if isinstance(d, dict) else {}
        job, ver = rec.get("job"), rec.get("versions")
        job = job if isinstance(job, dict) else {}
        ver = ver if isinstance(ver, dict) else {}
        for c, v in (("filename", path), ("ok", ok), ("id", text(job.get("id"))),
                     ("job_user", text(job.get("user"))), ("name", text(job.get("name"))),
                     ("partition", text(job.get("partition"))),
                     ("framework", text(ver.get("framework"))), ("start", text(rec.get("start"))),
                     ("lost", lost_node_hours(rec) if ok else None)):
            out[c].append(v)
    return out


def _connect(duckdb: Any, files: list[tuple[str, int]]) -> Any:
    """A DuckDB connection holding `cur`: the files listed, with their times."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # stdout is the command's
    con.execute("CREATE TABLE cur AS SELECT unnest(?::VARCHAR[]) AS filename, "
                "unnest(?::BIGINT[]) AS mtime_ns",
                [[f for f, _ in files], [m for _, m in files]])
    return con


def _columns(doc: str) -> str:
    """The catalog's query columns, from a record's JSON text (`doc`)."""
    j = "json_extract_string"
    return (f"{j}({doc}, '$.job.id') AS id, {j}({doc}, '$.job.user') AS job_user, "
            f"{j}({doc}, '$.job.name') AS name, {j}({doc}, '$.job.partition') AS partition, "
            f"{j}({doc}, '$.versions.framework') AS framework, {j}({doc}, '$.start') AS start, "
            f"{LOST_SQL.format(doc=doc)} AS lost")


def _sql_path(p: Path) -> str:
    """A path as a DuckDB string literal (COPY's target cannot be a parameter)."""
    return str(p).replace("'", "''")


def _conditions(flt: Filters, col: Any, ph: str = "?",
                time_ph: str = "?") -> tuple[list[str], list[Any]]:
    """SQL conditions with placeholders, and their parameters (never text in SQL)."""
    conds: list[str] = []
    params: list[Any] = []
    for value, path in ((flt.user, "job.user"), (flt.name, "job.name"),
                        (flt.partition, "job.partition"), (flt.framework, "versions.framework")):
        if value is not None:
            conds.append(f"{col(path)} = {ph}")
            params.append(value)
    if flt.since is not None:
        conds.append(f"{col('start')} >= {time_ph}")
        params.append(flt.since)
    if flt.until is not None:
        conds.append(f"{col('start')} < {time_ph}")
        params.append(flt.until)
    return conds, params


def _keep(sel: Selection, where: str, doc: str | None) -> None:
    """The record `doc` into the selection, or one line naming why it is skipped."""
    if doc is None:
        sel.skipped.append(f"{where}: not JSON: partial or corrupted, skipped")
        return
    try:
        sel.records.append(loads(doc, where))
    except RecordError as exc:
        sel.skipped.append(f"{exc}, skipped")


class PgStore:
    """The store at scale: PostgreSQL (module doc)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __str__(self) -> str:
        return re.sub(r"://[^@/]*@", "://***@", self.url)  # never print a password

    def connect(self) -> Any:
        try:
            import psycopg
        except ImportError:
            raise StoreError("a postgresql:// store needs psycopg 3 (pip install "
                             "'psycopg[binary]')") from None
        try:
            return psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise StoreError(f"store {self}: {_pg_line(exc)}") from None

    def init(self) -> None:
        """The table, its row-level security and the administrators' role
        (run once, by a role that may create them)."""
        import psycopg

        stmts = [
            f"CREATE TABLE IF NOT EXISTS {TABLE} (id text PRIMARY KEY, "
            "owner name NOT NULL DEFAULT current_user, job_user text, name text, "
            "partition text, framework text, start timestamptz, schema_version int, "
            "written timestamptz NOT NULL DEFAULT now(), record jsonb NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {TABLE}_name_start ON {TABLE} (name, start)",
            f"CREATE INDEX IF NOT EXISTS {TABLE}_user_start ON {TABLE} (job_user, start)",
            # the ranking's order: its top N read from the index, not every record
            f"CREATE INDEX IF NOT EXISTS {TABLE}_lost ON {TABLE} (({_LOST}) DESC NULLS LAST, id)",
            f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY",
            f"ALTER TABLE {TABLE} FORCE ROW LEVEL SECURITY",
            f"DROP POLICY IF EXISTS own_rows ON {TABLE}",
            f"CREATE POLICY own_rows ON {TABLE} USING (owner = current_user OR "
            f"pg_has_role(current_user, '{ADMIN_ROLE}', 'MEMBER')) "
            "WITH CHECK (owner = current_user)",
            f"GRANT SELECT, INSERT, UPDATE ON {TABLE} TO PUBLIC",
        ]
        with self.connect() as con:
            try:
                con.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = "
                            f"'{ADMIN_ROLE}') THEN CREATE ROLE {ADMIN_ROLE} NOLOGIN; END IF; "
                            "END $$")
                for s in stmts:
                    con.execute(s)
            except psycopg.Error as exc:
                raise StoreError(f"store {self}: {_pg_line(exc)}") from None

    def put(self, rec: Mapping[str, Any]) -> None:
        self.put_many([rec])

    def put_many(self, recs: Sequence[Mapping[str, Any]]) -> int:
        """Insert or replace the records in one connection and one
        transaction (all or none: a batch that fails leaves the table as it
        was); how many.  `profiler jobs ingest` loads a folder of records
        this way: a connection each costs more than the row."""
        import psycopg

        rows = []
        for rec in recs:
            check(dict(rec))
            job, v = rec["job"], rec["versions"]
            rows.append((job["id"], job["user"], job["name"], job.get("partition", ""),
                         v.get("framework", ""), rec["start"], rec["schema_version"],
                         dumps(rec).decode()))
        if not rows:
            return 0
        with self.connect() as con:
            try:
                with con.cursor() as cur:
                    cur.executemany(
                        f"INSERT INTO {TABLE} (id, job_user, name, partition, framework, "
                        "start, schema_version, record) VALUES (%s, %s, %s, %s, %s, %s, %s, "
                        "%s::jsonb) ON CONFLICT (id) DO UPDATE SET job_user = "
                        "EXCLUDED.job_user, name = EXCLUDED.name, partition = "
                        "EXCLUDED.partition, framework = EXCLUDED.framework, start = "
                        "EXCLUDED.start, schema_version = EXCLUDED.schema_version, record = "
                        "EXCLUDED.record, written = now()", rows)
            except psycopg.Error as exc:
                raise StoreError(f"store {self}: {_pg_line(exc)}") from None
        return len(rows)

    def select(self, flt: Filters | None = None, top: int | None = None) -> Selection:
        """As DirStore.select: with `top`, the first `top` by node-hours lost."""
        import psycopg

        flt = flt or Filters()
        cols = {"job.user": "job_user", "job.name": "name", "job.partition": "partition",
                "versions.framework": "framework", "start": "start"}
        conds, params = _conditions(flt, lambda path: cols[path], "%s", "%s::timestamptz")
        where = " AND ".join(conds) or "TRUE"
        sel = Selection()
        with self.connect() as con:
            try:
                order = _pg_order(top)
                rows = con.execute(f"SELECT id, record::text FROM {TABLE} WHERE {where} "
                                   f"{order}", params).fetchall()
            except psycopg.Error as exc:
                raise StoreError(f"store {self}: {_pg_line(exc)}") from None
        for rid, doc in rows:
            _keep(sel, f"{self} record {rid}", doc)
        return sel


#: Node-hours lost (communication and waiting; NULL when the record has
#: neither): the ranking's key, written once for its index and its ORDER BY,
#: which PostgreSQL matches by expression.
_LOST = ("CASE WHEN record->'node_hours_comm' IS NULL AND record->'node_hours_wait' IS NULL "
         "THEN NULL ELSE coalesce((record->>'node_hours_comm')::float8, 0) + "
         "coalesce((record->>'node_hours_wait')::float8, 0) END")


def _pg_order(top: int | None) -> str:
    """PgStore.select's ORDER BY: with `top`, node-hours lost, the most first,
    records without the figure last (the order query.ranking gives)."""
    if top:
        return f"ORDER BY ({_LOST}) DESC NULLS LAST, id LIMIT {int(top)}"
    return "ORDER BY start, id"


def _pg_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def open_store(url: str) -> DirStore | PgStore:
    """The store `url` names: postgresql:// (or postgres://) or a directory."""
    if not url:
        raise StoreError("no store: name one with --store or HOROVOD_PROFILE_STORE")
    if url.startswith(("postgresql://", "postgres://")):
        return PgStore(url)
    if url.startswith("file://"):
        url = url[len("file://"):]
    return DirStore(url)
