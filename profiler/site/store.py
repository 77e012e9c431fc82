"""Where job records go: HOROVOD_PROFILE_STORE (docs/guide/site.md).

* a directory (the embedded default): STORE/<writer>/<record id>.json, one
  file per job, written atomically (a temporary file renamed over: many jobs
  at once, on a shared file system, lose or tear nothing); DuckDB reads the
  files in place (read_text over the files this user may read) and filters
  them in SQL, with parameters.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .schema import RecordError, check, dumps, loads, write_atomic

TABLE = "hvprof_job_records"
ADMIN_ROLE = "hvprof_admin"
CONNECT_TIMEOUT_S = 5


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

    def files(self) -> list[str]:
        """The record files this user may read (another user's folder is simply
        not visible to one who is not in the store's group)."""
        out: list[str] = []
        try:
            writers = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            raise StoreError(f"store {self.root}: no such directory") from None
        for w in writers:
            if not w.is_dir(follow_symlinks=False) or w.name.startswith("."):
                continue
            try:
                names = sorted(e.name for e in os.scandir(w.path))
            except PermissionError:
                continue
            out.extend(os.path.join(w.path, n) for n in names
                       if n.endswith(".json") and not n.startswith(".")
                       and os.access(os.path.join(w.path, n), os.R_OK))
        return out

    def select(self, flt: Filters | None = None) -> Selection:
        import duckdb

        flt = flt or Filters()
        files = self.files()
        sel = Selection()
        if not files:
            return sel
        conds, params = _conditions(flt, lambda path: f"json_extract_string(doc, '$.{path}')")
        where = (" AND ".join(conds)) if conds else "TRUE"
        sql = ("WITH f AS MATERIALIZED (SELECT filename, content::VARCHAR AS content, "
               "json_valid(content) AS ok FROM read_text(?)), "
               "g AS (SELECT filename, ok, content, CASE WHEN ok THEN content END AS doc FROM f) "
               f"SELECT filename, ok, content FROM g WHERE NOT ok OR ({where}) ORDER BY filename")
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")  # stdout is the command's
        try:
            rows = con.execute(sql, [files, *params]).fetchall()
        finally:
            con.close()
        for filename, ok, content in rows:
            _keep(sel, filename, content if ok else None)
        return sel


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
        import psycopg

        check(dict(rec))
        job, v = rec["job"], rec["versions"]
        with self.connect() as con:
            try:
                con.execute(
                    f"INSERT INTO {TABLE} (id, job_user, name, partition, framework, start, "
                    "schema_version, record) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb) "
                    "ON CONFLICT (id) DO UPDATE SET job_user = EXCLUDED.job_user, "
                    "name = EXCLUDED.name, partition = EXCLUDED.partition, "
                    "framework = EXCLUDED.framework, start = EXCLUDED.start, "
                    "schema_version = EXCLUDED.schema_version, record = EXCLUDED.record, "
                    "written = now()",
                    (job["id"], job["user"], job["name"], job.get("partition", ""),
                     v.get("framework", ""), rec["start"], rec["schema_version"],
                     dumps(rec).decode()))
            except psycopg.Error as exc:
                raise StoreError(f"store {self}: {_pg_line(exc)}") from None

    def select(self, flt: Filters | None = None) -> Selection:
        import psycopg

        flt = flt or Filters()
        cols = {"job.user": "job_user", "job.name": "name", "job.partition": "partition",
                "versions.framework": "framework", "start": "start"}
        conds, params = _conditions(flt, lambda path: cols[path], "%s", "%s::timestamptz")
        where = " AND ".join(conds) or "TRUE"
        sel = Selection()
        with self.connect() as con:
            try:
                rows = con.execute(f"SELECT id, record::text FROM {TABLE} WHERE {where} "
                                   "ORDER BY start, id", params).fetchall()
            except psycopg.Error as exc:
                raise StoreError(f"store {self}: {_pg_line(exc)}") from None
        for rid, doc in rows:
            _keep(sel, f"{self} record {rid}", doc)
        return sel


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
