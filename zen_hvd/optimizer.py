"""DistributedOptimizer: Horovod's, with sparse gradients synchronized by Zen.

    opt = zen_hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

Same arguments, defaults, errors and semantics as `horovod.torch.DistributedOptimizer`
(0.28.1), plus keyword-only Zen options. The wrapper is, like Horovod's, a dynamic subclass of
the user's optimizer class carrying Horovod's `_DistributedOptimizer` methods; the methods
below extend them and call into them, so dense gradients take exactly Horovod's path
(grouping and fusion, compression, gradient_predivide_factor, process sets, error texts).

Which gradients go where:
  - Zen parameters (sparse_params): sync with zen_hvd.sparse_allreduce, one row per unit.
    By default the weights of nn.Embedding / nn.EmbeddingBag modules: with sparse=True their
    gradients are torch sparse; with sparse=False they are dense but sparse by nature: the rows
    sent are those holding a non-zero (one read of the gradient, embedding_rows="scan", always
    exact), or with embedding_rows="track" the rows the module looked up in forward (a forward
    hook; no pass over the gradient). Tracking is only exact when the module's lookups are the
    weight's only use: a weight also used elsewhere (tied to an output layer, F.linear(h,
    emb.weight)) has gradient in other rows too. It is refused for weights held by several
    modules, but a functional use cannot be seen, hence scan is the default. The synchronized
    rows are written back into the dense .grad.
  - With compression=zen_hvd.Compression.dgc(...): the other gradients of two or more
    dimensions, fused into buckets, each bucket's top few percent (dgc.py) through Zen by
    elements. A bucket is ready when all its parameters' hooks have fired.
  - Every other gradient: Horovod's allreduce. sparse_as_dense=True sends everything there.

Ordering (worker.py). Every rank syncs the Zen items (discovery.py: Zen parameters and DGC
buckets) in the same fixed order on one background thread, each as soon as backward has
produced its gradients. A dense CPU gradient is synchronized in place (its rows holding a
non-zero travel; the result lands in .grad without another copy). synchronize() marks the
items that got no gradient on this rank as ready (they sync an empty gradient), so every rank
syncs every item every step, whatever its forward did. Errors raised in the worker (the same on
every rank: the header check in sync.py) are re-raised by synchronize() / step().

Op and scaling, as Horovod's: Average divides the sum by the process set's size; with
gradient_predivide_factor f, values are scaled by 1/f before the sum and by f/size after, as the
sync's prescale and postscale factors (folded into its aggregation and output passes).
"""
from __future__ import annotations

import warnings

import torch
from horovod.torch.compression import Compression
from horovod.torch.mpi_ops import Adasum, Average, global_process_set, rocm_built
from horovod.torch.optimizer import DistributedOptimizer as _horovod_distributed_optimizer
from horovod.torch.optimizer import _DistributedOptimizer

from . import dgc, discovery, runtime
from .mpi import select
from .sync import SCHEMES
from .worker import Worker
# Horovod's texts for the same two misuses (horovod/torch/optimizer.py), so users see one message.
_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call "
                    "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
_ZERO_GRAD_RACE = ("optimizer.zero_grad() was called after loss.backward() but before "
                   "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                   "cause a race condition.")


class _ZenDistributedOptimizer(torch.optim.Optimizer):
    """Methods added to Horovod's _DistributedOptimizer (see the module docstring)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set, zen):
        self._zen = None
        dgc_settings = compression if isinstance(compression, dgc.DGC) else None
        _DistributedOptimizer.__init__(self, params, named_parameters,
                                       Compression.none if dgc_settings else compression,
                                       backward_passes_per_step, op, gradient_predivide_factor,
                                       groups, sparse_as_dense, process_set)
        zen_params = discovery.zen_params(self, sparse_as_dense, **zen["select"])
        buckets = discovery.dgc_buckets(self, zen_params, dgc_settings)
        self.zen_parameter_names = [zp.name for zp in zen_params]
        self.dgc_buckets = buckets
        self.zen_profile = {}
        if not self._requires_update:  # no hooks: one rank, or not in the process set
            return
        zen_params = [zp for zp in zen_params if zp.param in self._requires_update]
        buckets = [b for b in buckets if all(p in self._requires_update for p in b.params)]
        items = discovery.sync_order(self, zen_params + buckets)
        ids = {p for item in items for p in item.params}
        self._requires_update -= ids
        if self._groups is not None:  # Zen and DGC parameters leave Horovod's groups
            self._regroup(ids)
        ps = None if process_set.process_set_id == global_process_set.process_set_id else process_set
        transport = select.resolve_transport_name(zen["transport"], runtime.group_of(ps))
        self._zen = Worker(items, op, gradient_predivide_factor, zen["scheme"], transport,
                               ps, early=True, profile=zen["profile"])
        if self._zen.profile is not None:
            self.zen_profile = self._zen.profile
        self._zen_by_param = {p: item for item in items for p in item.params}

    def _regroup(self, zen_ids):
        regrouped = {}
        for group in self._group_counts:
            kept = tuple(p for p in group if p not in zen_ids)
            if kept:
                regrouped[kept] = 0
        self._group_counts = regrouped
        self._p_to_group = {p: g for g in regrouped for p in g}

    def _make_hook(self, p):
        horovod_hook = _DistributedOptimizer._make_hook(self, p)

        def hook(*args):
            if self._zen is not None:
                self._zen.round.fresh = True   # this step follows a backward pass
            zp = self._zen_by_param.get(p) if self._zen is not None else None
            if zp is None:
                return horovod_hook(*args)
            zen = self._zen
            if self._allreduce_delay[p] <= 0 and p in zen.round.arrived:
                raise AssertionError(_TOO_MANY_PASSES)
            assert not p.grad.requires_grad
            zen.touched.add(zp)
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                zen.arrive(zp, p)
        return hook

    def synchronize(self):
        zen = self._zen
        if zen is None or not self.process_set.included():
            return _DistributedOptimizer.synchronize(self)
        zen.release_all()
        try:
            _DistributedOptimizer.synchronize(self)
        finally:
            try:
                results = zen.finish()
            except BaseException:
                self._synchronized = False  # as when a Horovod allreduce fails
                raise
        for item, out in results.items():
            for p in item.params:
                self._allreduce_delay[p] = self.backward_passes_per_step
            item.write_back(out)

    def zero_grad(self, set_to_none=True):
        if self._handles or (self._zen is not None and self._zen.touched):
            raise AssertionError(_ZERO_GRAD_RACE)
        if self._zen is not None:
            self._zen.round.fresh = True   # the next step syncs cleared gradients, not old ones
        return super(self.__class__, self).zero_grad(set_to_none)

    def state_dict(self):
        """The wrapped optimizer's state_dict, plus (under DGC) this rank's DGC state under
        "zen_dgc": each bucket's residual and step count, with the rank that saved it."""
        state = super(self.__class__, self).state_dict()
        if self.dgc_buckets:
            import horovod.torch as hvd

            state[DGC_STATE] = dgc.save_states(self.dgc_buckets, hvd.rank(), hvd.size())
        return state

    def load_state_dict(self, state_dict, *args, **kwargs):
        if self._zen is not None:  # drop this step's Zen syncs (finishing those already started)
            self._zen.discard()
        dgc_state = state_dict.get(DGC_STATE) if isinstance(state_dict, dict) else None
        if dgc_state is not None:
            state_dict = {k: v for k, v in state_dict.items() if k != DGC_STATE}
        if self.dgc_buckets:   # checked before anything is loaded: a refused state changes nothing
            dgc.check_states(self.dgc_buckets, dgc_state)
        result = _DistributedOptimizer.load_state_dict(self, state_dict, *args, **kwargs)
        if self.dgc_buckets:
            import horovod.torch as hvd

            dgc.load_states(self.dgc_buckets, dgc_state, hvd.rank(), hvd.size())
        return result


DGC_STATE = "zen_dgc"


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, *, sparse_params=None, model=None,
                         scheme="auto", transport=None, profile=False, embedding_rows="scan"):
    """horovod.torch.DistributedOptimizer with Zen for sparse gradients.

    Horovod's arguments keep their meaning (see its docstring); compression also takes
    zen_hvd.Compression.dgc(ratio=...): Deep Gradient Compression of the dense gradients with
    two or more dimensions, whose top `ratio` per fused bucket travels through Zen (dgc.py).
    Zen options:
      sparse_params: names (from named_parameters) or tensors of parameters whose gradients are
          sparse by nature and sync through Zen by rows. Default: the weights of every
          nn.Embedding / nn.EmbeddingBag. Weights of sparse=True embeddings always use Zen.
      model: where to look for the embedding modules (default: every live nn.Module).
      embedding_rows: for dense (sparse=False) embedding gradients, "scan" (default: the rows
          holding a non-zero, always exact) or "track" (the rows looked up in forward; exact
          only when the embedding module is the weight's only use, see the module docstring).
      scheme: the sparse_allreduce scheme: "auto" (its default) or one of zen_hvd.SCHEMES.
      transport: "mpi4py", "torch" or "horovod" (default: as sparse_allreduce chooses).
      profile: record per Zen parameter (and DGC bucket) the syncs, seconds, bytes sent/received and densities
          (this rank's rows / all rows, union rows / all rows) in `optimizer.zen_profile`.
    """
    if scheme != "auto" and scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: choose 'auto' or one of {sorted(SCHEMES)}")
    if embedding_rows not in ("scan", "track"):
        raise ValueError(f"embedding_rows must be 'scan' or 'track', not {embedding_rows!r}")
    if compression is dgc.DGC:   # Compression.dgc without its call: the defaults
        compression = dgc.DGC()
    if isinstance(compression, dgc.DGC) and (sparse_as_dense or op == Adasum):
        raise ValueError(f"zen_hvd.DistributedOptimizer: compression={compression!r} sends the top "
                         f"{compression.ratio:.2%} of each gradient through Zen; it cannot be combined "
                         f"with {'sparse_as_dense=True' if sparse_as_dense else 'op=Adasum'}")
    if op == Adasum:  # Horovod's Adasum optimizer, unchanged: Zen reduces by Sum or Average
        return _horovod_distributed_optimizer(
            optimizer, named_parameters, compression, backward_passes_per_step, op,
            gradient_predivide_factor, num_groups, groups, sparse_as_dense, process_set)
    # Horovod's argument checks, with its texts.
    if gradient_predivide_factor != 1.0:
        if rocm_built():
            raise ValueError("gradient_predivide_factor not supported yet with ROCm")
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    methods = dict(_DistributedOptimizer.__dict__)
    methods.update({k: v for k, v in _ZenDistributedOptimizer.__dict__.items()
                    if k not in ("__dict__", "__weakref__", "__doc__", "__module__")})
    # Horovod's helpers recognise its wrapper by this module (broadcast_optimizer_state, also
    # under elastic's TorchState, then initialises a new state with the wrapped optimizer's
    # step, without communicating); ours takes the same path.
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    zen = dict(select=dict(sparse_params=sparse_params, model=model, embedding_rows=embedding_rows),
               scheme=scheme,
               transport=transport, profile=profile)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set, zen)
