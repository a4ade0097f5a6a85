"""Zen as a PyTorch DDP communication hook: sparse gradients on gloo and NCCL, no Horovod.

    model = torch.nn.parallel.DistributedDataParallel(model)
    state = zen_hvd.ddp.ZenState(process_group=None, scheme="auto")   # dgc=0.05 for DGC
    model.register_comm_hook(state, zen_hvd.ddp.zen_hook)

DDP puts each sparse gradient (an nn.Embedding(sparse=True)'s) alone in its bucket and hands
the hook `bucket.buffer()`, the sparse gradient itself; with a hook registered it does not
divide by the world size, so the hook averages, as DDP's own reduction does. Per bucket:
  sparse  Zen's sparse allreduce (scheme auto: balanced parallelism or hierarchical
          centralization, docs/algorithm.md §2), averaged: the result is a sparse tensor whose
          rows are in the servers' order, which DDP sets as the parameter's .grad. PyTorch
          itself has no sparse allreduce on NCCL; this one runs on gloo and NCCL alike;
  dense   allreduce of buffer / n, as DDP's default hook; or, with DGC (dgc= on the state),
          from iteration start_dgc_iter on: each parameter's top `ratio` of its accumulated
          gradient (dgc.py: error feedback, the residual kept per bucket on this rank), sent
          with Zen by elements, the result the bucket's averaged dense gradient. This is the
          paper's own LLM integration (Section 4).
Cost per sparse bucket: Zen's (eq. (1) or (2) of docs/algorithm.md) instead of the allgather
of every rank's rows DDP's reduction does, (n - 1) nnz rows per rank.

DDP rebuilds its buckets after the first iteration (in the order gradients became ready), so
DGC starts at iteration start_dgc_iter >= 1, once buckets are final, as PowerSGD's hook does.
The residuals live per bucket, and move with each parameter when DDP rebuilds its buckets. At
iterations 0 and 1 every rank compares its buckets' layout (sparse or dense, size, dtype, the
parameters' shapes) with the others' before the bucket's communication: ranks whose models
differ raise the same TensorMismatchError, instead of mismatched collectives. ZenState pickles
(as PowerSGDState does, without its process group) and has state_dict() / load_state_dict()
for checkpoints: the iteration count and this rank's DGC residuals per parameter, keyed by the
parameter's place in DDP's first bucket order (the order any new DDP model of the same module
starts with), so a checkpoint resumes exactly in a fresh model, before or after its rebuild.
With scheme="auto" the resumed run profiles again and may pick another scheme for a while,
which can change the float rounding of a sparse sum: a fixed scheme resumes bit for bit.
"""
import math

import torch
import torch.distributed as dist

from . import dgc, gradients, ops, runtime
from .header import DTYPES, TensorMismatchError


class ZenState:
    """The hook's state.

    process_group: the ranks to synchronize among (default: torch.distributed's default group).
    scheme: Zen's scheme for sparse buckets ("auto" or one of zen_hvd.SCHEMES).
    transport: "torch" (default without an MPI job) or "mpi4py" (see sparse_allreduce).
    dgc: None (dense buckets go through allreduce), a ratio in (0, 1] (DGC with plain error
        feedback, dgc.DGC(ratio, momentum=0): the optimizer keeps its own momentum), or a
        zen_hvd.DGC for other settings (momentum correction needs an optimizer without
        momentum).
    start_dgc_iter: the first iteration that runs DGC (>= 1: after DDP's bucket rebuild).
    """

    _SETTINGS = ("scheme", "transport", "dgc", "start_dgc_iter")

    def __init__(self, process_group=None, scheme="auto", transport=None, dgc=None, start_dgc_iter=1):
        from .sync import SCHEMES

        if scheme != "auto" and scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}: choose 'auto' or one of {sorted(SCHEMES)}")
        if int(start_dgc_iter) != start_dgc_iter or start_dgc_iter < 1:
            raise ValueError("start_dgc_iter must be an integer >= 1 (DDP rebuilds its buckets "
                             f"after the first iteration), not {start_dgc_iter!r}")
        self.process_group = process_group
        self.scheme, self.transport = scheme, transport
        self.dgc = _dgc_settings(dgc)
        self.start_dgc_iter = int(start_dgc_iter)
        self.iter = 0            # iterations run (counted at each last bucket)
        self._local_iter = 0     # iterations this process has run (not checkpointed)
        self._buckets = {}       # bucket index -> dgc.Bucket (the residuals, as DDP buckets now)
        self._held = {}          # id(parameter) -> (its place, the dgc.Bucket holding its
                                 # residual now, the residual's (offset, length) there)
        self._place = {}         # id(parameter) -> its place in DDP's first bucket order
        self._saved = None       # loaded DGC state, applied as each bucket first runs DGC

    @property
    def dgc_buckets(self) -> list:
        """The DGC buckets in use (dgc.Bucket: each one's last_sent is its last selection),
        none before the first DGC iteration."""
        return list(self._buckets.values())

    # -- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The iteration count and this rank's DGC residuals, per parameter, keyed by the
        parameter's place in DDP's first bucket order (the order any new DDP model of the
        same module starts with, before its rebuild), so a fresh model resumes exactly."""
        if not self._held:
            return dict(iter=self.iter, dgc=self._saved)
        residuals = {}
        for place, b, (offset, n) in self._held.values():
            u = b.memory.u
            residuals[place] = (b.memory.v[offset:offset + n].clone(),
                                None if u is None else u[offset:offset + n].clone())
        steps = max(b.steps for _, b, _ in self._held.values())
        return dict(iter=self.iter, dgc=dict(rank=self._rank(), size=self._size(), steps=steps,
                                             residuals=residuals))

    def load_state_dict(self, state: dict) -> None:
        self.iter = int(state["iter"])
        self._buckets, self._held, self._saved = {}, {}, state.get("dgc")

    def __getstate__(self):
        return dict(self.state_dict(), **{k: getattr(self, k) for k in self._SETTINGS})

    def __setstate__(self, state):
        self.__init__(None, *(state[k] for k in self._SETTINGS))
        self.iter, self._saved = int(state["iter"]), state["dgc"]

    # -- what a bucket needs ------------------------------------------------------------
    def _group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def _rank(self):
        return dist.get_rank(self._group())

    def _size(self):
        return dist.get_world_size(self._group())

    def _kw(self, name):
        return dict(name=name, op=ops.Average, scheme=self.scheme, transport=self.transport,
                    process_group=self._group())

    def _record_places(self, bucket):
        for p in bucket.parameters():
            self._place.setdefault(id(p), len(self._place))

    def _dgc_bucket(self, bucket):
        """This bucket's DGC state (its residual), made at its first DGC iteration from a loaded
        checkpoint's residuals, and made again if DDP rebuilt the bucket with other parameters,
        each parameter's residual carried over from the bucket that held it."""
        index, params = bucket.index(), list(bucket.parameters())
        b = self._buckets.get(index)
        if b is not None and len(b.params) == len(params) and all(p is q for p, q in zip(b.params, params)):
            return b
        b = dgc.Bucket(f"ddp.dgc.{index}", params, self.dgc)
        if b.numel != bucket.buffer().numel():
            raise ValueError(f"zen_hvd.ddp.zen_hook: bucket {index} holds {bucket.buffer().numel()} "
                             f"values and its parameters {b.numel}: a bucket laid out with gaps "
                             "cannot go through DGC")
        self._fill(b)
        self._buckets[index] = b
        for p, part in zip(b.params, b.slices):
            self._held[id(p)] = self._place[id(p)], b, part
        return b

    def _fill(self, new):
        """A new bucket's residuals (and velocities), per parameter: from the bucket that held
        the parameter before DDP rebuilt its buckets, else from a loaded checkpoint (this
        rank's own; another rank's gives zeros), else zeros."""
        saved = self._saved
        if saved is not None and "own" not in saved:   # decided once, at the first bucket
            saved = self._saved = dict(saved, own=dgc.own_residuals(saved, self._rank(), self._size()))
        for p, (offset, n) in zip(new.params, new.slices):
            if id(p) in self._held:
                _, old, (start, _) = self._held[id(p)]
                v = old.memory.v[start:start + n]
                u = None if old.memory.u is None else old.memory.u[start:start + n]
                steps = old.steps
            elif saved is not None:
                v, u = saved["residuals"].get(self._place[id(p)], (None, None)) if saved["own"] else (None, None)
                steps = int(saved["steps"])
            else:
                continue
            if v is not None and v.numel() != n:
                raise ValueError(f"zen_hvd.ddp.ZenState: the checkpoint's DGC residual for the "
                                 f"parameter at place {self._place[id(p)]} holds {v.numel()} values, "
                                 f"this model's {n} (a different model?)")
            new.steps = max(new.steps, steps)
            if v is not None:
                new.memory.v[offset:offset + n] = v
            if new.memory.u is not None and u is not None:
                new.memory.u[offset:offset + n] = u


def _dgc_settings(setting):
    if setting is None or isinstance(setting, dgc.DGC):
        return setting
    if isinstance(setting, (int, float)) and not isinstance(setting, bool):
        return dgc.DGC(ratio=float(setting), momentum=0.0)
    raise TypeError(f"dgc must be None, a ratio in (0, 1] or a zen_hvd.DGC, not {setting!r}")


def zen_hook(state: ZenState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: Zen for sparse buckets, allreduce (or DGC then Zen) for dense
    ones (see the module docstring). Returns a future of the bucket's averaged gradient."""
    buffer = bucket.buffer()
    if state._local_iter < 2:
        _check_layout(state, bucket, buffer)
        state._record_places(bucket)
    if buffer.is_sparse:
        out, _ = gradients.sync_rows(buffer, buffer, repeats=True,
                                     **state._kw(f"ddp.bucket.{bucket.index()}"))
        fut = _done(out)
    elif state.dgc is not None and state.iter >= state.start_dgc_iter:
        b = state._dgc_bucket(bucket)
        flat, _ = gradients.sync_dgc(b, buffer, state._size(), **state._kw(b.name))
        fut = _done(flat.to(buffer.dtype))
    else:
        buffer.div_(state._size())
        work = dist.all_reduce(buffer, group=state._group(), async_op=True)
        fut = work.get_future().then(lambda f: _allreduced(state, bucket, f))
    if bucket.is_last():
        state.iter += 1
        state._local_iter += 1
    return fut


def _allreduced(state, bucket, fut):
    """The allreduce's result; its failure (a peer died, exited or stopped) as an error that
    names the bucket and, where they said farewell, the ranks that left."""
    try:
        return fut.value()[0]
    except RuntimeError as e:
        from .mpi.torch_transport import departed

        group = state._group()
        left = departed(dist.get_process_group_ranks(group))
        timed_out = "timed out" in str(e).lower()
        cause = left or ("a rank stopped synchronizing: it is stuck, or the ranks are out of step"
                         if timed_out else "a rank died or exited")
        raise RuntimeError(f"zen_hvd.ddp.zen_hook: bucket {bucket.index()} (dense allreduce): "
                           f"{cause} ({e})") from e


def _done(value) -> torch.futures.Future[torch.Tensor]:
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def _check_layout(state, bucket, buffer) -> None:
    """Every rank's layout of this bucket (sparse or dense, values, dtype, a digest of its
    parameters' shapes), compared before its communication: TensorMismatchError on every rank
    when they differ (models that differ across ranks), naming each rank's bucket."""
    if buffer.dtype not in DTYPES:
        raise TypeError(f"zen_hvd.ddp.zen_hook: bucket {bucket.index()} holds {buffer.dtype} "
                        "gradients, which zen_hvd does not synchronize")
    shapes = hash(tuple(tuple(p.shape) for p in bucket.parameters())) & ((1 << 62) - 1)
    row = [bucket.index(), int(buffer.is_sparse), math.prod(buffer.shape), DTYPES.index(buffer.dtype), shapes]
    table = runtime.context(state.transport, process_group=state._group()).transport.allgather_int64(row)
    if (table == table[0]).all():
        return

    def describe(r):
        index, sparse, numel, dtype, _ = table[r]
        return f"rank {r}: bucket {index}, {'sparse' if sparse else 'dense'}, {numel} values of {DTYPES[dtype]}"

    raise TensorMismatchError(
        f"zen_hvd.ddp.zen_hook: the ranks' DDP buckets differ ({'; '.join(describe(r) for r in range(len(table)))}"
        "; or the shapes of their parameters): build the same model on every rank (the same "
        "layers, the same sparse= embeddings, the same dtypes)")
