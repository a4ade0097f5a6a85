"""Helpers shared by the multi-rank case scripts (run from this folder, so importable as
`common`)."""
import hashlib

import numpy as np
import torch


def digest(t: torch.Tensor) -> int:
    """A 56-bit hash of a tensor's bytes (indices and values for a sparse tensor, in their
    stored order: an uncoalesced result must be the same on every rank too)."""
    h = hashlib.blake2b(digest_size=7)
    if t.is_sparse:
        h.update(t._indices().numpy().tobytes())
        t = t._values()
    h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little")


def same_on_all_ranks(transport, *values) -> bool:
    table = transport.allgather_int64(list(values))
    return bool((table == table[0]).all())


def make_sparse(units, values, shape):
    """Row-sparse hybrid tensor (2-D shape, D values per unit) or element-sparse tensor."""
    if len(shape) == 2 and values.shape[1] == shape[1]:
        return torch.sparse_coo_tensor(torch.from_numpy(units).reshape(1, -1), torch.from_numpy(values), shape,
                                       check_invariants=True)
    idx = torch.from_numpy(np.stack(np.unravel_index(units, shape)) if units.size
                           else np.zeros((len(shape), 0), np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(values[:, 0]), shape, check_invariants=True)


class DelayedSends:
    """While on, every message this rank sends through `transport` leaves after a random
    pause (0 to `most` seconds, drawn per message from `seed`), so its peers receive this
    rank's messages late and in an order that changes from round to round. The transport's
    own send calls are wrapped (mpi4py's Isend, torch.distributed's isend); the Horovod
    transport has no point-to-point sends: its rounds are delayed as a whole."""

    def __init__(self, transport, seed, most=0.004):
        import random
        import time

        self.on, rng = False, random.Random(seed)

        def pause():
            if self.on:
                time.sleep(rng.uniform(0, most))

        if hasattr(transport, "comm"):        # mpi4py: a proxy of the communicator
            comm = transport.comm

            class Comm:
                def __getattr__(self, name):
                    return getattr(comm, name)

                def Isend(self, *a, **kw):
                    pause()
                    return comm.Isend(*a, **kw)

            transport.comm = Comm()
        else:
            names = ["_send"] if hasattr(transport, "_send") else ["_push", "_pull_joined", "_swap"]
            for name in names:
                method = getattr(transport, name)

                def delayed(*a, _method=method, **kw):
                    pause()
                    return _method(*a, **kw)

                setattr(transport, name, delayed)
