"""Which parameters an optimizer syncs through Zen, and as what (zen_hvd.DistributedOptimizer):

  - Zen parameters (ZenParam), by rows: by default the weights of nn.Embedding /
    nn.EmbeddingBag modules (found among the model's modules, or every live nn.Module), or the
    parameters named by sparse_params;
  - DGC buckets (dgc.Bucket), by elements: under compression=Compression.dgc, the other
    parameters DGC compresses, fused into buckets;
and the order their gradients complete in backward, in which every rank syncs them.
"""
from __future__ import annotations

import gc

import torch

from . import dgc, gradients

_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


class ZenParam:
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

    @property
    def num_units(self):
        return self.param.shape[0] or 1

    def sync(self, size, **kw):
        """The gradient by rows (gradients.sync_rows): None when a dense CPU gradient was
        synchronized in place, else the synchronized sparse gradient; and the sync's info."""
        p, grad = self.param, self.param.grad
        # Rows repeat in the result only if the gradient stays sparse (write_back).
        stays_sparse = grad.is_sparse if grad is not None else self.sparse_grad
        rows = self.rows(grad) if grad is not None and not grad.is_sparse else None
        return gradients.sync_rows(grad, p, rows, repeats=stays_sparse, **kw)

    def step_done(self):
        if self.looked_up is not None:
            self.looked_up.clear()

    def write_back(self, out):
        """The synchronized gradient into .grad: sparse stays sparse; a dense .grad gets its
        rows overwritten (rows outside the union are zero on every rank already)."""
        if out is None:   # synchronized in place
            return
        p = self.param
        if p.grad is None and self.sparse_grad or p.grad is not None and p.grad.is_sparse:
            p.grad = out
            return
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if out._nnz():
            p.grad.index_copy_(0, out._indices()[0].to(p.grad.device), out._values().to(p.grad.dtype))

    def rows(self, grad):
        """Rows to send: the looked-up rows when recorded, else None (those holding a
        non-zero)."""
        if self.looked_up:
            return torch.unique(torch.cat(self.looked_up)).to(grad.device)
        return None


def zen_params(opt, sparse_as_dense, sparse_params, model, embedding_rows):
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
        chosen.append(ZenParam(name, p, sparse_grad, embs[0] if lone else None))
    return chosen


def dgc_buckets(opt, zen_params, settings):
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


def sync_order(opt, items):
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
