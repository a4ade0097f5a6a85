"""Horovod's helper functions, where a zen_hvd optimizer needs them to act differently."""
from __future__ import annotations

from horovod.torch import functions as _hvd_functions


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """horovod.torch.broadcast_optimizer_state, also for zen_hvd.DistributedOptimizer.

    Horovod initialises a new optimizer's state with one step(); it recognises its own wrapper
    by module and then steps the wrapped optimizer without communicating. A zen_hvd wrapper
    gets the same: its step() runs the wrapped optimizer only while this call lasts.
    """
    local_steps = getattr(optimizer, "_local_steps", None)
    if local_steps is None:
        return _hvd_functions.broadcast_optimizer_state(optimizer, root_rank, model)
    with local_steps():
        return _hvd_functions.broadcast_optimizer_state(optimizer, root_rank, model)
