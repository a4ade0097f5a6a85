"""Synthetic sparse gradients with controlled density, overlap and skew (docs/algorithm.md §1).

Every rank can build every rank's gradient from the same seed, so tests and benchmarks know
the exact inputs of all ranks (and hence the reference sum) without communicating.
- density d: units per rank = round(d M);
- overlap o: a fraction o of each rank's units is shared by all ranks (C1);
- skew s: units drawn with probability ~ 1 / (u + 1)^s (Zipf; s = 0 is uniform), so low unit
  indices are hot, as in embedding tables (C3).
"""
from __future__ import annotations

import numpy as np

from .units import sorted_unique


def zipf_units(rng: np.random.Generator, M: int, k: int, skew: float, exclude=None) -> np.ndarray:
    """k distinct units of [0, M), Zipf-distributed with exponent `skew`, avoiding `exclude`."""
    taken = np.zeros(M, dtype=bool)
    if exclude is not None and len(exclude):
        taken[exclude] = True
    k = min(k, M - int(taken.sum()))
    chosen = []
    have = 0
    for _ in range(8):
        if have >= k:
            break
        u = rng.random(2 * (k - have) + 16)
        if skew == 0:
            draw = (u * M).astype(np.int64)
        elif skew == 1:
            draw = (np.exp(u * np.log(M + 1)) - 1).astype(np.int64)
        else:  # inverse CDF of the continuous density ~ (x + 1)^-s on [0, M)
            a = 1 - skew
            draw = (((M + 1) ** a - 1) * u + 1) ** (1 / a) - 1
            draw = draw.astype(np.int64)
        draw = np.clip(draw, 0, M - 1)
        draw = draw[~taken[draw]]
        draw = sorted_unique(draw)
        rng.shuffle(draw)
        draw = draw[: k - have]
        taken[draw] = True
        chosen.append(draw)
        have += draw.size
    if have < k:  # the tail: uniform over what is left
        rest = np.flatnonzero(~taken)
        fill = rng.choice(rest, size=k - have, replace=False)
        taken[fill] = True
        chosen.append(fill)
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


def rank_units(M: int, n: int, density: float, overlap: float, skew: float, seed: int):
    """The unit sets of all n ranks (sorted int64 arrays)."""
    rng = np.random.default_rng(seed)
    k = int(round(density * M))
    shared = zipf_units(rng, M, int(round(overlap * k)), skew)
    return [sorted_unique(np.concatenate([shared, zipf_units(rng, M, k - shared.size, skew, exclude=shared)]))
            for _ in range(n)]


def rank_values(units: np.ndarray, D: int, rank: int, seed: int, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, 7])
    return rng.standard_normal((units.size, D)).astype(dtype)
