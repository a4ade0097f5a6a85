"""Communication cost of every scheme from a tensor's sparsity characteristics.

Bytes on the critical path of one worker (phase by phase, the most loaded rank's larger of sent
and received, as links are full duplex), with the formats' real sizes: i index bytes (int32
positions), v = D x value bytes per unit, k = d_G M units per worker, |I_m| = gamma_m k units
in the union of m workers, f = (n-1)/n, p = 2^floor(log2 n):

  allreduce     2 f M v                                               (ring)
  balanced      f k (i + v)  +  f (|I_n| v + min(M/8, |I_n| i))         docs/algorithm.md eq. (1)
  hierarchical  sum_{i=1..log2 p} c(|I_{m_i}|),  c(s) = s v + min(s i, M/8)   eq. (2)
  sparcml       sum_{i=1..log2 p} min(s (i + v), M v)   at s = |I_{m_i}|
  agsparse      (n-1) k (i + v)
  sparse_ps     f k s_w (i + v)  +  f |I_n| s_u (i + v)     s_w, s_u: skew ratios (Def. 5) of
                one worker's set and of the union at n parts (the first partition's owner
                receives the Push and sends the Pull of the hottest part)
  omnireduce    the same in blocks: f k_b s_wb (i + B v) + f |I_n|_b s_ub (i + B v)
with m_i = 2^(i-1) n / p workers entering stage i (non-powers of two fold first: two extra
steps of c(k) and c(|I_n|)). time = bytes x 8 / bandwidth + steps x latency.

gamma_curve: measured gamma_m where known, else the effective-universe estimator (auto.py):
E|I_m| = U (1 - (1 - k/U)^m), U fitted to the measured gamma_n.
"""
from __future__ import annotations

import math
import os

from .schemes import HEADER_IN_PUSH, SCHEMES as _DECLARED

SCHEMES = tuple(_DECLARED)   # every scheme a sync can run (schemes.py)
INDEX_BYTES = 4
LATENCY_S = 50e-6      # one message step over TCP (order of magnitude; bandwidth terms dominate)


def fit_universe(k: float, union: float, m: int) -> float:
    """U with U (1 - (1 - k/U)^m) = union (inf when the sets look disjoint)."""
    if k <= 0 or m <= 1 or union <= k * (1 + 1e-12):
        return max(k, 1.0)
    if union >= m * k * (1 - 1e-9):
        return math.inf
    lo, hi = k, k
    while hi * (1 - (1 - k / hi) ** m) < union:
        hi *= 2
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mid * (1 - (1 - k / mid) ** m) < union else (lo, mid)
    return 0.5 * (lo + hi)


def gamma_curve(n: int, k: float, gamma_n: float, stage_gammas=None):
    """m -> gamma_m. stage_gammas[i-1] = measured gamma_{2^(i-1)} (used for exact matches)."""
    U = fit_universe(k, gamma_n * k, n)
    known = {1: 1.0, n: gamma_n}
    if stage_gammas:
        p = 1 << (n.bit_length() - 1)
        for i, g in enumerate(stage_gammas):
            known[(1 << i) * n // p] = g

    def gamma(m: float) -> float:
        if m in known:
            return known[m]
        if k <= 0:
            return 1.0
        return m if math.isinf(U) else U * (1 - (1 - k / U) ** m) / k
    return gamma


def hierarchy_sizes(n: int, k: float, gamma):
    """Set sizes a worker receives at each step of recursive doubling (fold steps included)."""
    p = 1 << (n.bit_length() - 1)
    sizes = [gamma((1 << i) * n / p) * k for i in range(p.bit_length() - 1)]
    if n > p:
        sizes = [k] + sizes + [gamma(n) * k]
    return sizes


def predict_bytes(n, M, d_G, gamma, value_bytes, schemes=SCHEMES, skew=None, blocks=None) -> dict:
    """Critical-path bytes per scheme. value_bytes = D x bytes per value. skew = (s_w, s_u);
    blocks = dict(B=, k=blocks per worker, union=blocks in the union, s_w=, s_u=)."""
    f, i, v = (n - 1) / n, INDEX_BYTES, value_bytes
    k = d_G * M
    union = gamma(n) * k
    s_w, s_u = skew or (1.0, 1.0)
    steps = hierarchy_sizes(n, k, gamma) if n > 1 else []
    out = {}
    for s in schemes:
        if s == "allreduce":
            b = 2 * f * M * v
        elif s == "balanced":
            b = f * k * (i + v) + f * (union * v + min(M / 8, union * i))
        elif s == "hierarchical":
            b = sum(x * v + min(x * i, M / 8) for x in steps)
        elif s == "sparcml":
            b = sum(min(x * (i + v), M * v) for x in steps)
        elif s == "agsparse":
            b = (n - 1) * k * (i + v)
        elif s == "sparse_ps":
            b = f * (k * s_w + union * s_u) * (i + v)
        elif s == "omnireduce":
            bl = blocks or _independent_blocks(M, d_G, gamma(n), value_bytes)
            b = f * (bl["k"] * bl["s_w"] + bl["union"] * bl["s_u"]) * (i + bl["B"] * v)
        else:
            raise ValueError(f"unknown scheme {s!r}")
        out[s] = float(b)
    return out


def _independent_blocks(M, d_G, gamma_n, value_bytes, D=1):
    from .baselines import block_units

    B = block_units(D)
    nb = -(-M // B)
    return dict(B=B, k=nb * (1 - (1 - d_G) ** B), union=nb * (1 - (1 - min(1.0, gamma_n * d_G)) ** B),
                s_w=1.0, s_u=1.0)


def message_steps(n: int, scheme: str) -> int:
    """Message steps of one sync: the scheme's pattern, plus the header round
    (header.exchange) for every scheme that does not carry the header in its own first round
    (schemes.HEADER_IN_PUSH)."""
    p = 1 << (n.bit_length() - 1)
    hops = 2 * (p.bit_length() - 1) + (4 if n > p else 0)
    pattern = {"allreduce": 2 * (n - 1), "hierarchical": hops, "sparcml": hops}.get(
        scheme, 2 if scheme != "agsparse" else 1)
    return pattern + (scheme not in HEADER_IN_PUSH)


def hashed_units(scheme: str, k: float, union: float) -> float:
    """Units one worker passes through h0 in a host sync: balanced parallelism hashes its k
    units (partition) and decodes the union's through pi^-1 (the Pull's bitmap); the other
    schemes pass over their units as often (packs, merges, sums) but hash none."""
    return k + union if scheme == "balanced" else 0.0


def two_level_bytes(H, L, M, k, union, host_union, value_bytes, ring=True) -> dict:
    """Bytes of one balanced sync of n = H L ranks, L to a host (two_level.py), with k units
    per rank, |I_n| = union and a host's union host_union = gamma_L k:
      off_host: what leaves one host (its link's busier direction);
      inside: what one rank moves to and from the other ranks of its host.
    The Pull messages of all servers together are P = |I_n| v + min(M/8, |I_n| i).
      flat       off_host: L (n-L)/n k (i+v)  +  (n-1)/n P around the ring (each link
                 carries every message but one), L (n-L)/n P direct;
                 inside: (L-1)/n k (i+v)  +  (L-1)/L (n-1)/n P around the ring (a rank
                 whose left neighbour shares its host receives every message from it),
                 (L-1)/n P direct
      two-level  off_host: (H-1)/H (host_union (i+v) + P)   (the host's union pushed once,
                 each share pulled once);
                 inside: (L-1)/L (k (i+v) + P)              (reduce-scatter and allgather)"""
    n, i, v = H * L, INDEX_BYTES, value_bytes
    P = union * v + min(M / 8, union * i)
    flat_pull = (n - 1) / n * P if ring else L * (n - L) / n * P
    pull_inside = (L - 1) / L * (n - 1) / n * P if ring else (L - 1) / n * P
    return {"flat": dict(off_host=L * (n - L) / n * k * (i + v) + flat_pull,
                         inside=(L - 1) / n * k * (i + v) + pull_inside),
            "two-level": dict(off_host=(H - 1) / H * (host_union * (i + v) + P),
                              inside=(L - 1) / L * (k * (i + v) + P))}


def two_level_costs(H, L, M, k, union, host_union, value_bytes, ring=True, round_bytes=0.0,
                    hash_bytes=0.0, rate_ratio=None) -> dict:
    """Flat against two-level balanced parallelism, in bytes of the network link: the bytes
    leaving a host, plus the bytes inside it at rate_ratio = network rate / in-host rate
    (ZEN_HVD_NETWORK_GBPS / ZEN_HVD_HOST_GBPS, defaults 10 and 50), plus round_bytes per
    message step (2 flat; 5 for two levels) and hash_bytes per unit a rank hashes (flat: k
    and the union; two levels also its share's host union and union, (host_union + union)/L)."""
    if rate_ratio is None:
        rate_ratio = network_gbps() / host_gbps()
    b = two_level_bytes(H, L, M, k, union, host_union, value_bytes, ring)
    hashed = {"flat": k + union, "two-level": k + union + (host_union + union) / L}
    steps = {"flat": 2, "two-level": 5}   # two-level: the header round, two rounds inside, two across
    return {s: b[s]["off_host"] + rate_ratio * b[s]["inside"] + steps[s] * round_bytes + hashed[s] * hash_bytes
            for s in b}


def network_gbps() -> float:
    return float(os.environ.get("ZEN_HVD_NETWORK_GBPS") or 10)


def host_gbps() -> float:
    return float(os.environ.get("ZEN_HVD_HOST_GBPS") or 50)


def predict_time(n, M, d_G, gamma, value_bytes, bandwidth_bps, schemes=SCHEMES, skew=None, blocks=None,
                 latency_s=LATENCY_S) -> dict:
    b = predict_bytes(n, M, d_G, gamma, value_bytes, schemes, skew, blocks)
    return {s: b[s] * 8 / bandwidth_bps + message_steps(n, s) * latency_s for s in schemes}
