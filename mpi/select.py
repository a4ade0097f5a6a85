"""Choosing a transport: per call, by ZEN_HVD_TRANSPORT, or by the launcher.

Default: mpi4py when Horovod runs on MPI (mpirun, or horovodrun with MPI), since it moves bytes
without Horovod's background queue; Horovod's own collectives under `horovodrun --gloo`, where
there is no MPI job to join.
"""
from __future__ import annotations

import os

from .transport import Transport

TRANSPORTS = ("horovod", "mpi4py")
ENV_VAR = "ZEN_HVD_TRANSPORT"


def default_transport_name() -> str:
    import horovod.torch as hvd

    return "mpi4py" if hvd.mpi_enabled() else "horovod"


def resolve_transport_name(name: str | None = None) -> str:
    name = name or os.environ.get(ENV_VAR) or default_transport_name()
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
    from .mpi4py_transport import Mpi4pyTransport

    return Mpi4pyTransport(process_set)
