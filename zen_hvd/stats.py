"""Imbalance ratios (docs/algorithm.md §3) and the balanced-parallelism byte formula.

Push imbalance = max_{i,j} n |I_i^j| / |I_i|  (worker i's units for server j)
Pull imbalance = max_j n |I'_j| / |I|         (server j's aggregated units; I = union)

and write_csv, the CSV file of a table of such figures.
"""
from __future__ import annotations

import os

import numpy as np



def push_imbalance(push_counts: np.ndarray) -> float:
    """push_counts[i, j] = units worker i sends to server j."""
    n = push_counts.shape[0]
    per_worker = push_counts.sum(axis=1, keepdims=True)
    ratios = n * push_counts / np.maximum(per_worker, 1)
    return float(ratios[per_worker[:, 0] > 0].max()) if (per_worker > 0).any() else 1.0


def pull_imbalance(pull_counts: np.ndarray) -> float:
    total = int(np.sum(pull_counts))
    return float(len(pull_counts) * np.max(pull_counts) / total) if total else 1.0


def balanced_bytes_formula(M: int, n: int, d_G: float, gamma: float, D: int,
                           value_bytes: int, index_bytes: int, pull_index: str = "zen") -> dict:
    """Bytes one worker receives with balanced parallelism (docs/algorithm.md equation (1), in bytes):
    Push (n-1)/n d_G M (index + D value bytes); Pull (n-1)/n gamma d_G M D value bytes plus
    the Pull indices: "bitmap" (n-1)/n M/8 bytes, "coo" (n-1)/n gamma d_G M index bytes, or
    "zen" the smaller of the two (what BalancedParallelism sends)."""
    f = (n - 1) / n
    push = f * d_G * M * (index_bytes + D * value_bytes)
    pull_values = f * gamma * d_G * M * D * value_bytes
    options = dict(bitmap=f * M / 8, coo=f * gamma * d_G * M * index_bytes)
    options["zen"] = min(options.values())
    pull_index = options[pull_index]
    return dict(push=push, pull=pull_values + pull_index, pull_index=pull_index,
                total=push + pull_values + pull_index)


def write_csv(path: "str | None", rows: "list[dict]") -> None:
    """`rows` (dicts with the same keys, in column order) as a CSV file; nothing without a path."""
    import csv

    if not path or not rows:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"  wrote {path}")
