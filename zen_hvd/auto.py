"""scheme="auto": pick balanced parallelism or hierarchical centralization per tensor
(docs/algorithm.md §2: profile the first syncs, compare equations (1) and (2)), or one of the
two patterns that do the same in fewer rounds at the extremes of density and overlap.

Per tensor name, every sync feeds a profile with numbers every rank has bitwise alike (so every
rank makes the same choice without an extra message):
  - d_G = mean nnz / M, from the allgathered header table;
  - gamma_n = |I| / mean nnz, |I| being the size of the aggregated union, which every scheme
    returns identically on all ranks (balanced: sum of the Pull counts; agsparse, whose
    unordered result repeats units: the distinct ones);
  - gamma_{2^(i-1)} for the stages of hierarchical centralization, measured when that scheme
    runs on a check sync (one allgather of log2 n + 1 integers, control bytes).
Estimator for the gamma_m not measured (documented here, tested in tests/test_costmodel.py):
every worker's set is taken as k = mean nnz units drawn at random from an effective universe
of U units, E|I_m| = U (1 - (1 - k/U)^m); U is solved from the measured |I_n| (U = M is the
independence model d_m = 1 - (1 - d)^m; U = k means identical sets; U -> inf disjoint sets).

Costs (bytes one worker receives; time = bytes / b, b cancels) with the wire formats' real sizes
(costmodel.py): eq. (1) for balanced with COO Push and hash-bitmap-or-positions Pull, eq. (2)
for hierarchical with positions-or-bitmap sets, dense AllReduce 2 (n-1)/n M D v (it wins when
tensors are nearly dense, where Theorem 1's COO analysis does not look), and the one-shot
allgather of COO sets (n-1) k (i + v) (oneshot.py: when the sets barely overlap, gamma_n near n,
it receives what eq. (2) receives with gamma_m = m, in one round instead of 2 log2 n + 1).
Each scheme also pays ZEN_HVD_ROUND_BYTES (default 128 KiB) per message step of its pattern
(balanced: 2; agsparse: 1; hierarchical: 2 per stage, plus its fold and its header round): the
alpha of an alpha-beta model, in bytes, so that a scheme with fewer bytes but many more rounds
is not chosen for a small margin. On the host data path balanced parallelism also pays
ZEN_HVD_HASH_BYTES (default 9) per unit it hashes (costmodel.hashed_units: its k units, and the
union's through the inverse permutation): h0 and its inverse take about 70 ns a unit on a
CPU core (cycle-walking Feistel rounds), what a 1 Gbit/s link moves in that time. It matters
for element units (DGC's buckets: 8 bytes on the wire a unit), where hashing costs more than
the bytes it saves; for rows of many values it is a few percent of the bytes.
Once decided, a call costs one dictionary lookup and a counter (observe returns at once).
Schedule: call 0 runs balanced (reveals d_G and gamma_n); the choice is made after calls 1 and
2 and re-checked every ZEN_HVD_AUTO_RECHECK (default 100) calls of the tensor. Every choice is
logged on logger "zen_hvd.auto" and kept in scheme_choices().
"""
from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

from . import costmodel, schemes

log = logging.getLogger("zen_hvd.auto")
FIRST = "balanced"
CANDIDATES = schemes.AUTO
# A tensor kept on its device is not copied to the host for a scheme without a device path.
DEVICE_CANDIDATES = tuple(s for s in schemes.AUTO if s in schemes.DEVICE)
DEFAULT_ROUND_BYTES = 128 << 10   # about 1 ms of a 1 Gbit/s link: one message step on shared cores
DEFAULT_HASH_BYTES = 9            # about 70 ns of a 1 Gbit/s link: h0 or its inverse on one unit


@dataclasses.dataclass
class Profile:
    calls: int = 0
    scheme: str = FIRST
    d_G: float = 0.0
    gamma_n: float = 1.0
    stage_gammas: list | None = None     # measured gamma_{2^(i-1)}, i = 1..log2 p
    predicted: dict = dataclasses.field(default_factory=dict)
    decided_at: int = -1
    recheck: int = dataclasses.field(default_factory=lambda: recheck_every())  # read once
    round_bytes: int = dataclasses.field(default_factory=lambda: int(os.environ.get(
        "ZEN_HVD_ROUND_BYTES", str(DEFAULT_ROUND_BYTES))))
    hash_bytes: float = dataclasses.field(default_factory=lambda: float(os.environ.get(
        "ZEN_HVD_HASH_BYTES", str(DEFAULT_HASH_BYTES))))
    two_level: bool = True               # two_level.py, where it applies: measured first
    host_union: float | None = None      # mean units in a host's union (measured by two levels)
    two_level_costs: dict = dataclasses.field(default_factory=dict)


def recheck_every() -> int:
    return max(1, int(os.environ.get("ZEN_HVD_AUTO_RECHECK", "100")))


def choose(profiles: dict, name: str) -> str:
    """The concrete scheme for this call of tensor `name` (the same on every rank); profiles:
    the group's (runtime.State.profiles)."""
    prof = profiles.get(name)
    return FIRST if prof is None else prof.scheme


def two_level(profiles: dict, name: str) -> bool:
    """Whether this call of `name` runs two levels where they apply (the same on every rank)."""
    prof = profiles.get(name)
    return prof is None or prof.two_level


def is_check_call(calls: int, recheck: int) -> bool:
    return calls in (1, 2) or calls % recheck == 0


def next_is_check(profiles: dict, name: str) -> bool:
    """Whether the coming sync of `name` is a check call (observe updates the profile)."""
    prof = profiles.get(name)
    return prof is None or is_check_call(prof.calls + 1, prof.recheck)


def observe(profiles, name, scheme, layout, info, transport, *, on_device=False, levels=None) -> None:
    """After a sync of `name` with `scheme`: count it; on a check call, update the profile
    from what the sync returned (info: every rank's nnz, the union's size) and decide, among
    the DEVICE_CANDIDATES when the tensor stays on its device; with `levels` (two_level.Levels)
    decide between the flat and the two-level sync too. Other calls cost one dictionary
    lookup."""
    prof = profiles.get(name)
    if prof is None:
        prof = profiles[name] = Profile()
    prof.calls += 1
    if not is_check_call(prof.calls, prof.recheck):
        return
    n, M = transport.size, layout.num_units
    k = float(np.mean(info["nnz"]))
    prof.d_G = k / M if M else 0.0
    if k > 0:
        prof.gamma_n = info["union_size"] / k
    if scheme == "hierarchical" and n > 1 and not info.get("two_level"):
        prof.stage_gammas = _measured_stage_gammas(info, transport, k)
    if info.get("two_level"):
        prof.host_union = float(info["host_union"])
    import torch

    vbytes = torch.empty(0, dtype=layout.dtype).element_size() * layout.unit_size
    candidates = DEVICE_CANDIDATES if on_device else CANDIDATES
    prof.predicted = costmodel.predict_bytes(n, M, prof.d_G, costmodel.gamma_curve(
        n, k, prof.gamma_n, prof.stage_gammas), vbytes, candidates)
    # Each message step costs a round trip whatever it carries (costmodel.message_steps): in
    # bytes, what a link moves meanwhile (alpha-beta model with alpha b = ZEN_HVD_ROUND_BYTES).
    # On the host a unit through h0 (or its inverse) costs what a link moves meanwhile, too
    # (the device kernels hash every unit in parallel).
    hashing = 0.0 if on_device else prof.hash_bytes
    cost = {s: prof.predicted[s] + costmodel.message_steps(n, s) * prof.round_bytes
            + costmodel.hashed_units(s, k, prof.gamma_n * k) * hashing for s in candidates}
    best = min(candidates, key=lambda s: (cost[s], candidates.index(s)))
    if best != prof.scheme or prof.decided_at < 0:
        log.info("zen_hvd auto: tensor %r on %d ranks -> %s (d_G=%.4g, gamma_n=%.3g, predicted "
                 "bytes received per worker plus %d per message step and %g per unit hashed: %s)", name, n,
                 best, prof.d_G, prof.gamma_n, prof.round_bytes, hashing,
                 ", ".join(f"{s} {cost[s]:.3g}" for s in candidates))
    prof.scheme, prof.decided_at = best, prof.calls
    if levels is not None:
        _choose_levels(prof, name, n, M, k, vbytes, levels, transport, hashing)


def _choose_levels(prof, name, n, M, k, vbytes, levels, transport, hashing) -> None:
    """Flat or two-level (costmodel.two_level_costs): the host's union measured by the last
    two-level sync, or estimated from gamma_n (gamma_curve) before one ran."""
    H, L = levels.hosts, levels.per_host
    host_union = prof.host_union
    if host_union is None:
        host_union = costmodel.gamma_curve(n, k, prof.gamma_n, prof.stage_gammas)(L) * k
    costs = costmodel.two_level_costs(H, L, M, k, prof.gamma_n * k, host_union, vbytes,
                                      ring=transport.pull_route() == "ring",
                                      round_bytes=prof.round_bytes, hash_bytes=hashing)
    two = costs["two-level"] < costs["flat"]
    if two != prof.two_level or not prof.two_level_costs:
        log.info("zen_hvd auto: tensor %r on %d hosts x %d ranks -> %s (host union %.4g units; cost "
                 "in bytes of the network link: flat %.3g, two-level %.3g)", name, H, L,
                 "two-level" if two else "flat", host_union, costs["flat"], costs["two-level"])
    prof.two_level, prof.two_level_costs = two, costs


def _measured_stage_gammas(info, transport, k):
    """Mean over the hierarchy's groups of |union entering stage i| / k (ranks that sit the
    stages out send -1)."""
    sizes = np.asarray(info.get("stage_sizes", []), np.int64)
    p = 1 << (transport.size.bit_length() - 1)
    stages = p.bit_length()                      # log2 p + 1 entries (after the last stage too)
    row = np.full(stages, -1, np.int64)
    row[:sizes.size] = sizes[:stages]
    table = transport.allgather_int64(row)
    table = table[table[:, 0] >= 0]
    return [float(table[:, i].mean()) / k for i in range(stages - 1)] if k > 0 else None


def scheme_choices() -> dict:
    """Per tensor name (of every group): the scheme auto uses now and the numbers it chose it
    by."""
    from . import runtime

    def levels(state):   # the two-level syncs' choices across hosts (two_level.py)
        return [lv.cross_state for t in state.transports.values() if getattr(t, "_levels", None)
                for lv in [t._levels]]

    return {name + suffix: dict(scheme=p.scheme, calls=p.calls, d_G=p.d_G, gamma_n=p.gamma_n,
                                stage_gammas=p.stage_gammas, predicted_bytes=dict(p.predicted),
                                decided_at_call=p.decided_at, two_level=p.two_level,
                                two_level_costs=dict(p.two_level_costs))
            for top in runtime.states()
            for state, suffix in [(top, "")] + [(s, " (across hosts)") for s in levels(top)]
            for name, p in state.profiles.items()}


def reset() -> None:
    """Forget every group's decisions (the next syncs profile again)."""
    from . import runtime

    for state in runtime.states():
        state.profiles.clear()
