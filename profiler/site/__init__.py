"""The site view: one small, versioned record per job, a store of them, and
`profiler jobs` across them (docs/guide/site.md).

* record: the job record (schema, identity from the scheduler's variables,
  figures from the analysis facade), made at exit by a child process that the
  post-job stage starts (`python -m profiler.site.record DIR`, bounded);
* store: where records go, HOROVOD_PROFILE_STORE: a directory (one file per
  job, written atomically; DuckDB queries the files in place) or PostgreSQL
  (psycopg 3, row-level security);
* query: listing, ranking by node-hours lost, regressions, interconnects;
* page: the offline HTML page over a store (the report's plotting).

A layer above analysis (pyproject.toml's contracts): the post-job stage never
imports it, it only starts it as a child process.  Nothing heavy at import.
"""
