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

Ordering. A Zen sync is a collective that every rank must issue in the same order. One worker
thread, started once for the optimizer's lifetime, walks every step's Zen parameters in a fixed
order (reverse registration order, the order backward usually produces them), waiting for each
parameter's backward hook; so the sync of a gradient overlaps the rest of backward. A dense
CPU gradient is synchronized in place (its rows holding a non-zero travel; the result lands in
.grad without another copy). synchronize() marks the parameters that got no
gradient on this rank as ready (they sync an empty gradient), so every rank syncs every Zen
parameter every step, whatever its forward did. Errors raised in the worker (the same on every
rank: the header check in sync.py) are re-raised by synchronize() / step().

Op and scaling, as Horovod's: Average divides the sum by the process set's size; with
gradient_predivide_factor f, values are scaled by 1/f before the sum and by f/size after, as the
sync's prescale and postscale factors (folded into its aggregation and output passes).
"""
from __future__ import annotations

import atexit
import gc
import hashlib
import queue
import threading
import time
import warnings
import weakref

import torch
from horovod.torch.compression import Compression
from horovod.torch.mpi_ops import Adasum, Average, Sum, global_process_set, rocm_built
from horovod.torch.optimizer import DistributedOptimizer as _horovod_distributed_optimizer
from horovod.torch.optimizer import _DistributedOptimizer

from . import dgc, gradients, runtime
from .header import TensorMismatchError
from .mpi import select
from .sync import SCHEMES

_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)
# Horovod's texts for the same two misuses (horovod/torch/optimizer.py), so users see one message.
_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call "
                    "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
_ZERO_GRAD_RACE = ("optimizer.zero_grad() was called after loss.backward() but before "
                   "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                   "cause a race condition.")


class _ZenParam:
    """What the optimizer knows about one Zen parameter: its name, whether its gradient is
    torch sparse, and (when a lone sparse=False embedding owns it) the rows looked up."""

    def __init__(self, name, param, sparse_grad, tracker):
        self.name, self.param, self.sparse_grad = name, param, sparse_grad
        self.looked_up = [] if tracker is not None else None
        self.hook = tracker.register_forward_hook(self._record) if tracker is not None else None

    def _record(self, module, inputs, output):
        if torch.is_grad_enabled():
            self.looked_up.append(inputs[0].detach().reshape(-1))

    @property
    def params(self):
        return (self.param,)

    def write_back(self, out):
        _write_back(self, out)

    def rows(self, grad):
        """Rows to send: the looked-up rows when recorded, else None (those holding a
        non-zero)."""
        if self.looked_up:
            return torch.unique(torch.cat(self.looked_up)).to(grad.device)
        return None


class _Round:
    """One step's Zen syncs: a ready event per item (Zen parameter or DGC bucket), the
    parameters arrived so far per bucket, whether the gradient is fresh (a backward pass, any
    parameter's hook, or zero_grad() reached the optimizer), the results, the first error."""

    def __init__(self, order, step):
        self.step, self.fresh = step, False
        self.ready = {zp: threading.Event() for zp in order}
        self.arrived = {item: 0 for item in order if isinstance(item, dgc.Bucket)}
        self.touched = set()
        self.results, self.error = {}, None
        self.started, self.done = False, threading.Event()


def _stop_thread(rounds, thread):
    rounds.put(None)
    thread.join(timeout=10)


class _ZenWorker:
    """The Zen syncs of every step, in a fixed order, on one background thread that lives as
    long as the optimizer (each step's round is handed to it through a queue). An item is a
    Zen parameter (_ZenParam, by rows) or a DGC bucket (dgc.Bucket, by elements)."""

    def __init__(self, zen_params, op, predivide, scheme, transport, process_set, early, profile):
        self.order = zen_params
        self._lock = threading.Lock()
        self.scheme, self.transport, self.process_set = scheme, transport, process_set
        self.early = early  # start syncing from the backward hooks (False: at synchronize())
        self.profile = {zp.name: dict(syncs=0, seconds=0.0, bytes_sent=0, bytes_received=0,
                                      rows=0, density=0.0, union_density=0.0)
                        for zp in zen_params} if profile else None
        self._op, self._predivide = op, predivide
        self._generation = None   # the runtime generation the settings below were made for
        self._queue = queue.SimpleQueue()
        self._thread = None
        self.steps = 0   # rounds begun: the step count the header carries
        self.round = self._new_round()

    def _new_round(self):
        self.steps += 1
        return _Round(self.order, self.steps)

    @property
    def ready(self):
        return self.round.ready

    @property
    def touched(self):
        return self.round.touched

    @property
    def started(self):
        return self.round.started

    def mark_ready(self, zp):
        self.round.ready[zp].set()
        if self.early:
            self._start()

    def arrive(self, item):
        """One of the item's parameters has its gradient; the item is ready with the last."""
        if isinstance(item, dgc.Bucket):
            with self._lock:
                self.round.arrived[item] += 1
                if self.round.arrived[item] < len(item.params):
                    return
        self.mark_ready(item)

    def _start(self):
        if self.round.started:
            return
        self.round.started = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, args=(self._queue, weakref.ref(self)),
                                            name="zen_hvd.optimizer", daemon=True)
            self._thread.start()
            # The thread ends with the optimizer, or before the interpreter shuts down (a
            # thread still blocked then would be torn down inside native code).
            weakref.finalize(self, self._queue.put, None)
            atexit.register(_stop_thread, self._queue, self._thread)
        self._queue.put(self.round)

    @staticmethod
    def _loop(rounds, worker_ref):
        """The thread's body. It holds the worker only while it runs a round, so an optimizer
        that goes away ends its thread (weakref.finalize puts the None)."""
        while True:
            rnd = rounds.get()
            worker = worker_ref()
            if rnd is None or worker is None:
                return
            try:
                worker._begin()
                for zp in worker.order:
                    rnd.ready[zp].wait()
                    rnd.results[zp] = worker._sync(zp, rnd)
            except BaseException as e:  # re-raised by finish(), on every rank alike
                rnd.error = e
            del worker
            rnd.done.set()

    def _begin(self):
        """At a round's start, once per set of ranks (the first round, and the first after an
        elastic reset): the ranks agree on the items, and the scaling follows the size."""
        runtime.context(self.transport, self.process_set)   # resets if the ranks changed
        if self._generation == runtime.generation:
            return
        _check_same_zen_params(self.order, self.transport, self.process_set)
        import horovod.torch as hvd

        size = self.size = self.process_set.size() if self.process_set is not None else hvd.size()
        # Horovod's pre/postscale split of the average: as factors of the sync.
        self.op, self.prescale, self.postscale = (Sum, 1.0 / self._predivide, self._predivide / size) \
            if self._predivide != 1.0 else (self._op, 1.0, 1.0)
        self._generation = runtime.generation

    def _sync(self, zp, rnd):
        """Sync one item. A Zen parameter's dense CPU gradient scanned for rows is synchronized
        in place (returns None); otherwise returns the synchronized sparse gradient. A DGC
        bucket returns its synchronized flat gradient."""
        kw = dict(name=zp.name, op=self.op, scheme=self.scheme, transport=self.transport,
                  process_set=self.process_set, prescale_factor=self.prescale,
                  postscale_factor=self.postscale, step=(rnd.step, rnd.fresh))
        t0 = time.perf_counter()
        before = runtime.comm_stats() if self.profile is not None else None
        if isinstance(zp, dgc.Bucket):
            out, info = gradients.sync_dgc(zp, zp.flat_gradient(), self.size, **kw)
        else:
            p, grad = zp.param, zp.param.grad
            # Rows repeat in the result only if the gradient stays sparse (_write_back).
            stays_sparse = p.grad.is_sparse if p.grad is not None else zp.sparse_grad
            rows = zp.rows(grad) if grad is not None and not grad.is_sparse else None
            out, info = gradients.sync_rows(grad, p, rows, repeats=stays_sparse, **kw)
        if self.profile is not None:
            self._record(zp, info, before, time.perf_counter() - t0)
        return out

    def _record(self, zp, info, before, seconds):
        after = runtime.comm_stats()
        rows = zp.numel if isinstance(zp, dgc.Bucket) else zp.param.shape[0] or 1
        prof = self.profile[zp.name]
        prof["syncs"] += 1
        prof["seconds"] += seconds
        for k in ("bytes_sent", "bytes_received"):
            prof[k] += after[k] - before[k]
        prof["rows"] = int(info["nnz"][self._rank()])   # elements, for a DGC bucket
        prof["density"] = prof["rows"] / rows
        prof["union_density"] = info["union_size"] / rows

    def _rank(self):
        import horovod.torch as hvd

        return self.process_set.rank() if self.process_set is not None else hvd.rank()

    def release_all(self):
        """Every parameter not yet ready syncs what it has (an empty gradient if none)."""
        for ev in self.round.ready.values():
            ev.set()

    def finish(self):
        """Wait for this step's syncs; returns {zen param: synchronized sparse gradient, or None
        when it was synchronized in place}."""
        self.release_all()
        self._start()
        rnd = self.round
        rnd.done.wait()
        for zp in self.order:
            if getattr(zp, "looked_up", None) is not None:
                zp.looked_up.clear()
        self.round = self._new_round()
        if rnd.error is not None:
            raise rnd.error
        return rnd.results

    def discard(self):
        """Drop this step's syncs (finishing those already started)."""
        if self.round.started:
            self.finish()
        else:
            self.round = self._new_round()


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
        zen_params = _select_zen_params(self, sparse_as_dense, **zen["select"])
        buckets = _dgc_buckets(self, zen_params, dgc_settings)
        self.zen_parameter_names = [zp.name for zp in zen_params]
        self.dgc_buckets = buckets
        self.zen_profile = {}
        if not self._requires_update:  # no hooks: one rank, or not in the process set
            return
        zen_params = [zp for zp in zen_params if zp.param in self._requires_update]
        buckets = [b for b in buckets if all(p in self._requires_update for p in b.params)]
        items = _sync_order(self, zen_params + buckets)
        ids = {p for item in items for p in item.params}
        self._requires_update -= ids
        if self._groups is not None:  # Zen and DGC parameters leave Horovod's groups
            self._regroup(ids)
        ps = None if process_set.process_set_id == global_process_set.process_set_id else process_set
        transport = select.resolve_transport_name(zen["transport"], runtime.group_of(ps))
        self._zen = _ZenWorker(items, op, gradient_predivide_factor, zen["scheme"], transport,
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
            if self._allreduce_delay[p] <= 0 and (zen.ready[zp].is_set() or isinstance(zp, dgc.Bucket)):
                raise AssertionError(_TOO_MANY_PASSES)
            assert not p.grad.requires_grad
            zen.touched.add(zp)
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                zen.arrive(zp)
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


def _write_back(zp, out):
    """The synchronized gradient into .grad: sparse stays sparse; a dense .grad gets its rows
    overwritten (rows outside the union are zero on every rank already)."""
    if out is None:   # synchronized in place
        return
    p = zp.param
    if p.grad is None and zp.sparse_grad or p.grad is not None and p.grad.is_sparse:
        p.grad = out
        return
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    if out._nnz():
        p.grad.index_copy_(0, out._indices()[0].to(p.grad.device), out._values().to(p.grad.dtype))


def _select_zen_params(opt, sparse_as_dense, sparse_params, model, embedding_rows):
    """The Zen parameters in the fixed sync order (reverse registration order)."""
    names = opt._parameter_names
    params = [p for group in opt.param_groups for p in group["params"]]
    by_name = {n: p for p, n in names.items()}
    if sparse_as_dense:
        return []
    holders = _holders(params, model)
    explicit = set()
    for item in sparse_params or ():
        p = by_name.get(item) if isinstance(item, str) else item
        if not isinstance(p, torch.Tensor) or all(p is not q for q in params):
            raise ValueError(f"zen_hvd.DistributedOptimizer: sparse_params names {item!r}, which is "
                             "not a parameter of this optimizer (pass names from named_parameters "
                             "or the parameter tensors themselves)")
        explicit.add(p)
    chosen = []
    for p in reversed(params):
        embs = [m for m in holders.get(p, ()) if isinstance(m, _EMBEDDINGS)]
        sparse_grad = any(m.sparse for m in embs)
        if not (sparse_grad or p in explicit or (sparse_params is None and embs)):
            continue
        lone = len(holders.get(p, ())) == 1 and len(embs) == 1 and not sparse_grad \
            and embedding_rows == "track"
        name = names.get(p)
        chosen.append(_ZenParam(name, p, sparse_grad, embs[0] if lone else None))
    return chosen


def _dgc_buckets(opt, zen_params, settings):
    """DGC's buckets over the parameters it compresses (in reverse registration order, the
    order backward produces them): every parameter that is not a Zen parameter and that
    settings.compresses (two or more dimensions, by default). Refuses a wrapped optimizer
    that would apply momentum on top of DGC's momentum correction."""
    if settings is None:
        return []
    zen = {zp.param for zp in zen_params}
    names = opt._parameter_names
    chosen, groups_with_momentum = [], []
    for group in opt.param_groups:
        mine = [p for p in group["params"] if p.requires_grad and p not in zen and settings.compresses(p)]
        chosen += mine
        if mine and group.get("momentum", 0) and settings.momentum:
            groups_with_momentum.append(group["momentum"])
    if groups_with_momentum:
        raise ValueError(
            f"zen_hvd.DistributedOptimizer: DGC's momentum correction (momentum={settings.momentum}) "
            f"already applies momentum to the parameters it compresses, and the wrapped optimizer "
            f"applies momentum={groups_with_momentum[0]} on top; build the optimizer with "
            "momentum=0, or pass zen_hvd.Compression.dgc(momentum=0) to keep the optimizer's "
            "momentum (error feedback only)")
    return dgc.buckets([(names.get(p), p) for p in reversed(chosen)], settings)


def _sync_order(opt, items):
    """Zen parameters and DGC buckets in the order their gradients complete in backward: by
    the position, in reverse registration order, of each item's last parameter."""
    params = [p for group in opt.param_groups for p in group["params"]]
    position = {p: i for i, p in enumerate(reversed(params))}
    return sorted(items, key=lambda item: max(position[p] for p in item.params))


def _holders(params, model):
    """param -> the modules holding it directly: among model's modules, or (model=None) among
    every live nn.Module, found once through the garbage collector's object list."""
    wanted = {id(p) for p in params}
    modules = model.modules() if model is not None else (
        o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module))
    holders = {}
    for m in modules:
        for q in m._parameters.values():
            if q is not None and id(q) in wanted:
                holders.setdefault(q, []).append(m)
    return holders


def _check_same_zen_params(zen_params, transport, process_set):
    """Every rank must sync the same Zen parameters and DGC buckets in the same order: compare
    a digest."""
    h = hashlib.blake2b("\n".join(zp.name for zp in zen_params).encode(), digest_size=7)
    table = runtime.get_transport(transport, process_set).allgather_int64(
        [int.from_bytes(h.digest(), "little")])
    if (table != table[0]).any():
        raise TensorMismatchError(
            "zen_hvd.DistributedOptimizer: ranks disagree about which parameters are sparse "
            f"(this rank's: {[zp.name for zp in zen_params]}); build the same model on every "
            "rank or pass the same sparse_params= everywhere")


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
