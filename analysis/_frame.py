"""Helpers shared by the analysis modules (sizes, model, imbalance, throughput,
compare, figures, report): column checks, call selection, size arithmetic.

Selection conventions used throughout:

* a *communication call* is a row whose backend is not ``app`` and whose op is
  not ``init``/``finalize``;
* NCCL rows with ``device`` set are device-time twins of a host row: they are
  left out of call counts (one call = one host row) but are the better latency
  source (see :func:`timed_calls`);
* ``kind`` (data/control/app) is optional; when absent every call is data;
* ``label`` (several traces loaded at once) is optional; when absent the frame
  is one trace and results carry no label column.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from profiler.errors import UsageError
from profiler.formats.record import LIFECYCLE_OPS
from profiler.units import fmt_bytes as fmt_bytes  # re-exported: sizes read the same everywhere

#: Rows that are no communication call (profiler.formats.record, defined once).
NON_CALL_OPS = tuple(sorted(LIFECYCLE_OPS))
KIB = 1024


def require(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raise UsageError when `df` lacks a column `what` needs."""
    if not isinstance(df, pd.DataFrame):
        raise UsageError(None, f"{what}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise UsageError(None, f"{what}: the frame lacks column(s) {', '.join(missing)}")


def label_keys(df: pd.DataFrame) -> list[str]:
    """["label"] when the frame holds several labelled traces, else []."""
    return ["label"] if "label" in df.columns else []


def as_list(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


def isin(col: pd.Series, values: Iterable[str]) -> np.ndarray:
    """Boolean mask: the column's value (as text) is one of `values`.  Categorical
    columns are tested through their categories, never converting every row."""
    vals = [str(v) for v in values]
    if isinstance(col.dtype, pd.CategoricalDtype):
        hit = np.isin(np.asarray(col.cat.categories.astype(str)), vals)
        # code -1 (missing) indexes the appended False
        return np.append(hit, False)[col.cat.codes.to_numpy()]
    return col.astype(str).isin(vals).to_numpy()


def keys_of(col: pd.Series) -> pd.Categorical:
    """The column as a Categorical grouping key (categoricals as they are, others
    converted once): groupby on it never materializes a string per row."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.array  # type: ignore[return-value]
    return pd.Categorical(col.astype(str))


def distinct(col: pd.Series) -> list[str]:
    """Distinct values as text, in order of first appearance."""
    return [str(v) for v in pd.unique(col)]


def call_mask(
    df: pd.DataFrame,
    *,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    device: bool = False,
) -> np.ndarray:
    """Boolean mask of the rows :func:`calls` keeps (same arguments)."""
    require(df, ["backend", "op", "bytes", "dur_ns"], "calls")
    mask = ~isin(df["backend"], ["app"])
    mask = mask & ~isin(df["op"], NON_CALL_OPS)
    if "device" in df.columns:
        dev = df["device"].to_numpy(dtype=bool)
        mask = mask & (dev if device else ~dev)
    elif device:
        mask = mask & False
    kinds_l = as_list(kinds)
    if kinds_l is not None and "kind" in df.columns:
        mask = mask & isin(df["kind"], kinds_l)
    ops_l = as_list(ops)
    if ops_l is not None:
        mask = mask & isin(df["op"], ops_l)
    return mask


def take(df: pd.DataFrame, mask: np.ndarray | None,
         columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The rows of `mask` (None: all), only `columns` of them when given (those
    the frame has): a row selection copies every column it keeps, so callers that
    read a few columns of a wide frame name them."""
    cols = None if columns is None else [c for c in dict.fromkeys(columns) if c in df.columns]
    if mask is None or mask.all():
        return df if cols is None else df[cols]
    return df.loc[mask] if cols is None else df.loc[mask, cols]


def calls(
    df: pd.DataFrame,
    *,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    device: bool = False,
    columns: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Communication calls, one row per call per rank.

    kinds: keep these kinds (None = all); ignored when the frame has no kind column.
    ops: keep these ops (None = all communication ops).  device: keep NCCL
    device-time rows instead of host rows.  columns: keep only these columns
    (those the frame has; all when None).
    """
    return take(df, call_mask(df, kinds=kinds, ops=ops, device=device), columns)


def timed_calls(
    df: pd.DataFrame,
    *,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Calls whose dur_ns is the best latency estimate: NCCL device-time rows for ops
    that have them (ncclAllReduce returns after enqueueing), host rows otherwise.
    columns: as in :func:`calls` (op is kept)."""
    if columns is not None:
        columns = [*columns, "op"]
    host = calls(df, kinds=kinds, ops=ops, device=False, columns=columns)
    if "device" not in df.columns or not df["device"].any():
        return host
    dev = calls(df, kinds=kinds, ops=ops, device=True, columns=columns)
    dev_ops = {str(o) for o in pd.unique(dev["op"])}
    return pd.concat([host.loc[~isin(host["op"], dev_ops)], dev], ignore_index=False)


def lowest_rank_view(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the lowest rank present in each label (the paper's one-rank view)."""
    if df.empty:
        return df
    keys = label_keys(df)
    if not keys:
        return df.loc[df["rank"] == df["rank"].min()]
    first = df.groupby(keys, observed=True)["rank"].transform("min")
    return df.loc[df["rank"] == first]


def is_pow2(n: np.ndarray | pd.Series | int) -> np.ndarray:
    a = np.asarray(n, dtype=np.int64)
    return (a > 0) & ((a & (a - 1)) == 0)


def next_pow2(n: np.ndarray | pd.Series | int) -> np.ndarray:
    """Smallest power of two >= n (0 stays 0); exact for every int64."""
    a = np.asarray(n, dtype=np.int64)
    uniq, inverse = np.unique(a, return_inverse=True)  # few distinct sizes in practice
    out = np.zeros(uniq.shape, dtype=np.int64)
    for i, v in enumerate(uniq.tolist()):
        out[i] = 0 if v <= 0 else 1 << (v - 1).bit_length()
    return out[inverse].reshape(a.shape)


def pow2_bucket(n: np.ndarray | pd.Series | int) -> np.ndarray:
    """Power-of-two bucket of a size: the bucket 2^k holds sizes in (2^(k-1), 2^k];
    0 bytes is its own bucket 0."""
    return next_pow2(n)


def round_up(n: np.ndarray | pd.Series | int, multiple: int) -> np.ndarray:
    """n rounded up to a multiple of `multiple` (> 0)."""
    if multiple <= 0:
        raise UsageError(None, f"padding multiple must be positive, got {multiple}")
    a = np.asarray(n, dtype=np.int64)
    return ((a + multiple - 1) // multiple) * multiple
