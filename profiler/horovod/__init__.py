"""Horovod awareness: control vs data classification (classify), Horovod's own
timeline (timeline) and the join of both into fusion lineage (lineage)."""
