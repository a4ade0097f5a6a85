"""Who the ranks are, and what the ranks of one group agree on.

Ranks come from one of two runtimes:
  horovod  when Horovod is initialised (horovodrun, or mpirun with Horovod installed): Horovod's
           rank and size, and its process sets (process_set=);
  torch    otherwise, torch.distributed: the default group (torchrun's env://, a group the
           application initialised, or mpirun without Horovod) or a group the caller passes
           (process_group=).
zen_hvd.init() starts the one the launcher implies (init below). Nothing here imports Horovod
unless Horovod is what runs.

A Group names the ranks of one sync; a State, one per group, holds what those ranks agree on:
their transports, h0's seed (docs/algorithm.md §4: h0 must be the same function on every rank;
at the first sync rank 0 draws a seed and broadcasts it, unless ZEN_HVD_SEED or set_seed fixes
it, in which case the header check catches ranks that disagree), auto's per-tensor profiles and
the counter that names unnamed syncs. reset() drops every State: when the ranks change (elastic
Horovod after a worker left or joined, a torchelastic restart) everything agreed among the old
ranks goes, and the new ranks agree again at their first sync. zen_hvd.elastic.run resets
explicitly; a sync that finds its transport broken (a peer lost) or its rank or size changed
resets as well. Seeds fixed by set_seed or ZEN_HVD_SEED stay.
"""
from __future__ import annotations

import atexit
import dataclasses
import datetime
import itertools
import logging
import os
import secrets
import sys

import numpy as np
import torch
import torch.distributed as dist

from .mpi import select, stall
from .mpi.select import launched_by_mpi

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SEED_BITS = (1 << 62) - 1
log = logging.getLogger("zen_hvd")
generation = 0   # how many resets this process has seen


# -- launchers and initialisation ---------------------------------------------------------
def launched_by_torchrun() -> bool:
    """True under torchrun (or any launcher that sets torch.distributed's env:// variables and
    is not an MPI or Horovod launcher)."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return True
    return all(v in os.environ for v in _TORCHRUN_VARS) and not launched_by_mpi() \
        and "HOROVOD_RANK" not in os.environ


def horovod():
    """horovod.torch if this process runs Horovod (imported and initialised), else None."""
    hvd = sys.modules.get("horovod.torch")
    return hvd if hvd is not None and hvd.is_initialized() else None


def init(*args, **kwargs):
    """Start the runtime the launcher implies:
      - torchrun: torch.distributed from env:// (unless the application initialised it
        already), gloo for CPU tensors and NCCL for CUDA tensors ("cpu:gloo,cuda:nccl") when
        CUDA is there;
      - horovodrun, or mpirun with Horovod installed: horovod.torch.init(*args, **kwargs),
        preceded under an MPI launcher by mpi4py's MPI initialisation with
        MPI_THREAD_MULTIPLE, so the mpi4py transport and Horovod's thread share the job;
      - mpirun without Horovod: torch.distributed (gloo) among the MPI ranks, rank 0's address
        broadcast through MPI;
      - no launcher: Horovod's single process if Horovod is installed, else torch.distributed
        with one rank.
    Under an MPI launcher an uncaught error then ends the whole job (stall.abort_on_uncaught)."""
    if launched_by_torchrun():
        return _init_torch("env://", None, None)
    if launched_by_mpi():
        try:
            import mpi4py

            mpi4py.rc.thread_level = "multiple"
            from mpi4py import MPI  # noqa: F401  (initialises MPI)
        except ImportError:
            pass
        stall.abort_on_uncaught()
    try:
        import horovod.torch as hvd
    except ImportError:
        if "HOROVOD_RANK" in os.environ:
            raise ImportError("zen_hvd.init(): horovodrun started this process, but Horovod "
                              "cannot be imported here") from None
        hvd = None
    if hvd is not None:
        return hvd.init(*args, **kwargs)
    if launched_by_mpi():
        from mpi4py import MPI

        from .mpi.torch_transport import free_port, own_address

        world = MPI.COMM_WORLD
        address = world.bcast(f"tcp://{own_address()}:{free_port()}" if world.rank == 0 else None)
        return _init_torch(address, world.rank, world.size)
    from .mpi.torch_transport import free_port

    return _init_torch(f"tcp://127.0.0.1:{free_port()}", 0, 1)


def _init_torch(method, rank, size):
    if dist.is_initialized():
        return None
    backend = "gloo"
    if torch.cuda.is_available():
        # NCCL refuses two ranks on one GPU: with more local ranks than GPUs, gloo moves
        # CUDA tensors too (through host memory).
        local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        backend = "cpu:gloo,cuda:nccl" if local <= torch.cuda.device_count() else "cpu:gloo,cuda:gloo"
        if backend.endswith("gloo") and int(os.environ.get("LOCAL_RANK", 0)) == 0:
            log.warning("zen_hvd.init(): %d local ranks share %d GPU(s), and NCCL refuses two ranks "
                        "on one device: torch.distributed moves CUDA tensors with gloo", local,
                        torch.cuda.device_count())
    kw = {} if rank is None else dict(rank=rank, world_size=size)
    dist.init_process_group(backend, init_method=method, timeout=_group_timeout(), **kw)
    atexit.register(_shutdown_torch)
    return None


def _shutdown_torch():
    """At exit, the groups zen_hvd made, then the default group zen_hvd.init() made: gloo's
    threads must not outlive the interpreter (one dropping a tensor then aborts the process)."""
    reset()
    if dist.is_initialized():
        dist.destroy_process_group()


def _group_timeout() -> datetime.timedelta:
    """The timeout of a gloo group zen_hvd makes: the stall shutdown time (stall.py), after
    which a wait for a peer gives up (a week for 0, which waits forever elsewhere)."""
    from .mpi.torch_transport import _timeout

    return _timeout()


def initialized() -> bool:
    """Whether a runtime is up (Horovod initialised, or torch.distributed)."""
    return horovod() is not None or dist.is_available() and dist.is_initialized()


def ensure_init():
    if not initialized():
        raise ValueError("zen_hvd has not been initialized; call zen_hvd.init() first (or "
                         "torch.distributed.init_process_group)")


# -- groups -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Group:
    """The ranks of one sync: a Horovod process set or a torch.distributed group (handle None:
    every rank of the runtime)."""

    runtime: str                  # "horovod" or "torch"
    handle: object = dataclasses.field(compare=False, default=None)
    key: tuple = ()

    def world(self) -> tuple:
        """(rank, size) of this process in the group, as the runtime has it now (rank -1 when
        this process is not in it)."""
        if self.runtime == "horovod":
            ps = self.handle
            hvd = horovod()
            if ps is None:
                return hvd.rank(), hvd.size()
            return (ps.rank() if ps.included() else -1), ps.size()
        return dist.get_rank(self.handle), dist.get_world_size(self.handle)

    def members(self):
        """The global ranks of the group, ascending, or None for every rank."""
        if self.handle is None:
            return None
        if self.runtime == "horovod":
            return sorted(self.handle.ranks) if self.handle.ranks is not None else None
        return sorted(dist.get_process_group_ranks(self.handle))

    def local(self) -> tuple:
        """(local rank, local size) of this process on its host."""
        if self.runtime == "horovod":
            hvd = horovod()
            return hvd.local_rank(), hvd.local_size()
        return (int(os.environ.get("LOCAL_RANK", 0)),
                int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1))))

    def describe(self) -> str:
        return "every rank" if self.handle is None else f"{self.runtime} group {self.members()}"


def group_of(process_set=None, process_group=None) -> Group:
    """The Group of a sync's process_set= (Horovod) or process_group= (torch.distributed)."""
    if process_set is not None and process_group is not None:
        raise ValueError("pass process_set= (a Horovod process set) or process_group= (a "
                         "torch.distributed group), not both")
    ensure_init()
    hvd = horovod()
    if process_group is None and hvd is not None:
        if process_set is not None and process_set.process_set_id == hvd.global_process_set.process_set_id:
            process_set = None
        return Group("horovod", process_set, ("horovod", getattr(process_set, "process_set_id", None)))
    if process_set is not None:
        raise ValueError("process_set= is a Horovod process set, and Horovod is not running; "
                         "pass process_group= (a torch.distributed group)")
    if process_group is None or process_group == dist.group.WORLD:
        return Group("torch", None, ("torch", None))
    return Group("torch", process_group, ("torch", tuple(dist.get_process_group_ranks(process_group))))


# -- what the ranks of one group agree on ------------------------------------------------
class State:
    """Per group: its transports, h0's drawn seed, auto's profiles, the unnamed-sync counter,
    and (torch runtime) the gloo group zen_hvd's messages and agreements use."""

    def __init__(self, group: Group):
        self.group = group
        self.transports = {}        # transport name -> Transport
        self.seed = None            # drawn by rank 0 at the first sync (forgotten by reset)
        self.profiles = {}          # auto.py: tensor name -> Profile
        self.unnamed = itertools.count()
        self._gloo = None

    def gloo(self):
        """A gloo group of this group's ranks for zen_hvd's own messages (torch runtime), made
        once: apart from the application's groups, whose collectives may run meanwhile from
        another thread (DDP's). Only the group's ranks make it, and no rendezvous is needed."""
        if self._gloo is None:
            self._gloo = dist.new_group(ranks=self.group.members(), backend="gloo",
                                        timeout=_group_timeout(), use_local_synchronization=True)
        return self._gloo

    def close(self):
        from . import two_level

        for t in self.transports.values():
            two_level.close(t)
            t.close()
        if self._gloo is not None:
            try:
                dist.destroy_process_group(self._gloo)
            except (RuntimeError, ValueError, AssertionError):   # already gone with its peers
                pass


_states: dict = {}     # group key -> State
_resolved: dict = {}   # (transport argument, group key) -> transport: resolved once
_seeds: dict = {}      # group key -> seed fixed by set_seed (kept by reset)
_keys: dict = {}       # seed -> h0's round keys
_closes_at_exit = False


def states() -> list:
    return list(_states.values())


def state_of(group: Group) -> State:
    global _closes_at_exit
    state = _states.get(group.key)
    if state is None:
        state = _states[group.key] = State(group)
        if not _closes_at_exit:   # gloo's threads must not outlive the interpreter
            atexit.register(reset)
            _closes_at_exit = True
    return state


def get_transport(name=None, process_set=None, process_group=None):
    """The (cached) transport of this name for this process set or group."""
    group = group_of(process_set, process_group)
    state = state_of(group)
    name = select.resolve_transport_name(name, group)
    if name not in state.transports:
        if group.world()[0] < 0:
            raise ValueError(f"this rank is not in {group.describe()}")
        state.transports[name] = select.make_transport(name, group, state)
    return state.transports[name]


@dataclasses.dataclass
class Context:
    """What one sync needs from the process: its transport, h0's seed and round keys, and the
    state its group agrees on."""

    transport: object
    seed: int
    keys: np.ndarray
    state: State


def context(name=None, process_set=None, process_group=None) -> Context:
    """The transport (resolved and built at the first use of this argument and group, so the
    environment is read once), the partition-hash seed and its keys."""
    cache = (name, id(process_set), id(process_group))
    hit = _resolved.get(cache)
    if hit is not None:
        tr, state = hit
        if tr.broken or (tr.rank, tr.size) != state.group.world():
            reset()
            hit = None
    if hit is None:
        group = group_of(process_set, process_group)
        state = state_of(group)
        agree_transport(select.resolve_transport_name(name, group), state)
        tr = get_transport(name, process_set, process_group)
        _resolved[cache] = tr, state
        if launched_by_mpi():
            stall.abort_on_uncaught()
    seed = get_seed(tr, state)
    keys = _keys.get(seed)
    if keys is None:
        from .cuda_kernels import h0

        keys = _keys[seed] = h0.derive_keys(seed)
    return Context(tr, seed, keys, state)


def reset() -> None:
    """Forget what was agreed among the current ranks (see the module docstring)."""
    global generation
    for state in _states.values():
        state.close()
    _states.clear()
    _resolved.clear()
    generation += 1


def agree_transport(name: str, state: State) -> None:
    """At the first use of a transport on a group, the ranks compare the transports they
    resolved over a channel every rank has whatever it resolved (Horovod's allgather, or the
    group's own gloo group): ranks that would wait on different channels (transport= or
    ZEN_HVD_TRANSPORT set on some ranks only) get this error on every rank instead. The wait
    is under the stall deadline; once it ends every rank of the group is there, so the
    transport's construction (MPI's blocking Create_group for a process set) starts on all
    of them."""
    group = state.group
    if name in state.transports or group.world()[1] == 1:
        return
    code = torch.tensor([select.TRANSPORTS.index(name)], dtype=torch.int64)
    what = lambda: f"the agreement on the transport ({name!r} here)"  # noqa: E731
    missing = lambda: "every rank's first sync (has a rank died, or does one sync less?)"  # noqa: E731
    policy = stall.Policy.from_env(0.001)
    if group.runtime == "horovod":
        hvd = horovod()
        ps = group.handle if group.handle is not None else hvd.global_process_set
        # One name per process set: agreements follow one another, and a rank that joined
        # after a reset names its first one as the others do.
        handle = hvd.allgather_async(code, name=f"zen_hvd.transport.{ps.process_set_id}",
                                     process_set=ps)
        stall.wait(lambda: hvd.poll(handle), policy, what, missing)
        codes = hvd.synchronize(handle).tolist()
    else:
        out = torch.empty(group.world()[1], dtype=torch.int64)
        work = dist.all_gather_into_tensor(out, code, group=state.gloo(), async_op=True)
        stall.wait(work.is_completed, policy, what, missing)
        work.wait()
        codes = out.tolist()
    if len(set(codes)) > 1:
        from .header import TensorMismatchError

        each = ", ".join(f"rank {r}: {select.TRANSPORTS[c]!r}" for r, c in enumerate(codes))
        raise TensorMismatchError(f"zen_hvd: the ranks resolved different transports ({each}); "
                                  f"transport= and {select.ENV_VAR} must agree on every rank")


def set_seed(seed: int, process_set=None, process_group=None) -> None:
    """Fix the partition-hash seed (must be the same on every rank of the group)."""
    _seeds[group_of(process_set, process_group).key] = int(seed) & SEED_BITS


def get_seed(transport, state: State) -> int:
    fixed = _seeds.get(state.group.key)
    if fixed is not None:
        return fixed
    if state.seed is None:
        env = os.environ.get("ZEN_HVD_SEED")
        if env is not None:
            _seeds[state.group.key] = int(env, 0) & SEED_BITS
            return _seeds[state.group.key]
        drawn = secrets.randbits(62) if transport.rank == 0 else 0
        state.seed = transport.broadcast_int(drawn, root=0) & SEED_BITS
    return state.seed


def _all_transports():
    return [t for state in _states.values() for t in state.transports.values()]


def comm_stats() -> dict:
    """Bytes sent and received by this rank through every zen_hvd transport since the last
    reset (data bytes and control bytes: headers, counts, seeds), and the number of calls."""
    total: dict = {}
    for t in _all_transports():
        for k, v in t.stats.as_dict().items():
            total[k] = total.get(k, 0) + v
    return total or {"bytes_sent": 0, "bytes_received": 0, "control_bytes_sent": 0,
                     "control_bytes_received": 0, "calls": 0}


def reset_comm_stats() -> None:
    from .mpi.transport import CommStats

    for t in _all_transports():
        t.stats = CommStats()


# -- zen_hvd.rank() and friends, on either runtime -------------------------------------------
def rank() -> int:
    return group_of().world()[0]


def size() -> int:
    return group_of().world()[1]


def local_rank() -> int:
    return group_of().local()[0]


def local_size() -> int:
    return group_of().local()[1]
