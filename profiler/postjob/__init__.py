"""The post-job stage: raw files -> the per-rank dataset
(convert) -> trace.json with its fusion inference and lineage (merge).  It
is idempotent: what is up to date is not done again.  One entry point for
the job's exit (atexit.main, started by rank 0's library) and one for a
later build (merge.merge, `profiler merge DIR`).  Nothing here runs inside
the job but the rank's own conversion at its exit (atexit.convert_rank);
nothing here imports the collection side (profiler.collect) or analysis."""
