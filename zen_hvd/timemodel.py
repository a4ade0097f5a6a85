"""Time of one sync, not only its bytes: the wire, the message steps and the CPU.

    time(method) = max(wire, S) + alpha x min(wire, S) + steps x latency,
    S = cpu x max(c, sharing)

  wire     critical-path bytes (the busiest rank's larger of sent and received; costmodel.py for
           Zen's schemes) over the link rate: the link is busy that long at least;
  cpu      f x messages + b x moved per rank: a part per message the rank sends or receives
           (messages) and a part per byte it sends and receives (moved = 2 x critical),
           calibrated per method and per transport kind ("shm": ranks of one machine, "tcp":
           ranks on hosts joined by a network) from the CPU time a rank spends per sync at a
           few measured points (calibrate);
  c        the critical path's share of CPU: a sync's rounds wait on the slowest rank's
           compute, so even a rank with a core of its own takes c x its CPU (c >= 1, one per
           transport kind, calibrated from the calibration launches' times where the CPU
           bounds them);
  sharing  ranks per core, where ranks share a machine's cores: their CPU then runs one
           after another (the emulated cluster's hosts are namespaces of one 2-core machine),
           which fills the waits c stands for; 1 on a cluster of one rank per core;
  steps    message steps of the method's pattern (a round whose messages wait on each other's
           arrival) x latency.
  alpha    the part of the shorter of wire and CPU that does not overlap the longer (a rank
           computes while other ranks' bytes are on the wire, but not all the time): one per
           transport kind, calibrated.
Methods (bench.vs_horovod's names):
  zen-<scheme>        zen_hvd.sparse_allreduce(scheme=...): costmodel.predict_bytes
  horovod-sparse      Horovod's allgather of every rank's rows as they are, t per rank:
                      (n-1) t (8 + 4 D) received, n - 1 ring steps
  horovod-coalesced   the same of each rank's k distinct rows
  horovod-dense       ring allreduce of the dense table: 2 (n-1)/n M 4 D, 2 (n-1) steps
  ddp-sparse          DDP's own sparse reduction (gloo's allgather of each rank's coalesced
                      rows and their indices): as horovod-coalesced
"""
from __future__ import annotations

import dataclasses
import json
import math

from . import costmodel

LATENCY_S = {"shm": 20e-6, "tcp": 200e-6}   # one message step, on one machine or between hosts


@dataclasses.dataclass
class Gradient:
    """What the model needs of a gradient: M rows of D float32 values, t rows per rank as
    synchronized (repeats included), k distinct rows per rank (mean), and the union of the
    first m ranks' rows for the m the schemes meet (unions[m])."""

    M: int
    D: int
    t: float
    k: float
    unions: dict

    def gamma(self, n):
        """gamma_m over m = 1..n: measured unions where known, else costmodel's estimator."""
        known = {m: u / self.k for m, u in self.unions.items() if m <= n}
        curve = costmodel.gamma_curve(n, self.k, known.get(n, max(known.values())))
        return lambda m: known.get(m, curve(m))


def critical_bytes(method: str, n: int, g: Gradient) -> float:
    """Bytes on the busiest rank's link in its busier direction, per sync."""
    v, row = 4 * g.D, 8 + 4 * g.D
    if method.startswith("zen-"):
        scheme = method[4:]
        return costmodel.predict_bytes(n, g.M, g.k / g.M, g.gamma(n), v, [scheme])[scheme]
    if method == "horovod-sparse":
        return (n - 1) * g.t * row
    if method in ("horovod-coalesced", "ddp-sparse"):
        return (n - 1) * g.k * row
    if method == "horovod-dense":
        return 2 * (n - 1) / n * g.M * v
    raise ValueError(f"unknown method {method!r}")


def steps(method: str, n: int) -> int:
    if n <= 1:
        return 0
    if method.startswith("zen-"):
        return costmodel.message_steps(n, method[4:])
    return 2 * (n - 1) if method == "horovod-dense" else n - 1


def messages(method: str, n: int) -> int:
    """Messages a rank sends and receives per sync: all-to-all rounds n - 1 each way (Zen's
    Push and Pull, the one-shot allgather), one each way per step otherwise (hierarchical
    stages, ring steps; Horovod's sparse allgather is two, of indices and of values)."""
    if n <= 1:
        return 0
    rounds = {"zen-balanced": 2, "zen-agsparse": 1, "zen-sparse_ps": 2, "zen-omnireduce": 2}
    if method in rounds:
        return 2 * rounds[method] * (n - 1)
    if method in ("horovod-sparse", "horovod-coalesced", "ddp-sparse"):
        return 4 * (n - 1)
    return 2 * steps(method, n)


def calibrate(points) -> dict:
    """The model's constants from measured points, each dict(kind=, method=, n=, cpu_s=,
    time_s=, rate_bps=, sharing=, gradient=Gradient):
      (kind, method) -> (f, b): least squares of cpu_s = f x messages + b x moved over a
                      method's points of a kind (f, b >= 0);
      (kind, "c") -> (c, 0): the median over the kind's CPU-bound points (wire under half the
                      time) of (time - steps x latency) / cpu, at least 1;
      (kind, "alpha") -> (alpha, 0): least squares of what the time exceeds max(wire, S) +
                      steps x latency by, against min(wire, S), within [0, 1]."""
    out = {}
    groups: dict = {}
    for p in points:
        x = (messages(p["method"], p["n"]), 2 * critical_bytes(p["method"], p["n"], p["gradient"]))
        groups.setdefault((p["kind"], p["method"]), []).append((x, p["cpu_s"]))
    for key, rows in groups.items():
        out[key] = _nonnegative_fit(rows)
    fitted = [dict(p, cpu=cpu_of(p["method"], p["n"], p["gradient"], p["kind"], out),
                   wire=critical_bytes(p["method"], p["n"], p["gradient"]) * 8 / p["rate_bps"],
                   hops=steps(p["method"], p["n"]) * LATENCY_S[p["kind"]]) for p in points]
    for kind in {p["kind"] for p in points}:
        mine = [p for p in fitted if p["kind"] == kind and p["cpu"] > 0]
        ratios = sorted((p["time_s"] - p["hops"]) / p["cpu"] for p in mine
                        if p["wire"] < 0.5 * p["time_s"] and p["sharing"] <= 1)
        c = max(1.0, ratios[len(ratios) // 2]) if ratios else 1.0
        out[(kind, "c")] = (c, 0.0)
        over = [(min(p["wire"], S), p["time_s"] - max(p["wire"], S) - p["hops"])
                for p in mine for S in [p["cpu"] * max(c, p["sharing"])]]
        den = sum(m * m for m, _ in over)
        out[(kind, "alpha")] = (min(1.0, max(0.0, sum(m * r for m, r in over) / den)) if den else 0.0, 0.0)
    return out


def _nonnegative_fit(rows):
    """(f, b) >= 0 minimizing sum (f x0 + b x1 - y)^2 over rows ((x0, x1), y): the 2 x 2 normal
    equations, or the better one-variable fit when either would be negative."""
    s00 = sum(x[0] * x[0] for x, _ in rows)
    s11 = sum(x[1] * x[1] for x, _ in rows)
    s01 = sum(x[0] * x[1] for x, _ in rows)
    t0 = sum(x[0] * y for x, y in rows)
    t1 = sum(x[1] * y for x, y in rows)
    det = s00 * s11 - s01 * s01
    if det > 1e-12 * max(s00 * s11, 1e-300):
        f, b = (t0 * s11 - t1 * s01) / det, (t1 * s00 - t0 * s01) / det
        if f >= 0 and b >= 0:
            return f, b
    cands = [(max(0.0, t0 / s00) if s00 else 0.0, 0.0), (0.0, max(0.0, t1 / s11) if s11 else 0.0)]
    return min(cands, key=lambda fb: sum((fb[0] * x[0] + fb[1] * x[1] - y) ** 2 for x, y in rows))


def cpu_of(method, n, g, kind, constants) -> float:
    """A rank's CPU seconds per sync: f x messages + b x moved."""
    f, b = constants[(kind, method)]
    return f * messages(method, n) + b * 2 * critical_bytes(method, n, g)


def predict(method: str, n: int, g: Gradient, rate_bps: float, kind: str, constants: dict,
            sharing: float = 1.0, cpu_s: float | None = None) -> dict:
    """dict(time, wire, cpu, steps) in seconds for one sync of `method` on n ranks with
    links of rate_bps bits/s; cpu_s replaces the calibrated CPU per sync (a GPU kernel's time
    in a projection)."""
    wire = critical_bytes(method, n, g) * 8 / rate_bps if n > 1 else 0.0
    if cpu_s is None:
        cpu_s = cpu_of(method, n, g, kind, constants)
    hops = steps(method, n) * LATENCY_S[kind]
    cpu = cpu_s * max(constants.get((kind, "c"), (1.0, 0.0))[0], sharing)
    alpha = constants.get((kind, "alpha"), (0.0, 0.0))[0]
    return dict(time=max(wire, cpu) + alpha * min(wire, cpu) + hops, wire=wire, cpu=cpu, steps=hops)


def save(constants: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump({f"{k}|{m}": list(ab) for (k, m), ab in constants.items()}, f, indent=1)


def load(path: str) -> dict:
    with open(path) as f:
        return {tuple(key.split("|")): tuple(ab) for key, ab in json.load(f).items()}


def sharing(ranks_on_machine: int, cores: int) -> float:
    """Ranks per core where ranks share a machine's cores (at least 1)."""
    return max(1.0, ranks_on_machine / max(1, cores))


def geometric_hosts(lo: int, hi: int) -> list:
    return [2 ** i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]
