"""Deep Gradient Compression (Lin et al., ICLR 2018): dense gradients sent as their top k%.

    opt = zen_hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=zen_hvd.Compression.dgc(ratio=0.05))

Three pieces, as GRACE separates them:
  sparsifier    top_k(): which coordinates of each parameter travel. The threshold comes from a
                strided sample of about 1% of the magnitudes and is corrected a few rounds until
                the count is within 0.8x to 1.3x of k; a count above k is then trimmed to k.
  memory        Memory: what was not sent stays behind and is added to the next step's
                gradient (error feedback). With momentum m > 0 it is DGC's momentum correction:
                    u <- m u + g          (velocity)
                    v <- v + u            (accumulated, what the sparsifier looks at)
                and momentum factor masking clears the sent coordinates in both u and v.
  communicator  zen_hvd's sparse_allreduce of the selected (index, value) pairs, one element
                per unit (scheme auto: balanced parallelism or hierarchical centralization).

Gradients are fused into buckets (Bucket, 128 MiB by default) so that small tensors share one
sync; within a bucket every parameter's gradient is one slice of a flat vector, and each slice
keeps its own top `ratio` (as DGC selects per layer). Parameters
whose gradients are sparse by nature (embeddings) do not go through DGC but by rows, and
one-dimensional parameters (biases, norms) stay dense unless compress_1d=True.

Momentum correction replaces the optimizer's momentum for these parameters: the wrapped
optimizer must then run without momentum (DistributedOptimizer checks), or pass momentum=0
here to keep the optimizer's momentum and use plain error feedback.
"""
from __future__ import annotations

import math
import warnings

import torch

from .gradients import sync_dgc

# DGC's warm-up densities (75%, 93.75%, 98.4375%, 99.6% sparsity), one stage per
# warmup_steps steps; a stage sparser than the target is skipped (density never below ratio).
WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.004)
ROUNDS = 4            # threshold corrections at most
LOW, HIGH = 0.8, 1.3  # accepted count, as multiples of k


class DGC:
    """DGC's settings; pass as `compression=` to zen_hvd.DistributedOptimizer.

    ratio: fraction of each bucket's coordinates sent per step, in (0, 1] (default 5%).
    momentum: momentum correction's m (0: plain error feedback, the optimizer keeps its own).
    sample_ratio: fraction of the magnitudes sampled to estimate the threshold.
    clip_norm: local gradient clipping: each bucket's gradient is clipped to an L2 norm of
        clip_norm / sqrt(n) before it is accumulated (n ranks), None for no clipping.
    warmup_steps: steps per warm-up stage (WARMUP_DENSITIES); 0: the target from the start.
    bucket_bytes: most bytes of gradient fused into one sync (a larger tensor gets its own).
    compress_1d: also compress one-dimensional parameters (default: they stay dense).
    """

    def __init__(self, ratio=0.05, momentum=0.9, sample_ratio=0.01, clip_norm=None,
                 warmup_steps=0, bucket_bytes=128 << 20, compress_1d=False):
        if not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
            raise ValueError(f"zen_hvd.Compression.dgc: ratio must be in (0, 1], not {ratio!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"zen_hvd.Compression.dgc: momentum must be in [0, 1), not {momentum!r}")
        if not 0.0 < sample_ratio <= 1.0:
            raise ValueError("zen_hvd.Compression.dgc: sample_ratio must be in (0, 1], "
                             f"not {sample_ratio!r}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"zen_hvd.Compression.dgc: clip_norm must be > 0 or None, not {clip_norm!r}")
        if int(warmup_steps) != warmup_steps or warmup_steps < 0:
            raise ValueError("zen_hvd.Compression.dgc: warmup_steps must be an integer >= 0, "
                             f"not {warmup_steps!r}")
        if int(bucket_bytes) != bucket_bytes or bucket_bytes <= 0:
            raise ValueError("zen_hvd.Compression.dgc: bucket_bytes must be a positive integer, "
                             f"not {bucket_bytes!r}")
        self.ratio, self.momentum, self.sample_ratio = float(ratio), float(momentum), float(sample_ratio)
        self.clip_norm, self.warmup_steps = clip_norm, int(warmup_steps)
        self.bucket_bytes, self.compress_1d = int(bucket_bytes), bool(compress_1d)

    def __repr__(self):
        return (f"zen_hvd.Compression.dgc(ratio={self.ratio}, momentum={self.momentum}, "
                f"sample_ratio={self.sample_ratio}, clip_norm={self.clip_norm}, "
                f"warmup_steps={self.warmup_steps}, bucket_bytes={self.bucket_bytes}, "
                f"compress_1d={self.compress_1d})")

    def density(self, step: int) -> float:
        """The fraction sent at `step` (0-based): the warm-up stage's, then the target."""
        stage = step // self.warmup_steps if self.warmup_steps else len(WARMUP_DENSITIES)
        return max(self.ratio, WARMUP_DENSITIES[stage]) if stage < len(WARMUP_DENSITIES) else self.ratio

    def compresses(self, param: torch.Tensor) -> bool:
        return param.dim() >= 2 or self.compress_1d and param.dim() == 1


def top_k(magnitude: torch.Tensor, k: int, sample_ratio: float, start: int = 0) -> torch.Tensor:
    """Indices (ascending) of about k of the largest entries of a flat magnitude vector:
    exactly k when at least k entries pass the final threshold, else at least 0.8 k unless the
    rounds ran out. NaN counts as largest, so it is always sent (and propagates as in a dense
    sum); zeros are never sent."""
    n = magnitude.numel()
    tiny = torch.finfo(magnitude.dtype).tiny
    if k >= n:
        return torch.nonzero(~(magnitude < tiny)).reshape(-1)
    # The sample: every stride-th entry from `start`; its rank-th largest estimates the
    # threshold that k entries of the whole vector pass.
    stride = max(1, int(1.0 / sample_ratio))
    sample = magnitude[start % stride % n::stride]
    rank = max(1, math.ceil(k * sample.numel() / n))
    # NaN as +inf here: a NaN threshold would pass every entry, zeros included.
    top = torch.topk(sample.nan_to_num(nan=math.inf), min(sample.numel(), 8 * rank + 16),
                     sorted=True).values
    threshold = float(top[rank - 1])
    for _ in range(ROUNDS):
        chosen = torch.nonzero(~(magnitude < max(threshold, tiny))).reshape(-1)   # NaN passes
        count = chosen.numel()
        if LOW * k <= count <= HIGH * k or count < LOW * k and threshold <= tiny:
            break
        # Correct the rank in proportion to the miss; beyond the sampled top, halve.
        new_rank = max(1, round(rank * k / max(count, 1)))
        if new_rank == rank:
            break
        rank = new_rank
        threshold = float(top[rank - 1]) if rank <= top.numel() else min(threshold, float(top[-1])) / 2
    if count > k:   # trim to exactly k (the selection stays ascending)
        keep = torch.topk(magnitude[chosen].nan_to_num(nan=math.inf), k, sorted=False).indices
        chosen = chosen[keep.sort().values]
    return chosen


class Memory:
    """One bucket's residual: v (and the velocity u under momentum correction)."""

    def __init__(self, numel, dtype, device, momentum):
        self.momentum = momentum
        self.v = torch.zeros(numel, dtype=dtype, device=device)
        self.u = torch.zeros(numel, dtype=dtype, device=device) if momentum else None

    def compensate(self, g: torch.Tensor) -> torch.Tensor:
        """Adds this step's gradient; returns v, the accumulated vector to select from."""
        if self.u is not None:
            self.u.mul_(self.momentum).add_(g)   # u <- m u + g
            self.v.add_(self.u)                  # v <- v + u
        else:
            self.v.add_(g)                       # v <- v + g  (error feedback)
        return self.v

    def update(self, sent: torch.Tensor):
        """Clears what was sent (momentum factor masking clears the velocity too)."""
        self.v.index_fill_(0, sent, 0)
        if self.u is not None:
            self.u.index_fill_(0, sent, 0)


class Bucket:
    """Parameters fused into one DGC sync: their gradients as slices of one flat vector."""

    def __init__(self, name, params, dgc: DGC):
        self.name, self.params, self.dgc = name, list(params), dgc
        first = self.params[0]
        self.numel = sum(p.numel() for p in self.params)
        starts = [0]
        for p in self.params:
            starts.append(starts[-1] + p.numel())
        self.slices = [(start, p.numel()) for start, p in zip(starts, self.params)]
        # Half-precision gradients accumulate in float32: the residual is a long sum.
        dtype = first.dtype if first.dtype in (torch.float32, torch.float64) else torch.float32
        self.memory = Memory(self.numel, dtype, first.device, dgc.momentum)
        self.steps = 0
        self.last_sent = None   # the last step's selection (1-D sparse), for checks and profiles

    def flat_gradient(self) -> torch.Tensor:
        """The parameters' gradients as one flat vector (zeros for a parameter without one)."""
        parts = [p.new_zeros(p.numel()) if p.grad is None
                 else (p.grad.to_dense() if p.grad.is_sparse else p.grad).reshape(-1)
                 for p in self.params]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def compress(self, g: torch.Tensor, size: int) -> torch.Tensor:
        """One step's local work on the bucket's flat gradient g (n = size ranks): accumulate,
        select, clear. Returns the selected coordinates as a 1-D sparse COO tensor of the
        bucket's length (coalesced)."""
        if g.numel() != self.numel:
            raise ValueError(f"zen_hvd DGC: bucket {self.name!r} holds {self.numel} values, and was "
                             f"given a gradient of {g.numel()} (its parameters changed?)")
        if self.dgc.clip_norm is not None:   # local clipping to clip_norm / sqrt(n)
            limit = self.dgc.clip_norm / math.sqrt(size)
            norm = float(torch.linalg.vector_norm(g))
            if norm > limit:
                g = g * (limit / norm)
        v = self.memory.compensate(g)
        magnitude = v.abs()
        density = self.dgc.density(self.steps)
        # Each parameter's own top k (one threshold over the whole bucket would starve the
        # layers whose gradients are small); the slices are in order, so the union is ascending.
        chosen = torch.cat([offset + top_k(magnitude[offset:offset + n], max(1, math.ceil(density * n)),
                                           self.dgc.sample_ratio, start=self.steps)
                            for offset, n in self.slices])
        values = v.index_select(0, chosen)
        self.memory.update(chosen)
        self.steps += 1
        self.last_sent = torch.sparse_coo_tensor(chosen.reshape(1, -1), values, (self.numel,),
                                                 is_coalesced=True, check_invariants=False)
        return self.last_sent

    def state_dict(self) -> dict:
        """This rank's residual (v, and u under momentum correction) and its step count."""
        u = self.memory.u
        return dict(numel=self.numel, steps=self.steps, v=self.memory.v.clone(),
                    u=None if u is None else u.clone())

    def check_state(self, state: dict) -> None:
        """ValueError unless `state` (a state_dict()) fits this bucket."""
        if state["numel"] != self.numel:
            raise ValueError(f"zen_hvd DGC state: bucket {self.name!r} holds {self.numel} values, the "
                             f"state_dict's {state['numel']} (a different model?)")
        if (state["u"] is None) != (self.memory.u is None):
            raise ValueError(f"zen_hvd DGC state: bucket {self.name!r} was saved with momentum "
                             f"{'0' if state['u'] is None else '> 0'}, and runs with momentum "
                             f"{self.dgc.momentum}")

    def load_state_dict(self, state: "dict | None", residual: bool = True) -> None:
        """Restore the step count (the warm-up stage) and, if `residual`, the residual; without
        it the residual starts from zero (it was another rank's, see the optimizer). None:
        start over (step 0, zero residual)."""
        if state is not None:
            self.check_state(state)
        self.steps = int(state["steps"]) if state is not None else 0
        for mine, key in ((self.memory.v, "v"), (self.memory.u, "u")):
            if mine is None:
                continue
            if state is not None and residual:
                mine.copy_(state[key])
            else:
                mine.zero_()

    # -- as an optimizer's sync item (worker.py) ----------------------------------------
    @property
    def num_units(self) -> int:
        return self.numel

    def sync(self, size, **kw):
        """The bucket's gradients by elements (gradients.sync_dgc): (the synchronized flat
        gradient, the sync's info)."""
        return sync_dgc(self, self.flat_gradient(), size, **kw)

    def step_done(self):
        pass

    def dense(self, units, values) -> torch.Tensor:
        """The synchronized sum (units ascending, values [K, 1]) as the bucket's flat dense
        gradient, zero outside the union of what the ranks sent."""
        flat = torch.zeros(self.numel, dtype=self.params[0].dtype, device=self.params[0].device)
        if len(units):
            flat[torch.as_tensor(units, device=flat.device)] = values.reshape(-1).to(flat)
        return flat

    def write_back(self, flat):
        """The bucket's synchronized flat gradient into each parameter's .grad."""
        for p, (offset, n) in zip(self.params, self.slices):
            part = flat[offset:offset + n].view_as(p)
            if p.grad is None or p.grad.is_sparse:
                p.grad = part   # a view: the parameters' gradients share the flat vector
            else:
                p.grad.copy_(part)


def buckets(params, dgc: DGC):
    """Split parameters (in sync order) into buckets of at most dgc.bucket_bytes, one dtype and
    device per bucket; each bucket is named after its first parameter."""
    out, current, nbytes = [], [], 0
    for name, p in params:
        size = p.numel() * p.element_size()
        if current and (nbytes + size > dgc.bucket_bytes or current[0][1].dtype != p.dtype
                        or current[0][1].device != p.device):
            out.append(current)
            current, nbytes = [], 0
        current.append((name, p))
        nbytes += size
    if current:
        out.append(current)
    return [Bucket(f"dgc.{group[0][0]}+{len(group) - 1}", [p for _, p in group], dgc)
            for group in out]


def save_states(buckets, rank: int, size: int) -> dict:
    """Every bucket's state_dict, with the rank that saved them (residuals are per rank)."""
    return dict(rank=rank, size=size, buckets={b.name: b.state_dict() for b in buckets})


def check_states(buckets, saved) -> None:
    """ValueError unless `saved` (save_states' dict, or None: no DGC state) fits these buckets."""
    if saved is None:
        return
    names = {b.name for b in buckets}
    if not set(saved["buckets"]) >= names:
        raise ValueError(f"zen_hvd DGC state: the state_dict's buckets {sorted(saved['buckets'])} are "
                         f"not this optimizer's {sorted(names)} (another model, or other DGC settings?)")
    for b in buckets:
        b.check_state(saved["buckets"][b.name])


def load_states(buckets, saved, rank: int, size: int) -> None:
    """Restore buckets from save_states' dict (checked first); None (no DGC state saved)
    starts DGC over (zero residuals, step 0)."""
    check_states(buckets, saved)
    if saved is None:
        warnings.warn("zen_hvd: the state_dict has no DGC state (saved without DGC?): DGC's "
                      "residuals and warm-up start over", stacklevel=3)
        for b in buckets:
            b.load_state_dict(None)
        return
    own = own_residuals(saved, rank, size)
    for b in buckets:
        b.load_state_dict(saved["buckets"][b.name], residual=own)


def own_residuals(saved, rank: int, size: int) -> bool:
    """Whether DGC state saved by saved["rank"] of saved["size"] restores this rank's residuals.
    They are per rank: each rank's holds what it has not sent yet. A state saved by this rank
    (same rank and size) restores them exactly; one saved by another rank (rank 0's checkpoint
    loaded everywhere) restores the step count only, and the residuals start from zero, since
    adding rank 0's residual on every rank would count it n times (with a warning)."""
    own = saved["rank"] == rank and saved["size"] == size
    if not own:
        warnings.warn(f"zen_hvd: DGC state saved by rank {saved['rank']} of {saved['size']}, loaded on "
                      f"rank {rank} of {size}: the step count is restored and the residuals "
                      "start from zero (they are per rank; save and load each rank's own "
                      "state_dict to resume exactly)", stacklevel=4)
    return own


class _HorovodChoices(type):
    """Compression's other attributes are Horovod's, imported when first asked for."""

    def __getattr__(cls, name):
        from horovod.torch.compression import Compression as horovods

        return getattr(horovods, name)


class Compression(metaclass=_HorovodChoices):
    """Horovod's compression choices (none, fp16: for the dense allreduce) and DGC:
    `compression=zen_hvd.Compression.dgc(ratio=0.05)` (see DGC for its arguments)."""

    dgc = DGC
