"""The scenario job's injected pauses, one definition for the job that sleeps
them (job.py) and the runner that prices them (randomized.py): rank r of a
job with seed s draws its pause of every iteration, warm-up included, from
random.Random(s * 1000 + r), uniform(0, J) or exponential with mean J/2."""

from __future__ import annotations

import random
from collections.abc import Iterator


def pauses(seed: int, rank: int, jitter_ms: float, shape: str) -> Iterator[float]:
    """Rank `rank`'s jitter pause of each iteration in turn (ms; 0 without jitter)."""
    rng = random.Random(seed * 1000 + rank)
    while True:
        if jitter_ms and shape == "exponential":
            yield rng.expovariate(2.0 / jitter_ms)
        elif jitter_ms:
            yield rng.uniform(0.0, jitter_ms)
        else:
            yield 0.0


def realized_wait_ms(seed: int, jitter_ms: float, shape: str, n: int, iterations: int,
                     first: int = 2) -> float:
    """What this run's own pauses make the ranks wait for each other per step,
    averaged over them: the mean over iterations `first` .. `iterations` - 1 of
    max - mean of the n ranks' pauses (every other cause absent).  Its
    expectation is randomized.expected_wait_ms; this is the draw the run made."""
    draws = [pauses(seed, r, jitter_ms, shape) for r in range(n)]
    per = [[next(d) for d in draws] for _ in range(iterations)][first:]
    return sum(max(p) - sum(p) / n for p in per) / len(per)
