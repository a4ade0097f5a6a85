"""Choosing a transport: per call, by ZEN_HVD_TRANSPORT, or by the launcher.

    mpi4py   MPI point to point (Isend + matched probe) on a private communicator
    torch    torch.distributed point to point (gloo; NCCL for CUDA tensors)
    horovod  Horovod's collectives (alltoall with splits): no point to point
Default: mpi4py when Horovod runs on MPI (mpirun, or horovodrun with MPI), since it moves bytes
without Horovod's background queue; torch.distributed under `horovodrun --gloo`, where there
is no MPI job to join (Horovod's collectives for a process set other than the global one).
"""
from __future__ import annotations

import os

from .transport import Transport

TRANSPORTS = ("horovod", "mpi4py", "torch")
ENV_VAR = "ZEN_HVD_TRANSPORT"


def default_transport_name(process_set=None) -> str:
    import horovod.torch as hvd

    if hvd.mpi_enabled():
        return "mpi4py"
    return "torch" if process_set is None else "horovod"


def resolve_transport_name(name: str | None = None, process_set=None) -> str:
    name = name or os.environ.get(ENV_VAR) or default_transport_name(process_set)
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}: choose one of {TRANSPORTS} "
                         f"(argument transport= or environment variable {ENV_VAR})")
    if name == "mpi4py":
        import horovod.torch as hvd

        if not hvd.mpi_enabled():
            raise RuntimeError("transport 'mpi4py' needs an MPI job, but Horovod is running "
                               "without MPI (horovodrun --gloo?); use transport='horovod'")
    return name


def make_transport(name: str, process_set=None) -> Transport:
    if name == "horovod":
        from .horovod_transport import HorovodTransport

        return HorovodTransport(process_set)
    if name == "torch":
        from .torch_transport import TorchTransport

        return TorchTransport(process_set)
    from .mpi4py_transport import Mpi4pyTransport

    return Mpi4pyTransport(process_set)
