"""The row filter: one vocabulary (ranks, steps, ops, kinds, start times) and its
renderings side by side, one per engine:

* `mask(df)` / `apply(df)`: pandas, in memory (load, Dask partitions);
* `expression(columns)`: a pyarrow.dataset expression, pushed down to the
  parquet scan (load);
* `sql(columns)`: WHERE terms for DuckDB (engine).

One meaning for all of them, including the cases where a column is absent
(datasets written by other tools, or by older versions):

* no `kind` column: every row is "data" (the row schema's default), so
  kinds=("data", ...) keeps every row and a filter without "data" keeps none;
* no `step` column: a steps filter is a UsageError (it cannot be answered);
* an empty tuple keeps no row.

tests/test_filters.py runs every filter through every rendering on the same
rows and checks that they keep the same ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler.errors import UsageError

__all__ = ["RowFilter", "DEFAULT_KIND"]

#: What a row without a `kind` column is.
DEFAULT_KIND = "data"


@dataclass(frozen=True)
class RowFilter:
    """Rows to keep: ranks, steps (inclusive pair), ops, kinds, start times [lo, hi)."""

    ranks: tuple[int, ...] | None = None
    steps: tuple[int, int] | None = None
    ops: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    t_start_ns: tuple[int, int] | None = None

    @staticmethod
    def of(ranks: Iterable[int] | None = None, steps: Sequence[int] | None = None,
           ops: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
           t_start_ns: Sequence[int] | None = None) -> RowFilter:
        if steps is not None and len(steps) != 2:
            raise UsageError(None, "steps: give (first, last)")
        if t_start_ns is not None and len(t_start_ns) != 2:
            raise UsageError(None, "t_start_ns: give (lo, hi)")
        return RowFilter(
            ranks=None if ranks is None else tuple(sorted({int(r) for r in ranks})),
            steps=None if steps is None else (int(steps[0]), int(steps[1])),
            ops=None if ops is None else tuple(str(o) for o in ops),
            kinds=None if kinds is None else tuple(str(k) for k in kinds),
            t_start_ns=None if t_start_ns is None else (int(t_start_ns[0]), int(t_start_ns[1])))

    @staticmethod
    def of_window(window: Mapping[str, Any] | None) -> RowFilter | None:
        """The filters recorded in an export's metadata ("window")."""
        if not window:
            return None
        return RowFilter.of(ranks=window.get("ranks"), steps=window.get("steps"),
                            ops=window.get("ops"), kinds=window.get("kinds"),
                            t_start_ns=window.get("t_start_ns"))

    def and_(self, other: RowFilter | None) -> RowFilter:
        """Rows both filters keep."""
        if other is None:
            return self

        def inter(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> Any:
            if a is None or b is None:
                return a if b is None else b
            return tuple(x for x in a if x in set(b))

        def overlap(a: tuple[int, int] | None, b: tuple[int, int] | None) -> Any:
            if a is None or b is None:
                return a if b is None else b
            return (max(a[0], b[0]), min(a[1], b[1]))

        return RowFilter(ranks=inter(self.ranks, other.ranks),
                         steps=overlap(self.steps, other.steps),
                         ops=inter(self.ops, other.ops), kinds=inter(self.kinds, other.kinds),
                         t_start_ns=overlap(self.t_start_ns, other.t_start_ns))

    def empty(self) -> bool:
        return all(v is None for v in (self.ranks, self.steps, self.ops, self.kinds,
                                       self.t_start_ns))

    # -- the renderings ---------------------------------------------------
    def _check_steps(self, have: set[str]) -> None:
        if self.steps is not None and "step" not in have:
            raise UsageError(None, "--steps: the trace has no step column")

    def _kinds_without_column(self) -> bool:
        """With no kind column every row is DEFAULT_KIND: does the filter keep them?"""
        return self.kinds is None or DEFAULT_KIND in self.kinds

    def mask(self, df: pd.DataFrame) -> np.ndarray:
        """pandas: a boolean mask of the rows to keep."""
        have = set(df.columns)
        self._check_steps(have)
        mask = np.ones(len(df), dtype=bool)
        if self.ranks is not None:
            mask &= df["rank"].isin(list(self.ranks)).to_numpy(dtype=bool)
        if self.steps is not None:
            st = df["step"].to_numpy()
            mask &= (st >= self.steps[0]) & (st <= self.steps[1])
        if self.ops is not None:
            mask &= df["op"].isin(list(self.ops)).to_numpy(dtype=bool)
        if self.kinds is not None:
            if "kind" in have:
                mask &= df["kind"].isin(list(self.kinds)).to_numpy(dtype=bool)
            elif not self._kinds_without_column():
                mask[:] = False
        if self.t_start_ns is not None:
            t = df["t_start_ns"].to_numpy()
            mask &= (t >= self.t_start_ns[0]) & (t < self.t_start_ns[1])
        return mask

    def apply(self, df: pd.DataFrame) -> pd.DataFrame:
        """pandas: the rows to keep (the frame itself when the filter keeps all)."""
        if self.empty():
            return df
        mask = self.mask(df)
        return df if mask.all() else df.loc[mask].reset_index(drop=True)

    def expression(self, have: Iterable[str]) -> Any:
        """pyarrow.dataset: an expression for a scan of files with columns `have`
        (None: keep every row)."""
        import pyarrow.dataset as pads

        cols = set(have)
        self._check_steps(cols)

        def isin(name: str, values: tuple[Any, ...]) -> Any:
            # pyarrow cannot type an empty value set: no value, no row
            return pads.field(name).isin(list(values)) if values else pads.scalar(False)

        parts = []
        if self.ranks is not None:
            parts.append(isin("rank", self.ranks))
        if self.steps is not None:
            parts.append((pads.field("step") >= self.steps[0])
                         & (pads.field("step") <= self.steps[1]))
        if self.ops is not None:
            parts.append(isin("op", self.ops))
        if self.kinds is not None:
            if "kind" in cols:
                parts.append(isin("kind", self.kinds))
            elif not self._kinds_without_column():
                parts.append(pads.scalar(False))
        if self.t_start_ns is not None:
            parts.append((pads.field("t_start_ns") >= self.t_start_ns[0])
                         & (pads.field("t_start_ns") < self.t_start_ns[1]))
        out = None
        for e in parts:
            out = e if out is None else out & e
        return out

    def sql(self, have: Iterable[str]) -> list[str]:
        """DuckDB: WHERE terms (ANDed) for a table with columns `have`."""
        cols = set(have)
        self._check_steps(cols)
        out: list[str] = []
        if self.ranks is not None:
            out.append(f"rank IN ({', '.join(map(str, self.ranks))})" if self.ranks else "FALSE")
        if self.steps is not None:
            out.append(f"step BETWEEN {int(self.steps[0])} AND {int(self.steps[1])}")
        if self.ops is not None:
            out.append(f"op IN ({sql_strings(self.ops)})" if self.ops else "FALSE")
        if self.kinds is not None:
            if "kind" in cols:
                out.append(f"kind IN ({sql_strings(self.kinds)})" if self.kinds else "FALSE")
            elif not self._kinds_without_column():
                out.append("FALSE")
        if self.t_start_ns is not None:
            out.append(f"t_start_ns >= {int(self.t_start_ns[0])} AND "
                       f"t_start_ns < {int(self.t_start_ns[1])}")
        return out


def sql_strings(values: Iterable[str]) -> str:
    """'a', 'b''c': SQL string literals."""
    return ", ".join("'" + str(v).replace("'", "''") + "'" for v in values)
