"""The subset search of fusion inference (profiler.postjob.fusion): the ways to
pick tensors of given sizes whose bytes sum to a call's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Search budget per question (nodes of the subset search): past it the
#: number of fitting sets is a lower bound and the call is ambiguous.
SEARCH_BUDGET = 20_000
#: Alternative count vectors remembered per question.
MAX_SOLUTIONS = 64



# --------------------------------------------------------------------------
# the subset search
# --------------------------------------------------------------------------

@dataclass
class Subsets:
    """Ways to pick tensors of the given group sizes summing to a target."""

    vectors: list[tuple[int, ...]]   # per group: how many of it (<= MAX_SOLUTIONS)
    assignments: int                 # number of distinct tensor sets (all vectors): exact int
    exhausted: bool = False          # search budget ran out: not all ways are known
    used: frozenset[int] = frozenset()  # groups some fitting vector takes (all, not 64)

    @property
    def log10(self) -> float:
        """log10 of the number of sets (a Python int of any size: no overflow)."""
        return math.log10(self.assignments) if self.assignments > 0 else 0.0

    @property
    def unique(self) -> bool:
        return self.assignments == 1 and not self.exhausted


def solve_subset(weights: Sequence[int], counts: Sequence[int], target: int,
                 budget: int | None = None) -> Subsets:
    """All count vectors k (0 <= k_g <= counts[g]) with sum k_g * weights[g] ==
    target (the first MAX_SOLUTIONS), and the number of tensor sets they
    stand for (sum over vectors of prod C(counts[g], k_g), an exact integer).
    At most `budget` (SEARCH_BUDGET) nodes are visited: beyond, `exhausted`
    and the count is a lower bound."""
    n = len(weights)
    total = sum(w * c for w, c in zip(weights, counts))
    if target < 0 or target > total:
        return Subsets([], 0)
    if target == total:
        return Subsets([tuple(counts)], 1, used=frozenset(g for g in range(n) if counts[g]))
    if target == 0:
        return Subsets([tuple([0] * n)], 1)
    # Search the smaller side: the tensors left out when they are fewer bytes.
    flip = total - target < target
    goal = total - target if flip else target
    order = sorted(range(n), key=lambda g: -weights[g])
    ws = [weights[g] for g in order]
    cs = [counts[g] for g in order]
    suffix = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + ws[i] * cs[i]
    dead: set[tuple[int, int]] = set()
    found: list[tuple[int, ...]] = []
    used: set[int] = set()
    ways = 0
    left = [SEARCH_BUDGET if budget is None else budget]
    pick = [0] * n

    def walk(i: int, rem: int) -> bool:
        nonlocal ways
        left[0] -= 1
        if left[0] < 0:
            return True
        if rem == 0:
            vec = [0] * n
            for j, g in enumerate(order):
                kj = pick[j] if j < i else 0
                vec[g] = cs[j] - kj if flip else kj
            m = 1
            for g in range(n):
                m *= math.comb(counts[g], vec[g])
                if vec[g]:
                    used.add(g)
            ways += m
            if len(found) < MAX_SOLUTIONS:
                found.append(tuple(vec))
            return True
        if i == n or rem > suffix[i] or (i, rem) in dead:
            return False
        hit = False
        w = ws[i]
        for k in range(min(cs[i], rem // w), -1, -1):
            pick[i] = k
            if walk(i + 1, rem - k * w):
                hit = True
            if left[0] < 0:
                break
        pick[i] = 0
        if not hit:
            dead.add((i, rem))
        return hit

    walk(0, goal)
    return Subsets(found, ways, exhausted=left[0] < 0, used=frozenset(used))


