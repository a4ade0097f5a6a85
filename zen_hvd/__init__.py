"""zen_hvd: Zen's balanced-parallelism sparse allreduce for Horovod and PyTorch.

    import torch, zen_hvd
    zen_hvd.init()
    out = zen_hvd.sparse_allreduce(grad, name="emb", op=zen_hvd.Sum)
"""
from horovod.torch import Average, Sum  # noqa: F401  (the ops users already know)

from .header import InvalidTensorError, TensorMismatchError  # noqa: F401
from .mpi.stall import PeerLeftError, StallError  # noqa: F401
from .runtime import comm_stats, init, reset_comm_stats, set_seed  # noqa: F401
from .sync import SCHEMES, last_sync, sparse_allreduce  # noqa: F401

__version__ = "0.1.0"

# Horovod's PyTorch API, so that `import zen_hvd as hvd` runs a Horovod script unchanged;
# init, DistributedOptimizer and elastic (its reset also rebuilds Zen's transports) are
# zen_hvd's own.
from horovod.torch import (  # noqa: F401,E402
    Adasum, HorovodInternalError, Max, Min, ProcessSet, Product, SyncBatchNorm,
    add_process_set, allgather, allgather_async, allgather_object, allreduce, allreduce_,
    allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
    broadcast_async, broadcast_async_, broadcast_object, broadcast_optimizer_state,
    broadcast_parameters, ccl_built,
    cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
    global_process_set, grouped_allgather, grouped_allgather_async, grouped_allreduce,
    grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
    grouped_reducescatter_async, is_initialized, join, local_rank, local_size, mpi_built,
    mpi_enabled, mpi_threads_supported, nccl_built, poll, rank, reducescatter, reducescatter_async,
    remove_process_set, rocm_built, shutdown, size, sparse_allreduce_async, start_timeline,
    stop_timeline, synchronize)

from .dgc import DGC, Compression  # noqa: F401,E402  (Horovod's choices plus dgc)
from . import elastic  # noqa: F401,E402
from .optimizer import DistributedOptimizer  # noqa: F401,E402
from .auto import scheme_choices  # noqa: F401,E402
