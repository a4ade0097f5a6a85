"""Elastic Horovod with zen_hvd: `hvd.elastic` as Horovod has it, with a reset that rebuilds Zen.

    import zen_hvd as hvd

    @hvd.elastic.run
    def train(state): ...

    train(hvd.elastic.TorchState(model, optimizer, epoch=0))

When a worker leaves or joins, Horovod's run() catches the HorovodInternalError (or the hosts
update), restores the last commit, shuts Horovod down and initialises it again with the new
ranks, then broadcasts the state from rank 0. zen_hvd's reset adds one step to Horovod's: it
forgets the transports, the partition-hash seed and auto's decisions made for the old ranks
(runtime.reset), so the next sync agrees them again among the new ones. A Zen sync that loses a
peer raises HorovodInternalError like Horovod's own collectives, so the same loop recovers it.
"""
from __future__ import annotations

from horovod.common.elastic import run_fn
from horovod.torch.elastic import ElasticSampler, TorchState  # noqa: F401
from horovod.torch.mpi_ops import init, shutdown

from . import runtime

__all__ = ["ElasticSampler", "TorchState", "run"]


def run(func):
    """horovod.torch.elastic.run (see its docstring), resetting zen_hvd with Horovod."""
    return run_fn(func, _reset)


def _reset():
    shutdown()
    init()
    runtime.reset()
