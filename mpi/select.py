"""Choosing a transport: per call, by ZEN_HVD_TRANSPORT, or by the launcher.

    mpi4py   MPI point to point (Isend + matched probe) on a private communicator
    torch    torch.distributed point to point (gloo; NCCL for CUDA tensors)
    horovod  Horovod's collectives (alltoall with splits): no point to point
Default: mpi4py in an MPI job (mpirun, or horovodrun with MPI), since it moves bytes without
Horovod's background queue; torch.distributed otherwise (torchrun, `horovodrun --gloo`, where
there is no MPI job to join), except for a Horovod process set other than the global one
outside an MPI job, which takes Horovod's collectives.
"""
from __future__ import annotations

import os

from .transport import Transport

TRANSPORTS = ("horovod", "mpi4py", "torch")
ENV_VAR = "ZEN_HVD_TRANSPORT"
_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


def launched_by_mpi() -> bool:
    """True under mpirun / horovodrun-with-MPI; False under horovodrun --gloo, torchrun or no
    launcher."""
    return any(v in os.environ for v in _MPI_LAUNCHER_VARS) and \
        "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in os.environ


def _mpi_job(group) -> bool:
    """Whether the ranks form an MPI job that mpi4py can join."""
    if group.runtime == "horovod":
        import horovod.torch as hvd

        return hvd.mpi_enabled()
    return launched_by_mpi()


def default_transport_name(group) -> str:
    if _mpi_job(group):
        return "mpi4py"
    return "horovod" if group.runtime == "horovod" and group.handle is not None else "torch"


def resolve_transport_name(name, group) -> str:
    """The transport a sync of `group` (runtime.Group) uses: the argument, else
    ZEN_HVD_TRANSPORT, else the default above."""
    name = name or os.environ.get(ENV_VAR) or default_transport_name(group)
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}: choose one of {TRANSPORTS} "
                         f"(argument transport= or environment variable {ENV_VAR})")
    if name == "mpi4py" and not _mpi_job(group):
        raise RuntimeError("transport 'mpi4py' needs an MPI job (mpirun), and this one has none "
                           "(horovodrun --gloo or torchrun?); use transport='torch'")
    if name == "horovod" and group.runtime != "horovod":
        raise RuntimeError("transport 'horovod' needs Horovod running (horovodrun, or mpirun "
                           "with zen_hvd.init() and Horovod installed); use transport='torch'")
    return name


def make_transport(name: str, group, state) -> Transport:
    """A new transport `name` among the ranks of `group` (runtime.Group), whose agreed
    state (runtime.State) is `state`."""
    if name == "horovod":
        from .horovod_transport import HorovodTransport

        return HorovodTransport(group.handle)
    if name == "torch":
        from .torch_transport import TorchTransport

        return TorchTransport(group, state)
    from .mpi4py_transport import Mpi4pyTransport

    return Mpi4pyTransport(group.members())
