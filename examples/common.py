"""The harness every example shares, so that each example file holds only its model and its data:
the command line, the one-line switch between Zen and Horovod, the training loop, the bytes
each rank receives, and the per-epoch log (console, --csv, --plot).

The switch (make_optimizer):
    opt = horovod.torch.DistributedOptimizer(opt, named_parameters=...)   # --sync horovod
    opt = zen_hvd.DistributedOptimizer(opt, named_parameters=...)         # --sync zen
(or `import zen_hvd as hvd` at the top of a Horovod script).

Bytes per step per rank (received): Zen's sparse syncs are counted by zen_hvd.comm_stats()
(data + control bytes); everything Horovod moves is computed from tensor sizes: its sparse
path allgathers every rank's (uncoalesced) indices and values, so a rank receives the other
ranks' nnz x (8 x sparse dims + the bytes of one row of values); its allreduce receives
2 (n-1)/n of the dense tensor's bytes.
"""
from __future__ import annotations

import csv
import hashlib
import math
import os
import statistics
import sys
import time

import torch
from tqdm import tqdm

import zen_hvd
from zen_hvd.bench.common import share_cores

SYNCS = ("zen", "horovod", "horovod-dense")
CSV_COLUMNS = ("example", "sync", "scheme", "ranks", "epoch", "samples_per_s", "loss",
               "zen_bytes_per_step", "horovod_bytes_per_step")


def add_common_args(ap, lr):
    """The options every example takes (lr: the example's default learning rate)."""
    ap.add_argument("--sync", choices=SYNCS, default="zen",
                    help="zen: zen_hvd.DistributedOptimizer; horovod: Horovod's (sparse gradients "
                         "allgathered); horovod-dense: Horovod's with sparse_as_dense=True")
    ap.add_argument("--scheme", choices=["auto", *zen_hvd.SCHEMES], default="auto",
                    help="Zen's sparse_allreduce scheme (--sync zen only)")
    ap.add_argument("--dgc", type=float, default=None, metavar="RATIO",
                    help="Deep Gradient Compression keeping RATIO of each gradient "
                         "(zen_hvd.Compression.dgc; --sync zen only; 0: none)")
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
    """ap.parse_args, with every size not given filled in from --small, and --dgc checked."""
    args = ap.parse_args(argv)
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
    """base_opt wrapped for --sync: Zen's DistributedOptimizer or Horovod's (the one-line switch)."""
    import horovod.torch as horovod

    if args.sync == "zen":
        extra = {} if args.dgc is None else {"compression": zen_hvd.Compression.dgc(ratio=args.dgc)}
        return zen_hvd.DistributedOptimizer(base_opt, named_parameters=model.named_parameters(),
                                            scheme=args.scheme, **extra)
    return horovod.DistributedOptimizer(base_opt, named_parameters=model.named_parameters(),
                                        sparse_as_dense=args.sync == "horovod-dense")


def local_sparse_grads(model):
    """{name: (nnz, bytes per entry)} of this rank's sparse gradients, before step() syncs them."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and g.is_sparse:
            row = math.prod(g.shape[g.sparse_dim():]) * g.element_size()
            out[name] = (g._nnz(), g.sparse_dim() * 8 + row)
    return out


def synced_by_zen(model, opt):
    """Names of the parameters whose gradients travel through Zen (counted by comm_stats, not
    computed): Zen's by rows, and under --dgc those of DGC's buckets; none with Horovod's optimizer."""
    by_dgc = {id(p) for bucket in getattr(opt, "dgc_buckets", ()) for p in bucket.params}
    return set(getattr(opt, "zen_parameter_names", ())) | {
        name for name, p in model.named_parameters() if id(p) in by_dgc}


def computed_horovod_bytes(model, sync, zen_names, sparse_before, prefix):
    """Bytes this rank received through Horovod this step, from the gradients' sizes (call after
    step(); zen_names: synced_by_zen; sparse_before: local_sparse_grads before step(); see the
    top of the file)."""
    import horovod.torch as hvd

    n, total = hvd.size(), 0.0
    for name, p in model.named_parameters():
        if p.grad is None or name in zen_names:
            continue  # Zen's syncs are counted by zen_hvd.comm_stats()
        if name in sparse_before and sync == "horovod":  # allgather of indices and values
            mine, entry = sparse_before[name]
            nnz = hvd.allgather(torch.tensor([mine]), name=f"{prefix}.nnz.{name}")
            total += (int(nnz.sum()) - mine) * entry
        else:  # allreduce of the dense tensor
            total += 2 * (n - 1) / n * p.numel() * p.element_size()
    return total


def zen_bytes_so_far():
    zen = zen_hvd.comm_stats()
    return zen["bytes_received"] + zen["control_bytes_received"]


def describe(args):
    """The synchronization, as the log and the plot name it."""
    if args.sync != "zen":
        return f"--sync {args.sync}"
    return f"--sync zen --scheme {args.scheme}" + (f" --dgc {args.dgc:g}" if args.dgc is not None else "")


def run(args, model, batches, loss_fn, name, about="", samples=None, optimizer=None):
    """Train `model` on every rank and return this rank's {samples_per_s, step_seconds (median),
    final_loss (the last step's, averaged over ranks), zen_bytes and horovod_bytes (received per
    timed step), losses (this rank's loss at every step, the --warmup ones first), model}.

    batches(rank, ranks): this rank's iterator of batch tuples; loss_fn(*batch): the loss;
    samples(batch): its sample count (default: the length of its first tensor); optimizer:
    the optimizer to wrap (default SGD at --lr); name: the example's (log, names of Horovod's
    collectives); about: the model and batch sizes, for the first log line.
    --warmup untimed steps, then --epochs x --steps timed ones, each timed from a barrier
    through step(); the bytes accounting runs after the timer stops."""
    import horovod.torch as hvd

    zen_hvd.init()
    rank, ranks = hvd.rank(), hvd.size()
    share_cores()   # torch threads per rank: the machine's cores over its local ranks
    count = samples or (lambda batch: len(batch[0]))
    opt = make_optimizer(model, args, optimizer or torch.optim.SGD(model.parameters(), lr=args.lr))
    zen_names = synced_by_zen(model, opt)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    stream = iter(batches(rank, ranks))
    log = EpochLog(args, name, ranks, rank == 0)
    log.line(f"{name} {describe(args)}: {ranks} ranks, {args.epochs} epoch(s) of {args.steps} steps "
             f"after {args.warmup} warm-up steps" + (f"; {about}" if about else ""))
    bar = tqdm(total=args.warmup + args.epochs * args.steps, desc=name, file=sys.stderr,
               disable=True if args.no_progress or rank != 0 else None)  # None: only on a terminal

    def step():
        batch = next(stream)
        hvd.barrier()
        t0 = time.perf_counter()
        loss = loss_fn(*batch)
        loss.backward()
        sparse = local_sparse_grads(model)
        opt.step()
        seconds = time.perf_counter() - t0
        # Not timed, and after step(): its allgather must not give Horovod's sparse
        # allgathers, queued during backward, untimed time to finish.
        received = computed_horovod_bytes(model, args.sync, zen_names, sparse, name)
        opt.zero_grad()
        losses.append(loss.item())
        densities.append([b.last_sent._nnz() / b.numel for b in getattr(opt, "dgc_buckets", ())
                          if b.last_sent is not None])
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
        log.epoch(epoch, samples_seen / max(seconds, 1e-12),
                  hvd.allreduce(torch.tensor(mean_loss), name=f"{name}.epoch_loss").item(),
                  (zen_bytes_so_far() - zen_before) / max(1, args.steps), received / max(1, args.steps),
                  [d for step_d in densities[-args.steps:] for d in step_d] if args.steps else [])
    bar.close()
    final = (hvd.allreduce(torch.tensor(losses[-1]), name=f"{name}.loss").item() if losses else float("nan"))
    if args.plot and rank == 0:
        plot_losses(args.plot, losses, args, name, ranks)
    seconds = [t for t, _, _ in timed]
    steps = max(1, len(timed))
    return dict(samples_per_s=sum(s for _, s, _ in timed) / max(sum(seconds), 1e-12),
                step_seconds=statistics.median(seconds) if seconds else 0.0, final_loss=final,
                zen_bytes=zen_bytes_so_far() / steps, horovod_bytes=sum(b for _, _, b in timed) / steps,
                losses=losses, model=model, dgc_densities=densities)


class EpochLog:
    """Rank 0's log: lines on stdout (past the progress bar), rows in --csv."""

    def __init__(self, args, name, ranks, active):
        self.args, self.name, self.ranks, self.active = args, name, ranks, active

    def line(self, text):
        if self.active:
            tqdm.write(text, file=sys.stdout)
            sys.stdout.flush()

    def epoch(self, epoch, samples_per_s, loss, zen_bytes, horovod_bytes, dgc_densities=()):
        """dgc_densities: the fraction each DGC bucket sent, at each of the epoch's steps."""
        dgc = (f"; DGC sent {statistics.fmean(dgc_densities):.2%} of the compressed coordinates "
               f"(target {self.args.dgc:.2%}; lowest of one bucket at one step {min(dgc_densities):.2%})"
               if dgc_densities else "")
        self.line(f"epoch {epoch}/{self.args.epochs}: {samples_per_s:.1f} samples/s, loss {loss:.4f}, "
                  f"bytes/step/rank received: Zen {zen_bytes:,.0f} (counted) + Horovod "
                  f"{horovod_bytes:,.0f} (computed){dgc}")
        if self.active and self.args.csv:
            new = not os.path.exists(self.args.csv) or os.path.getsize(self.args.csv) == 0
            with open(self.args.csv, "a", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(CSV_COLUMNS)
                scheme = self.args.scheme if self.args.sync == "zen" else ""
                writer.writerow([self.name, self.args.sync, scheme, self.ranks, epoch, f"{samples_per_s:.2f}",
                                 f"{loss:.6f}", f"{zen_bytes:.0f}", f"{horovod_bytes:.0f}"])


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
    import horovod.torch as hvd

    if hvd.rank() == 0:
        print(f"final loss {result['final_loss']:.6f} (mean over ranks), {result['samples_per_s']:.1f} "
              f"samples/s, {result['step_seconds'] * 1e3:.1f} ms/step (median)", flush=True)
