"""The two-level sync for hosts with several ranks (the paper's §4, docs/algorithm.md §7):
aggregate inside the host, Zen across hosts on each share, gather inside the host.

With L ranks on each of H hosts (n = H L), local rank l owns share l of the M units: the units
u with pi(u) mod L = l, at positions j = pi(u) div L (h0 over L servers: the keyed bijection of
balanced parallelism, so the shares are balanced). One sync is balanced parallelism among the
L ranks of the host (the local transport), with the shares summed across hosts in between:

  1. inside the host: Push and aggregation (balanced.py): local rank l receives its host's
     units of share l and sums them in local rank order, a sparse reduce-scatter;
  2. across hosts (the cross transport: local rank l of every host): share l, a sparse tensor
     of |I_l| rows indexed by j, is summed by the scheme asked for (balanced, hierarchical,
     any of schemes.SCHEMES, or auto on the cross ranks' own profile), ascending and bitwise
     alike on every host; then scaled (Average's 1/n, the postscale factor);
  3. inside the host: Pull (hash bitmap or positions) and decode: every local rank receives
     every share, so every rank ends with the same bits.

Bytes leaving a host: the host's union once (gamma_L k units, gamma_L <= L) instead of every
local rank's k units, and the union's shares once each (costmodel.two_level_bytes). The hosts
come from the transport (Transport.group_hosts: host name and outward address, on every
transport that can split, or ZEN_HVD_RANKS_PER_HOST), and it applies when every host runs
the same number of ranks, more than one, and there is more than one host.

ZEN_HVD_TWO_LEVEL (or two_level= of a sync): "on", "off", or "auto" (default): per tensor,
auto.py's profile compares the two by the cost model (costmodel.two_level_costs).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os

import numpy as np
import torch

from . import ops
from .backend import HOST
from .balanced import BalancedParallelism, Servers
from .header import COL, COUNTS, exchange
from .units import INDEX_OUT_OF_RANGE, OK

MODE_VAR = "ZEN_HVD_TWO_LEVEL"
MODES = ("auto", "on", "off")
log = logging.getLogger("zen_hvd")
syncs = 0   # two-level syncs this process ran


@dataclasses.dataclass
class Levels:
    """The two transports of a two-level sync, split once from the transport of all ranks."""

    local: object          # the L ranks of this rank's host
    cross: object          # the H ranks with this rank's local rank, one per host
    local_state: object    # what each level's ranks agree on (runtime.State: auto's profiles)
    cross_state: object

    @property
    def hosts(self) -> int:
        return self.cross.size

    @property
    def per_host(self) -> int:
        return self.local.size

    def close(self) -> None:
        self.local.close()
        self.cross.close()


def mode(argument=None) -> str:
    """two_level= of a sync, else ZEN_HVD_TWO_LEVEL, else "auto"."""
    m = argument if argument is not None else os.environ.get(MODE_VAR) or "auto"
    m = {True: "on", False: "off"}.get(m, m)
    if m not in MODES:
        raise ValueError(f"two_level ({MODE_VAR}) must be one of {MODES}, not {m!r}")
    return m


def levels(tr):
    """The transport's Levels, split at the first call (every rank of the transport calls it
    at the same sync), or None where two levels do not apply: one host, one rank per host,
    hosts with different numbers of ranks, or a transport that cannot split."""
    lv = getattr(tr, "_levels", False)
    if lv is not False:
        return lv
    lv = None
    per_host = collections.Counter(tr.host_of or [])
    if tr.host_of is not None and 1 < tr.hosts < tr.size and len(set(per_host.values())) == 1:
        from .runtime import Group, State

        host = tr.host_of[tr.rank]
        local = tr.split(host)
        if local is not None:
            cross = tr.split(local.rank)
            # Each level's own agreements (auto's profiles, unnamed syncs' counter); its
            # transport is given, so the State's group only names it.
            lv = Levels(local, cross, State(Group("two-level local")), State(Group("two-level cross")))
    elif tr.host_of is not None and 1 < tr.hosts < tr.size and tr.rank == 0:
        log.warning("zen_hvd: the hosts run different numbers of ranks (%s): the flat sync serves them",
                    dict(per_host))
    tr._levels = lv
    return lv


def close(tr) -> None:
    lv = getattr(tr, "_levels", None)
    if lv:
        lv.close()


class TwoLevel:
    """The sync above, on the host data path; a scheme as schemes.py's, built per call."""

    name = "two-level"
    device = False
    header_in_push = True

    def __init__(self, lv: Levels, scheme: str, measure: bool):
        from .schemes import SCHEMES

        self.lv, self.scheme, self.measure = lv, scheme, measure
        self.code = self.header_code(None if scheme == "auto" else SCHEMES[scheme].code)

    @staticmethod
    def header_code(scheme_code) -> int:
        """The header's scheme: the code of the scheme across hosts (None: auto), past the
        flat schemes' codes."""
        return 32 + (15 if scheme_code is None else scheme_code)

    def sync(self, req, header, ctx, be):
        from . import runtime

        global syncs
        syncs += 1
        lv, parent = self.lv, ctx.transport
        for t in (lv.local, lv.cross):
            t.activity, t.syncs = parent.activity, parent.syncs
        before = [dataclasses.replace(t.stats) for t in (lv.local, lv.cross)]
        local_ctx = runtime.Context(lv.local, ctx.seed, ctx.keys, lv.local_state)
        cross_ctx = runtime.Context(lv.cross, ctx.seed, ctx.keys, lv.cross_state)
        M = req.layout.num_units
        servers = Servers(M, lv.per_host, ctx.keys)

        def across(positions, values):
            return self._across(req, cross_ctx, servers.size(lv.local.rank), positions, values)

        # Every rank's header to every rank first (as header.exchange does for the schemes
        # without their own Push): a mismatch or a bad input anywhere raises the same error on
        # every rank, before any rank waits on a level the others have left.
        with be.step("units (non-zero rows, or coalesce)"):
            src = be.source(req.tensor, req.layout)
        header = header.copy()
        header[COL["error"]], header[COL["error_detail"]] = src.error, src.detail
        units = np.asarray(src.units) if src.error == OK else np.zeros(0, np.int64)
        outside = np.flatnonzero((units < 0) | (units >= M)) if units.size else ()
        if len(outside):
            header[COL["error"]], header[COL["error_detail"]] = INDEX_OUT_OF_RANGE, units[outside[0]]
        header[COL["nnz"]] = units.size
        try:
            with be.step("header check"):
                table = exchange(req.name, header, parent, req.scheme_names)
            head = np.concatenate([header[:COUNTS], np.zeros(lv.per_host, np.int64)])
            units, values, info = BalancedParallelism().sync(
                dataclasses.replace(req, scale=1.0, divisor=0), head, local_ctx, be, across=across, src=src)
        finally:
            parent.broken |= lv.local.broken or lv.cross.broken
            self._count(parent, before)
        # Every rank's units as it holds them (an uncoalesced tensor's repeats included); on a
        # check call as its Push counted them (each unit once), with the hosts' unions, for
        # auto's profile: the same on every rank.
        nnz = table[:, COL["nnz"]]
        if self.measure:
            got = parent.allgather_int64([int(info["nnz"][lv.local.rank]), int(info["host_union"])])
            nnz, info["host_union"] = got[:, 0], float(got[:, 1].sum()) / lv.hosts
        return units, values, dict(info, nnz=nnz, two_level=True)

    def _across(self, req, cross_ctx, size, positions, values):
        """Share `positions` (ascending, of `size`), `values` summed across the hosts and
        scaled: (positions, values) ascending, the same on every host."""
        from .sync import allreduce_units

        D = req.layout.unit_size
        j = torch.from_numpy(np.asarray(positions, np.int64)).reshape(1, -1)
        share = torch.sparse_coo_tensor(j, torch.from_numpy(np.asarray(values)), (size, D), is_coalesced=True,
                                        check_invariants=False)
        _, units, summed, _ = allreduce_units(share, req.name, ops.Sum, scheme=self.scheme, ctx=cross_ctx,
                                              two_level="off")
        summed = np.ascontiguousarray(summed.numpy())
        HOST.scale_rows(summed, req.scale, req.divisor)
        return units, summed

    @staticmethod
    def _count(parent, before) -> None:
        """The bytes of both levels, into the transport of all ranks: inside the host (local)
        and across hosts (cross, every byte off host)."""
        lv = parent._levels
        for t, b in zip((lv.local, lv.cross), before):
            s = t.stats
            off = t is lv.cross
            parent.stats.add(s.bytes_sent - b.bytes_sent, s.bytes_received - b.bytes_received,
                             off_host=((s.bytes_sent - b.bytes_sent) * off, (s.bytes_received - b.bytes_received) * off))
            parent.stats.add(s.control_bytes_sent - b.control_bytes_sent,
                             s.control_bytes_received - b.control_bytes_received, control=True,
                             off_host=((s.control_bytes_sent - b.control_bytes_sent) * off,
                                       (s.control_bytes_received - b.control_bytes_received) * off))
