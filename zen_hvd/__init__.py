"""zen_hvd: Zen's balanced-parallelism sparse allreduce for Horovod and PyTorch.

    import torch, zen_hvd
    zen_hvd.init()
    out = zen_hvd.sparse_allreduce(grad, name="emb", op=zen_hvd.Sum)
"""
from horovod.torch import Average, Sum  # noqa: F401  (the ops users already know)

from .header import InvalidTensorError, TensorMismatchError  # noqa: F401
from .runtime import comm_stats, init, reset_comm_stats, set_seed  # noqa: F401
from .sync import SCHEMES, last_sync, sparse_allreduce  # noqa: F401

__version__ = "0.1.0"
