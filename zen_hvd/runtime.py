"""Process-wide state: Horovod initialisation, transports, partition-hash seeds, byte counters.

Seeds: h0 must be the same function on every rank (docs/algorithm.md §4). At the
first sync of a process set, rank 0 draws a seed and broadcasts it. ZEN_HVD_SEED (or
set_seed) fixes it instead; every rank then uses its own value and the header check catches
ranks that disagree.
"""
from __future__ import annotations

import dataclasses
import os
import secrets

import numpy as np

from .mpi import select, stall

_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
_transports: dict = {}
_resolved: dict = {}   # (transport argument, process set) -> transport: resolved once
_seeds: dict = {}
_keys: dict = {}       # seed -> h0's round keys


def launched_by_mpi() -> bool:
    """True under mpirun / horovodrun-with-MPI; False under horovodrun --gloo or no launcher."""
    return any(v in os.environ for v in _MPI_LAUNCHER_VARS) and \
        "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in os.environ


def init(*args, **kwargs):
    """horovod.torch.init, preceded (under an MPI launcher) by mpi4py's MPI initialisation with
    MPI_THREAD_MULTIPLE, so the mpi4py transport and Horovod's thread can share the job, and by
    stall.abort_on_uncaught (an uncaught error on one rank ends the MPI job)."""
    if launched_by_mpi():
        try:
            import mpi4py

            mpi4py.rc.thread_level = "multiple"
            from mpi4py import MPI  # noqa: F401  (initialises MPI)
        except ImportError:
            pass
        stall.abort_on_uncaught()
    import horovod.torch as hvd

    return hvd.init(*args, **kwargs)


def ensure_init():
    import horovod.torch as hvd

    if not hvd.is_initialized():
        raise ValueError("Horovod has not been initialized; call zen_hvd.init() first")


def _process_set_key(process_set):
    return None if process_set is None else getattr(process_set, "process_set_id", id(process_set))


def get_transport(name=None, process_set=None):
    """The (cached) transport of this name for this process set."""
    ensure_init()
    import horovod.torch as hvd

    if process_set is not None and process_set.process_set_id == hvd.global_process_set.process_set_id:
        process_set = None
    name = select.resolve_transport_name(name, process_set)
    key = (name, _process_set_key(process_set))
    if key not in _transports:
        if process_set is not None and not process_set.included():
            raise ValueError(f"this rank is not in process set {process_set}")
        _transports[key] = select.make_transport(name, process_set)
    return _transports[key]


@dataclasses.dataclass
class Context:
    """What one sync needs from the process: its transport, h0's seed and round keys."""

    transport: object
    seed: int
    keys: np.ndarray


def context(name=None, process_set=None) -> Context:
    """The transport (resolved and built at first use of this argument and process set, so the
    environment is read once), the partition-hash seed and its keys."""
    key = (name, _process_set_key(process_set))
    tr = _resolved.get(key)
    if tr is None:
        tr = _resolved[key] = get_transport(name, process_set)
        if launched_by_mpi():
            stall.abort_on_uncaught()
    seed = get_seed(tr, process_set)
    keys = _keys.get(seed)
    if keys is None:
        from .cuda_kernels import h0

        keys = _keys[seed] = h0.derive_keys(seed)
    return Context(tr, seed, keys)


def set_seed(seed: int, process_set=None) -> None:
    """Fix the partition-hash seed (must be the same on every rank of the process set)."""
    _seeds[_process_set_key(process_set)] = int(seed) & ((1 << 62) - 1)


def get_seed(transport, process_set=None) -> int:
    key = _process_set_key(process_set)
    if key not in _seeds:
        env = os.environ.get("ZEN_HVD_SEED")
        if env is not None:
            set_seed(int(env, 0), process_set)
        else:
            drawn = secrets.randbits(62) if transport.rank == 0 else 0
            set_seed(transport.broadcast_int(drawn, root=0), process_set)
    return _seeds[key]


def comm_stats() -> dict:
    """Bytes sent and received by this rank through every zen_hvd transport since the last
    reset (data bytes and control bytes: headers, counts, seeds), and the number of calls."""
    total: dict = {}
    for t in _transports.values():
        for k, v in t.stats.as_dict().items():
            total[k] = total.get(k, 0) + v
    return total or {"bytes_sent": 0, "bytes_received": 0, "control_bytes_sent": 0,
                     "control_bytes_received": 0, "calls": 0}


def reset_comm_stats() -> None:
    from .mpi.transport import CommStats

    for t in _transports.values():
        t.stats = CommStats()
