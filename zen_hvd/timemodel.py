"""Time of one sync, not only its bytes: the wire, the message steps and the CPU.

    time(method) = max(wire, cpu x max(c, sharing)) + steps x latency

  wire     critical-path bytes (the busiest rank's larger of sent and received; costmodel.py for
           Zen's schemes) over the link rate: the link is busy that long at least;
  cpu      a + b x moved per rank: a fixed part per sync and a part per byte the rank sends and
           receives (moved = 2 x critical), calibrated per method and per transport kind
           ("shm": ranks of one machine, "tcp": ranks on hosts joined by a network) from the
           CPU time a rank spends per sync at a few measured points (calibrate);
  c        the critical path's share of CPU: a sync's rounds wait on the slowest rank's
           compute, so even a rank with a core of its own takes c x its CPU (c >= 1, one per
           transport kind, calibrated from the calibration launches' times where the CPU
           bounds them);
  sharing  ranks per core, where ranks share a machine's cores: their CPU then runs one
           after another (the emulated cluster's hosts are namespaces of one 2-core machine),
           which fills the waits c stands for; 1 on a cluster of one rank per core;
  steps    message steps of the method's pattern (a round whose messages wait on each other's
           arrival) x latency.
The CPU and the wire overlap (a rank computes while other ranks' bytes are on the wire), so the
slower of the two bounds the sync. Methods (bench.vs_horovod's names):
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


def calibrate(points) -> dict:
    """The model's constants from measured points, each dict(kind=, method=, n=, cpu_s=,
    time_s=, rate_bps=, sharing=, gradient=Gradient):
      (kind, method) -> (a, b): least squares of cpu_s = a + b x moved over a method's points
                      of a kind (b >= 0; a alone, the mean, with one size);
      (kind, "c") -> (c, 0): the median over the kind's CPU-bound points (wire under half the
                      time) of (time - steps x latency) / cpu_s, at least 1."""
    groups: dict = {}
    for p in points:
        moved = 2 * critical_bytes(p["method"], p["n"], p["gradient"])
        groups.setdefault((p["kind"], p["method"]), []).append((moved, p["cpu_s"]))
    out = {}
    for key, xy in groups.items():
        xs, ys = [x for x, _ in xy], [y for _, y in xy]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        b = max(0.0, sum((x - mx) * (y - my) for x, y in xy) / var) if var > 0 else 0.0
        out[key] = (my - b * mx, b)
    for kind in {p["kind"] for p in points}:
        ratios = sorted((p["time_s"] - steps(p["method"], p["n"]) * LATENCY_S[kind]) / (p["cpu_s"] * p["sharing"])
                        for p in points if p["kind"] == kind and p["cpu_s"] > 0
                        and critical_bytes(p["method"], p["n"], p["gradient"]) * 8 / p["rate_bps"] < 0.5 * p["time_s"])
        out[(kind, "c")] = (max(1.0, ratios[len(ratios) // 2]) if ratios else 1.0, 0.0)
    return out


def predict(method: str, n: int, g: Gradient, rate_bps: float, kind: str, constants: dict,
            sharing: float = 1.0, cpu_s: float | None = None) -> dict:
    """dict(time, wire, cpu, steps) in seconds for one sync of `method` on n ranks with
    links of rate_bps bits/s; cpu_s replaces the calibrated CPU per sync (a GPU kernel's time
    in a projection)."""
    wire = critical_bytes(method, n, g) * 8 / rate_bps if n > 1 else 0.0
    if cpu_s is None:
        a, b = constants[(kind, method)]
        cpu_s = a + b * 2 * critical_bytes(method, n, g)
    hops = steps(method, n) * LATENCY_S[kind]
    cpu = cpu_s * max(constants.get((kind, "c"), (1.0, 0.0))[0], sharing)
    return dict(time=max(wire, cpu) + hops, wire=wire, cpu=cpu, steps=hops)


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
