"""Time of one sync, not only its bytes: the wire, the message steps and the CPU.

    time(method) = max(wire, S) + alpha x min(wire, S) + steps x latency,
    S = cpu x max(1, sharing)

  wire     critical-path bytes (the busiest rank's larger of sent and received; costmodel.py for
           Zen's schemes) over the link rate: the link is busy that long at least;
  cpu      a rank's CPU seconds per sync, measured (calibrate): per method, per transport kind
           ("shm": ranks of one machine, "tcp": ranks on hosts joined by a network) and per
           link rate, at the calibration's largest launch (3 ranks). It is not grown with n:
           on the machine this was checked on a rank's CPU per sync stayed within a factor
           of 1.6 from 2 to 16 hosts at a given rate, because ranks poll while they wait, so
           their CPU follows the time they wait as much as the bytes they move (a fit of a
           part per message and a part per byte at 2 and 3 hosts came out 10 to 60x too
           high at 16; see the note of bench.model_check);
  sharing  ranks per core, where ranks share a machine's cores: their CPU then runs one
           after another (the emulated cluster's hosts are namespaces of one 2-core machine);
           1 on a cluster of one rank per core;
  alpha    the part of the shorter of wire and CPU that does not overlap the longer (a rank
           computes while other ranks' bytes are on the wire, but not all the time): one per
           transport kind, fitted on the calibration launches;
  steps    message steps of the method's pattern x latency.
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


def calibrate(points) -> dict:
    """The model's constants from measured points, each dict(kind=, method=, n=, rate=,
    cpu_s=, time_s=, rate_bps=, sharing=, gradient=Gradient):
      (kind, method, rate) -> cpu_s at the largest n measured there;
      (kind, "alpha") -> least squares of what the time exceeds max(wire, S) + steps x
                         latency by, against min(wire, S), within [0, 1]."""
    out, largest = {}, {}
    for p in points:
        key = (p["kind"], p["method"], p["rate"])
        if p["n"] >= largest.get(key, 0):
            largest[key], out[key] = p["n"], p["cpu_s"]
    for kind in {p["kind"] for p in points}:
        over = []
        for p in points:
            if p["kind"] != kind:
                continue
            wire = critical_bytes(p["method"], p["n"], p["gradient"]) * 8 / p["rate_bps"]
            S = out[(kind, p["method"], p["rate"])] * max(1.0, p["sharing"])
            over.append((min(wire, S), p["time_s"] - max(wire, S) - steps(p["method"], p["n"]) * LATENCY_S[kind]))
        den = sum(m * m for m, _ in over)
        out[(kind, "alpha")] = min(1.0, max(0.0, sum(m * r for m, r in over) / den)) if den else 0.0
    return out


def predict(method: str, n: int, g: Gradient, rate_bps: float, kind: str, constants: dict,
            sharing: float = 1.0, cpu_s: float | None = None, rate: str = "") -> dict:
    """dict(time, wire, cpu, steps) in seconds for one sync of `method` on n ranks with
    links of rate_bps bits/s (`rate`: its label in the calibration, "shared memory" on one
    machine); cpu_s replaces the calibrated CPU per sync (a GPU kernel's time in a
    projection)."""
    wire = critical_bytes(method, n, g) * 8 / rate_bps if n > 1 else 0.0
    if cpu_s is None:
        cpu_s = constants[(kind, method, rate or "shared memory")]
    hops = steps(method, n) * LATENCY_S[kind]
    cpu = cpu_s * max(1.0, sharing)
    alpha = constants.get((kind, "alpha"), 0.0)
    return dict(time=max(wire, cpu) + alpha * min(wire, cpu) + hops, wire=wire, cpu=cpu, steps=hops)


def save(constants: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump({"|".join(k): v for k, v in constants.items()}, f, indent=1)


def load(path: str) -> dict:
    with open(path) as f:
        return {tuple(key.split("|")): v for key, v in json.load(f).items()}


def sharing(ranks_on_machine: int, cores: int) -> float:
    """Ranks per core where ranks share a machine's cores (at least 1)."""
    return max(1.0, ranks_on_machine / max(1, cores))


def geometric_hosts(lo: int, hi: int) -> list:
    return [2 ** i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]
