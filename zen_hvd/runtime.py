"""Process-wide state: Horovod initialisation, transports, partition-hash seeds, byte counters.

Seeds: h0 must be the same function on every rank (docs/algorithm.md §4). At the
first sync of a process set, rank 0 draws a seed and broadcasts it. ZEN_HVD_SEED (or
set_seed) fixes it instead; every rank then uses its own value and the header check catches
ranks that disagree.

Resets: when Horovod is initialised again with other ranks (elastic Horovod after a worker
left or joined), everything built for the old ranks goes: transports, drawn seeds, and auto's
per-tensor decisions (which count calls, and a new worker has made none). zen_hvd.elastic.run
resets explicitly; a sync that finds its transport broken (a peer lost) or Horovod's rank or
size changed resets as well.
"""
from __future__ import annotations

import dataclasses
import os
import secrets

import numpy as np
import torch

from .mpi import select, stall

_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
_transports: dict = {}
_resolved: dict = {}   # (transport argument, process set) -> transport: resolved once
_seeds: dict = {}      # process set -> seed fixed by set_seed
_drawn: dict = {}      # process set -> seed drawn by rank 0 (forgotten by reset)
_keys: dict = {}       # seed -> h0's round keys
generation = 0         # how many resets this process has seen


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


def _normalised(process_set):
    """None for the global process set."""
    import horovod.torch as hvd

    if process_set is not None and process_set.process_set_id == hvd.global_process_set.process_set_id:
        return None
    return process_set


def get_transport(name=None, process_set=None):
    """The (cached) transport of this name for this process set."""
    ensure_init()
    process_set = _normalised(process_set)
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
    if tr is not None and (tr.broken or (tr.rank, tr.size) != _world(process_set)):
        reset()
        tr = None
    if tr is None:
        ensure_init()
        agree_transport(select.resolve_transport_name(name, _normalised(process_set)), process_set)
        tr = _resolved[key] = get_transport(name, process_set)
        if launched_by_mpi():
            stall.abort_on_uncaught()
    seed = get_seed(tr, process_set)
    keys = _keys.get(seed)
    if keys is None:
        from .cuda_kernels import h0

        keys = _keys[seed] = h0.derive_keys(seed)
    return Context(tr, seed, keys)


def _world(process_set):
    """(rank, size) of this process in the process set as Horovod has it now."""
    import horovod.torch as hvd

    if process_set is None:
        return hvd.rank(), hvd.size()
    return process_set.rank(), process_set.size()


def reset() -> None:
    """Forget what was built for the current ranks (see the module docstring); seeds fixed by
    set_seed or ZEN_HVD_SEED stay."""
    global generation
    from . import auto

    for t in _transports.values():
        t.close()
    _transports.clear()
    _resolved.clear()
    _drawn.clear()
    auto.reset()
    generation += 1


def agree_transport(name: str, process_set=None) -> None:
    """At the first use of a transport argument on a process set, the ranks compare the
    transports they resolved, through Horovod's allgather: every rank has that channel whatever
    it resolved, so ranks that would wait on different channels (transport= or
    ZEN_HVD_TRANSPORT set on some ranks only) get this error on every rank instead. (Ranks
    that first use an argument at different calls still meet in neither: the stall deadline
    of the rank waiting in its sync ends the job.) The wait is under the stall deadline; once
    it ends every rank of the set is there, so the transport's construction (MPI's blocking
    Create_group for a process set) starts on all of them."""
    import horovod.torch as hvd

    ps = process_set if process_set is not None else hvd.global_process_set
    if ps.size() == 1:
        return
    code = torch.tensor([select.TRANSPORTS.index(name)], dtype=torch.int64)
    # One name per process set: agreements follow one another, and a rank that joined after a
    # reset names its first one as the others do.
    handle = hvd.allgather_async(code, name=f"zen_hvd.transport.{ps.process_set_id}",
                                 process_set=ps)
    stall.wait(lambda: hvd.poll(handle), stall.Policy.from_env(0.001),
               lambda: f"the agreement on the transport ({name!r} here)",
               lambda: "every rank's first sync (has a rank died, or does one sync less?)")
    codes = hvd.synchronize(handle).tolist()
    if len(set(codes)) > 1:
        from .header import TensorMismatchError

        each = ", ".join(f"rank {r}: {select.TRANSPORTS[c]!r}" for r, c in enumerate(codes))
        raise TensorMismatchError(f"zen_hvd: the ranks resolved different transports ({each}); "
                                  f"transport= and {select.ENV_VAR} must agree on every rank")


def set_seed(seed: int, process_set=None) -> None:
    """Fix the partition-hash seed (must be the same on every rank of the process set)."""
    _seeds[_process_set_key(process_set)] = int(seed) & ((1 << 62) - 1)


def get_seed(transport, process_set=None) -> int:
    key = _process_set_key(process_set)
    if key in _seeds:
        return _seeds[key]
    if key not in _drawn:
        env = os.environ.get("ZEN_HVD_SEED")
        if env is not None:
            set_seed(int(env, 0), process_set)
            return _seeds[key]
        drawn = secrets.randbits(62) if transport.rank == 0 else 0
        _drawn[key] = transport.broadcast_int(drawn, root=0) & ((1 << 62) - 1)
    return _drawn[key]


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
