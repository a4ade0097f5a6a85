"""The harness every example shares, so that each example file holds only its model and its data:
the command line, the switch between Zen and its peer (Horovod, or PyTorch DDP's own reduction),
the training loop, the bytes each rank receives, and the per-epoch log (console, --csv, --plot).

Two runtimes, one training loop (HorovodSync and DDPSync: the few collectives it uses):
  Horovod (horovodrun, mpirun): the optimizer wrapped, the one-line switch (make_optimizer)
      opt = horovod.torch.DistributedOptimizer(opt, named_parameters=...)   # --sync horovod
      opt = zen_hvd.DistributedOptimizer(opt, named_parameters=...)         # --sync zen
  (or `import zen_hvd as hvd` at the top of a Horovod script); --sync horovod-dense is
  Horovod's with sparse_as_dense=True.
  DDP (--ddp, under torchrun; Horovod is never imported): the model wrapped in
  torch.nn.parallel.DistributedDataParallel (gloo), and the switch (make_ddp)
      model.register_comm_hook(zen_hvd.ddp.ZenState(scheme=...), zen_hvd.ddp.zen_hook)  # --sync zen
  --sync ddp is DDP's own reduction (gloo's allreduce, which allgathers sparse gradients);
  --sync ddp-dense builds the embeddings with sparse=False (DDP's dense allreduce).

Bytes per step per rank (received): Zen's syncs are counted by zen_hvd.comm_stats() (data +
control bytes); everything the peer moves is computed from tensor sizes: its sparse path
allgathers every rank's indices and values (Horovod's the gradient as it is, uncoalesced; gloo's
after coalescing it), so a rank receives the other ranks' nnz x (8 x sparse dims + the bytes of
one row of values); its allreduce receives 2 (n-1)/n of the dense tensor's bytes.
"""
from __future__ import annotations

import csv
import functools
import gc
import hashlib
import math
import os
import statistics
import sys
import time

import torch
from torch import nn
from tqdm import tqdm

import zen_hvd
from zen_hvd.bench.common import share_cores
from zen_hvd.runtime import launched_by_torchrun

HOROVOD_SYNCS = ("zen", "horovod", "horovod-dense")
DDP_SYNCS = ("zen", "ddp", "ddp-dense")
CSV_COLUMNS = ("example", "runtime", "sync", "scheme", "ranks", "epoch", "samples_per_s", "loss",
               "zen_bytes_per_step", "peer_bytes_per_step")


def add_common_args(ap, lr):
    """The options every example takes (lr: the example's default learning rate)."""
    ap.add_argument("--ddp", action="store_true",
                    help="PyTorch DDP under torchrun (no Horovod): --sync zen|ddp|ddp-dense")
    ap.add_argument("--sync", choices=HOROVOD_SYNCS + DDP_SYNCS[1:], default="zen",
                    help="zen: zen_hvd.DistributedOptimizer (with --ddp: Zen's DDP comm hook); "
                         "horovod: Horovod's (sparse gradients allgathered); horovod-dense: Horovod's "
                         "with sparse_as_dense=True; ddp (--ddp): DDP's own reduction (sparse gradients "
                         "allgathered); ddp-dense (--ddp): embeddings with sparse=False")
    ap.add_argument("--scheme", choices=["auto", *zen_hvd.SCHEMES], default="auto",
                    help="Zen's sparse_allreduce scheme (--sync zen only)")
    ap.add_argument("--dgc", type=float, default=None, metavar="RATIO",
                    help="Deep Gradient Compression keeping RATIO of each gradient "
                         "(zen_hvd.Compression.dgc, with --ddp ZenState(dgc=RATIO); --sync zen only; "
                         "0: none)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per epoch")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before the first epoch")
    ap.add_argument("--lr", type=float, default=lr, help="SGD learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", metavar="FILE", help="append one row per epoch to FILE")
    ap.add_argument("--plot", metavar="FILE.png", help="draw rank 0's loss per step into FILE.png")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_size_args(ap, sizes):
    """Model and batch sizes with a full default and a --small one (for a CPU):
    sizes = {name: (full, small, help)}. A size given on the command line wins over both."""
    ap.add_argument("--small", action="store_true", help="the CPU sizes (each size's second default)")
    for name, (full, small, text) in sizes.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(full), default=None,
                        help=f"{text} (default {full}; --small: {small})")
    ap.set_defaults(_sizes=sizes)


def parse(ap, argv=None):
    """ap.parse_args, with every size not given filled in from --small, and --sync and --dgc
    checked."""
    args = ap.parse_args(argv)
    if args.sync not in (DDP_SYNCS if args.ddp else HOROVOD_SYNCS):
        ap.error(f"--sync {args.sync} runs on Horovod, without --ddp" if args.ddp
                 else f"--sync {args.sync} runs under torchrun with --ddp")
    if launched_by_torchrun() and not args.ddp:
        ap.error("under torchrun, pass --ddp (without it the examples run on Horovod: horovodrun, mpirun)")
    for name, (full, small, _) in vars(args).pop("_sizes", {}).items():
        if getattr(args, name) is None:
            setattr(args, name, small if args.small else full)
    if args.dgc == 0:   # --dgc 0: no DGC (for an example whose default has it)
        args.dgc = None
    if args.dgc is not None and args.sync != "zen":
        if args.dgc != ap.get_default("dgc"):
            ap.error("--dgc needs --sync zen (compare DGC over another scheme with --sync zen --scheme NAME)")
        args.dgc = None   # the example's default DGC applies to Zen only
    return args


def token_id(word: str, buckets: int) -> int:
    """A text token's id: a hash of the token, modulo buckets (no vocabulary to build)."""
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little") % buckets


END_OF_SENTENCE = "</s>"


def read_corpus(path, vocab):
    """A text file's token ids: each line's whitespace tokens, then an end-of-sentence token."""
    import numpy as np

    with open(path, encoding="utf-8", errors="replace") as f:
        return np.array([token_id(w, vocab) for line in f for w in line.split() + [END_OF_SENTENCE]],
                        dtype=np.int64)


def text_windows(ids, rng, batch, length):
    """batch windows of `length` tokens at random places of a corpus (repeated if shorter)."""
    import numpy as np

    starts = rng.integers(0, max(1, ids.size - length), batch)
    return np.stack([np.resize(ids[s:s + length], length) for s in starts])


def make_optimizer(model, args, base_opt):
    """base_opt wrapped for --sync on Horovod: Zen's DistributedOptimizer or Horovod's (the
    one-line switch)."""
    import horovod.torch as horovod

    if args.sync == "zen":
        extra = {} if args.dgc is None else {"compression": zen_hvd.Compression.dgc(ratio=args.dgc)}
        return zen_hvd.DistributedOptimizer(base_opt, named_parameters=model.named_parameters(),
                                            scheme=args.scheme, **extra)
    return horovod.DistributedOptimizer(base_opt, named_parameters=model.named_parameters(),
                                        sparse_as_dense=args.sync == "horovod-dense")


class LossModule(nn.Module):
    """The example's loss as a module's forward: DDP prepares its reduction in its own forward,
    so the loss must run through it."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *batch):
        return self.loss_fn(*batch)


def make_ddp(model, loss_fn, args):
    """(the loss through DDP, Zen's hook state or None) for --sync under --ddp: DDP's own
    reduction, or Zen's comm hook (the switch); ddp-dense turns the embeddings dense first."""
    from torch.nn.parallel import DistributedDataParallel

    if args.sync == "ddp-dense":   # as if built with sparse=False: F.embedding reads the flag
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                m.sparse = False
    # Buffers (deepfm's batch-norm statistics) broadcast once, at construction, as Horovod's
    # broadcast_parameters does; then each rank's follow its own batches, as under Horovod.
    ddp = DistributedDataParallel(LossModule(model, loss_fn), forward_sync_buffers=False)
    if args.sync != "zen":
        return ddp, None
    state = zen_hvd.ddp.ZenState(scheme=args.scheme, dgc=args.dgc)
    ddp.register_comm_hook(state, zen_hvd.ddp.zen_hook)
    return ddp, state


class HorovodSync:
    """The collectives the training loop uses, on Horovod; the optimizer wrapped for --sync."""

    peer = "Horovod"
    coalesces = False   # its sparse allgather sends the gradient as it is, repeated rows too

    def __init__(self):
        import horovod.torch as hvd

        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()

    def prepare(self, model, loss_fn, args, base_opt):
        """The optimizer to step; rank 0's parameters on every rank."""
        self.loss = loss_fn
        self.opt = make_optimizer(model, args, base_opt)
        self.by_zen = synced_by_zen(model, self.opt)
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return self.opt

    def close(self):
        pass

    def zen_names(self, model, sparse):
        return self.by_zen

    def dgc_buckets(self):
        return getattr(self.opt, "dgc_buckets", ())

    def barrier(self):
        self.hvd.barrier()

    def mean(self, value, name) -> float:
        return self.hvd.allreduce(torch.tensor(value), name=name).item()

    def total(self, count, name) -> int:
        return int(self.hvd.allgather(torch.tensor([count]), name=name).sum())


class DDPSync:
    """The collectives the training loop uses, on torch.distributed; the model wrapped in DDP
    (which broadcasts rank 0's parameters at construction) for --sync."""

    peer = "DDP"
    coalesces = True    # gloo's sparse allreduce coalesces each rank's gradient, then allgathers

    def __init__(self):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise SystemExit("--ddp: torch.distributed is not running; launch with torchrun")
        self.dist = dist
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def prepare(self, model, loss_fn, args, base_opt):
        """The optimizer to step (base_opt as it is); self.loss runs through DDP."""
        self.ddp, self.state = make_ddp(model, loss_fn, args)
        return base_opt

    def loss(self, *batch):
        return self.ddp(*batch)

    def close(self):
        """DDP released now: left to the interpreter's exit, its gloo work sometimes ended the
        process ("terminate called without an active exception", about one exit in seven with
        torch 2.13, plain DDP too)."""
        self.ddp = None
        gc.collect()   # DDP's module and hooks refer to each other

    def zen_names(self, model, sparse):
        """Call after a step: the parameters Zen's hook synced in it: every sparse gradient
        (`sparse`: this step's), and every dense one where the step ran DGC."""
        if self.state is None:
            return set()
        # state.iter counts the steps run, this one included: it ran DGC if its index,
        # iter - 1, is at least start_dgc_iter.
        dgc_ran = self.state.dgc is not None and self.state.iter > self.state.start_dgc_iter
        return {name for name, _ in model.named_parameters() if dgc_ran or name in sparse}

    def dgc_buckets(self):
        return self.state.dgc_buckets if self.state is not None else ()

    def barrier(self):
        self.dist.barrier()

    def mean(self, value, name) -> float:
        t = torch.tensor(value)
        self.dist.all_reduce(t)
        return t.item() / self.size

    def total(self, count, name) -> int:
        t = torch.tensor([count])
        self.dist.all_reduce(t)
        return int(t)


class SparseGrads:
    """This rank's own sparse gradients of a step, as autograd hands each to its parameter (a
    tensor hook runs before the accumulation Horovod and DDP sync from), so that their sizes
    are read after the timed step."""

    def __init__(self, model):
        self.grads = {}
        for name, p in model.named_parameters():
            p.register_hook(functools.partial(self._keep, name))

    def _keep(self, name, grad):
        if grad.is_sparse:
            self.grads[name] = grad

    def take(self, coalesced):
        """{name: (nnz, bytes per entry)} of the step's sparse gradients, as sent (coalesced: after
        summing repeated rows), and forgets them."""
        out = {}
        for name, g in self.grads.items():
            row = math.prod(g.shape[g.sparse_dim():]) * g.element_size()
            out[name] = (g.coalesce()._nnz() if coalesced else g._nnz(), g.sparse_dim() * 8 + row)
        self.grads = {}
        return out


def synced_by_zen(model, opt):
    """Names of the parameters whose gradients travel through Zen (counted by comm_stats, not
    computed): Zen's by rows, and under --dgc those of DGC's buckets; none with Horovod's optimizer."""
    by_dgc = {id(p) for bucket in getattr(opt, "dgc_buckets", ()) for p in bucket.params}
    return set(getattr(opt, "zen_parameter_names", ())) | {
        name for name, p in model.named_parameters() if id(p) in by_dgc}


def computed_peer_bytes(model, args, sync, sparse, prefix):
    """Bytes this rank received through the peer (Horovod, or DDP's own collectives) this step,
    from the gradients' sizes (call after step(); sparse: SparseGrads.take's; see the top of
    the file)."""
    n, total = sync.size, 0.0
    zen_names = sync.zen_names(model, sparse)
    for name, p in model.named_parameters():
        if p.grad is None or name in zen_names:
            continue  # Zen's syncs are counted by zen_hvd.comm_stats()
        if name in sparse and args.sync in ("horovod", "ddp"):  # allgather of indices and values
            mine, entry = sparse[name]
            total += (sync.total(mine, f"{prefix}.nnz.{name}") - mine) * entry
        else:  # allreduce of the dense tensor
            total += 2 * (n - 1) / n * p.numel() * p.element_size()
    return total


def zen_bytes_so_far():
    zen = zen_hvd.comm_stats()
    return zen["bytes_received"] + zen["control_bytes_received"]


def describe(args):
    """The synchronization, as the log and the plot name it."""
    ddp = "--ddp " if args.ddp else ""
    if args.sync != "zen":
        return f"{ddp}--sync {args.sync}"
    return f"{ddp}--sync zen --scheme {args.scheme}" + (f" --dgc {args.dgc:g}" if args.dgc is not None else "")


def run(args, model, batches, loss_fn, name, about="", samples=None, optimizer=None):
    """Train `model` on every rank and return this rank's {samples_per_s, step_seconds (median),
    final_loss (the last step's, averaged over ranks), zen_bytes and peer_bytes (received per
    timed step: counted, and computed for Horovod or DDP), losses (this rank's loss at every
    step, the --warmup ones first), model}.

    batches(rank, ranks): this rank's iterator of batch tuples; loss_fn(*batch): the loss;
    samples(batch): its sample count (default: the length of its first tensor); optimizer:
    the optimizer to wrap (default SGD at --lr); name: the example's (log, names of Horovod's
    collectives); about: the model and batch sizes, for the first log line.
    --warmup untimed steps, then --epochs x --steps timed ones, each timed from a barrier
    through step(); the bytes accounting runs after the timer stops."""
    zen_hvd.init()
    sync = DDPSync() if args.ddp else HorovodSync()
    rank, ranks = sync.rank, sync.size
    share_cores()   # torch threads per rank: the machine's cores over its local ranks
    count = samples or (lambda batch: len(batch[0]))
    sparse = SparseGrads(model)
    opt = sync.prepare(model, loss_fn, args, optimizer or torch.optim.SGD(model.parameters(), lr=args.lr))
    stream = iter(batches(rank, ranks))
    log = EpochLog(args, name, ranks, rank == 0, sync.peer)
    log.line(f"{name} {describe(args)}: {ranks} ranks, {args.epochs} epoch(s) of {args.steps} steps "
             f"after {args.warmup} warm-up steps" + (f"; {about}" if about else ""))
    bar = tqdm(total=args.warmup + args.epochs * args.steps, desc=name, file=sys.stderr,
               disable=True if args.no_progress or rank != 0 else None)  # None: only on a terminal

    def step():
        batch = next(stream)
        sync.barrier()
        t0 = time.perf_counter()
        loss = sync.loss(*batch)
        loss.backward()
        opt.step()
        seconds = time.perf_counter() - t0
        # Not timed, and after step(): its allgather must not give Horovod's sparse
        # allgathers, queued during backward, untimed time to finish.
        received = computed_peer_bytes(model, args, sync, sparse.take(sync.coalesces), name)
        opt.zero_grad()
        losses.append(loss.item())
        densities.append([b.last_sent._nnz() / b.numel for b in sync.dgc_buckets() if b.last_sent is not None])
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        return seconds, count(batch) * ranks, received

    losses, timed, densities = [], [], []   # densities: per step, each DGC bucket's sent fraction
    for _ in range(args.warmup):
        step()
    zen_hvd.reset_comm_stats()
    for epoch in range(1, args.epochs + 1):
        zen_before = zen_bytes_so_far()
        epoch_steps = [step() for _ in range(args.steps)]
        timed += epoch_steps
        seconds, samples_seen, received = (sum(column) for column in zip(*epoch_steps or [(0, 0, 0)]))
        mean_loss = statistics.fmean(losses[-args.steps:]) if args.steps else float("nan")
        log.epoch(epoch, samples_seen / max(seconds, 1e-12), sync.mean(mean_loss, f"{name}.epoch_loss"),
                  (zen_bytes_so_far() - zen_before) / max(1, args.steps), received / max(1, args.steps),
                  [d for step_d in densities[-args.steps:] for d in step_d] if args.steps else [])
    bar.close()
    final = sync.mean(losses[-1], f"{name}.loss") if losses else float("nan")
    sync.close()
    if args.plot and rank == 0:
        plot_losses(args.plot, losses, args, name, ranks)
    seconds = [t for t, _, _ in timed]
    steps = max(1, len(timed))
    return dict(samples_per_s=sum(s for _, s, _ in timed) / max(sum(seconds), 1e-12),
                step_seconds=statistics.median(seconds) if seconds else 0.0, final_loss=final,
                zen_bytes=zen_bytes_so_far() / steps, peer_bytes=sum(b for _, _, b in timed) / steps,
                losses=losses, model=model, dgc_densities=densities)


class EpochLog:
    """Rank 0's log: lines on stdout (past the progress bar), rows in --csv."""

    def __init__(self, args, name, ranks, active, peer):
        self.args, self.name, self.ranks, self.active, self.peer = args, name, ranks, active, peer

    def line(self, text):
        if self.active:
            tqdm.write(text, file=sys.stdout)
            sys.stdout.flush()

    def epoch(self, epoch, samples_per_s, loss, zen_bytes, peer_bytes, dgc_densities=()):
        """dgc_densities: the fraction each DGC bucket sent, at each of the epoch's steps."""
        dgc = (f"; DGC sent {statistics.fmean(dgc_densities):.2%} of the compressed coordinates "
               f"(target {self.args.dgc:.2%}; lowest of one bucket at one step {min(dgc_densities):.2%})"
               if dgc_densities else "")
        self.line(f"epoch {epoch}/{self.args.epochs}: {samples_per_s:.1f} samples/s, loss {loss:.4f}, "
                  f"bytes/step/rank received: Zen {zen_bytes:,.0f} (counted) + {self.peer} "
                  f"{peer_bytes:,.0f} (computed){dgc}")
        if self.active and self.args.csv:
            new = not os.path.exists(self.args.csv) or os.path.getsize(self.args.csv) == 0
            with open(self.args.csv, "a", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(CSV_COLUMNS)
                scheme = self.args.scheme if self.args.sync == "zen" else ""
                writer.writerow([self.name, "ddp" if self.args.ddp else "horovod", self.args.sync, scheme,
                                 self.ranks, epoch, f"{samples_per_s:.2f}", f"{loss:.6f}", f"{zen_bytes:.0f}",
                                 f"{peer_bytes:.0f}"])


def plot_losses(path, losses, args, name, ranks):
    """A PNG of the loss per step (rendered by matplotlib's Agg canvas, no display needed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot(range(1, len(losses) + 1), losses, label="rank 0's loss")
    if args.warmup:
        ax.axvline(args.warmup + 0.5, color="gray", linestyle=":", label="end of warm-up")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"{name}: {describe(args)}, {ranks} ranks")
    ax.legend()
    fig.savefig(path, dpi=100)


def summary(result):
    """The result's line, printed on rank 0."""
    if zen_hvd.rank() == 0:
        print(f"final loss {result['final_loss']:.6f} (mean over ranks), {result['samples_per_s']:.1f} "
              f"samples/s, {result['step_seconds'] * 1e3:.1f} ms/step (median)", flush=True)
