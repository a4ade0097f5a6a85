"""zen_hvd: Zen's balanced-parallelism sparse allreduce for Horovod and PyTorch.

    import torch, zen_hvd
    zen_hvd.init()        # under horovodrun / mpirun (Horovod), or torchrun (torch.distributed)
    out = zen_hvd.sparse_allreduce(grad, name="emb", op=zen_hvd.Sum)

Horovod is optional: nothing here imports it until it runs or one of its names is asked for.
"""
from .header import InvalidTensorError, TensorMismatchError  # noqa: F401
from .mpi.stall import PeerLeftError, PeerLostError, StallError  # noqa: F401
from .ops import Average, Sum  # noqa: F401  (Horovod's op codes: hvd.Sum works as well)
from .runtime import (comm_stats, init, local_rank, local_size, rank, reset_comm_stats,  # noqa: F401
                      set_seed, size)
from .sync import SCHEMES, last_sync, sparse_allreduce, sparse_allreduce_async  # noqa: F401
from .dgc import DGC, Compression  # noqa: F401  (Horovod's choices plus dgc)
from .auto import scheme_choices  # noqa: F401
from . import ddp  # noqa: F401

__version__ = "0.1.0"

# Horovod's PyTorch API, so that `import zen_hvd as hvd` runs a Horovod script unchanged: each
# name is Horovod's own, imported at first use (PEP 562). init, rank, size, local_rank,
# local_size, sparse_allreduce_async, DistributedOptimizer and elastic (whose reset also
# rebuilds Zen's state) are zen_hvd's own.
_HOROVOD = frozenset("""
    Adasum HorovodInternalError Max Min ProcessSet Product SyncBatchNorm add_process_set allgather
    allgather_async allgather_object allreduce allreduce_ allreduce_async allreduce_async_
    alltoall alltoall_async barrier broadcast broadcast_ broadcast_async broadcast_async_
    broadcast_object broadcast_optimizer_state broadcast_parameters ccl_built cross_rank
    cross_size cuda_built ddl_built gloo_built gloo_enabled global_process_set grouped_allgather
    grouped_allgather_async grouped_allreduce grouped_allreduce_ grouped_allreduce_async
    grouped_allreduce_async_ grouped_reducescatter grouped_reducescatter_async is_initialized
    join mpi_built mpi_enabled mpi_threads_supported nccl_built poll reducescatter
    reducescatter_async remove_process_set rocm_built shutdown
    start_timeline stop_timeline synchronize""".split())


def __getattr__(name):
    if name == "elastic":   # imported here, not by `from . import` (which would ask this again)
        import importlib

        return importlib.import_module(".elastic", __name__)
    if name not in _HOROVOD:
        raise AttributeError(f"module 'zen_hvd' has no attribute {name!r}")
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise AttributeError(f"zen_hvd.{name} is Horovod's {name}, and Horovod cannot be imported "
                             f"here ({e}); install it (pip install zen_hvd[horovod]), or use "
                             "torch.distributed's counterpart") from None
    return getattr(hvd, name)


def DistributedOptimizer(*args, **kwargs):
    """horovod.torch.DistributedOptimizer with Zen for sparse gradients (zen_hvd.optimizer);
    needs Horovod. Without Horovod, use DDP with zen_hvd.ddp.zen_hook."""
    try:
        from .optimizer import DistributedOptimizer as wrap
    except ImportError as e:
        if "horovod" not in str(e):
            raise
        raise ImportError(f"zen_hvd.DistributedOptimizer wraps Horovod's optimizer, and Horovod "
                          f"cannot be imported here ({e}). Install Horovod (pip install "
                          "zen_hvd[horovod]), or train with torch.nn.parallel.DistributedDataParallel "
                          "and model.register_comm_hook(zen_hvd.ddp.ZenState(), "
                          "zen_hvd.ddp.zen_hook)") from None
    return wrap(*args, **kwargs)
