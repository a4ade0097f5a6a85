"""DeepFM (Guo et al. 2017), a click-through-rate model, trained with Horovod or PyTorch DDP,
where Zen is a one-line switch.

    horovodrun -np 4 -H localhost:4 python examples/deepfm.py --sync zen
    mpirun -np 4 python examples/deepfm.py --small [--sync zen|horovod|horovod-dense] [--data FILE]
    torchrun --nproc-per-node 4 examples/deepfm.py --ddp --small [--sync zen|ddp|ddp-dense]

Each example has 13 dense features and 26 categorical fields. Every categorical value is hashed,
with its field, into one shared table of --rows rows (1,000,000; --small: 100,000): a
--dim-wide embedding (16) and a first-order weight per row, both nn.Embedding(sparse=True).
The dense features (log-scaled counts) are normalized over the batch, so that SGD takes counts of
any scale. The logit adds the first-order terms, the factorization machine's second-order term
over the 26 field embeddings, and a deep MLP (400-400-400; --small: 128-128) over the
concatenated field embeddings and the dense features; the loss is binary cross-entropy, the
optimizer SGD.

Data: synthetic by default (each field's values Zipf-distributed, from --seed and the rank; the
labels drawn from a fixed random logistic model of the same rows, so the loss can fall), or
--data FILE in Criteo's tab-separated text format: label, 13 integer features, 26 categorical
hex strings (features may be empty), one example per line; rank r reads lines r, r + n, ...

The switch is in examples/common.py (make_optimizer):
    opt = horovod.torch.DistributedOptimizer(opt, named_parameters=...)   # --sync horovod
    opt = zen_hvd.DistributedOptimizer(opt, named_parameters=...)         # --sync zen
and under torchrun with --ddp (make_ddp; no Horovod), on torch.nn.parallel.DistributedDataParallel:
    model.register_comm_hook(zen_hvd.ddp.ZenState(), zen_hvd.ddp.zen_hook)  # --sync zen
    (nothing)                                                              # --sync ddp
which also explains the bytes per step the log prints.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the examples' common.py
import common  # noqa: E402

DENSE, FIELDS = 13, 26
SIZES = {"rows": (1_000_000, 100_000, "rows of the shared categorical table"),
         "dim": (16, 16, "embedding dimension"),
         "mlp": ("400,400,400", "128,128", "the deep part's hidden layers"),
         "batch": (1024, 256, "examples per rank")}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(ap, lr=0.5)
    common.add_size_args(ap, SIZES)
    ap.add_argument("--skew", type=float, default=1.2, help="Zipf exponent of the synthetic values")
    ap.add_argument("--data", default=None, help="a Criteo-format file (tab-separated, 40 fields a line)")
    return common.parse(ap, argv)


class DeepFM(nn.Module):
    def __init__(self, rows, dim, mlp):
        super().__init__()
        self.embedding = nn.Embedding(rows, dim, sparse=True)   # the factors v_i
        self.weight = nn.Embedding(rows, 1, sparse=True)        # the first-order weights w_i
        self.normalize = nn.BatchNorm1d(DENSE, affine=False)    # counts of any scale, for SGD
        self.dense = nn.Linear(DENSE, 1)                        # first order of the dense features
        nn.init.normal_(self.embedding.weight, std=0.01)
        nn.init.zeros_(self.weight.weight)  # first-order terms start at zero
        nn.init.zeros_(self.dense.weight)
        layers, width = [], FIELDS * dim + DENSE
        for units in mlp:
            layers += [nn.Linear(width, units), nn.ReLU()]
            width = units
        self.deep = nn.Sequential(*layers, nn.Linear(width, 1))

    def logits(self, dense, ids):
        dense = self.normalize(dense)
        v = self.embedding(ids)                                       # batch x fields x dim
        first = self.weight(ids).sum((1, 2)) + self.dense(dense).squeeze(1)
        second = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)    # sum over pairs of <v_i, v_j>
        deep = self.deep(torch.cat([v.flatten(1), dense], 1)).squeeze(1)
        return first + second + deep

    def loss(self, dense, ids, labels):
        return F.binary_cross_entropy_with_logits(self.logits(dense, ids), labels)


def table_rows(values, rows):
    """The shared table's row of each (field, value): a splitmix64 hash of the pair, modulo rows.
    values: batch x fields, int64 (a missing value is -1)."""
    x = (np.arange(values.shape[1], dtype=np.uint64) << np.uint64(32)) ^ values.astype(np.uint64)
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((x ^ (x >> np.uint64(31))) % np.uint64(rows)).astype(np.int64)


def dense_features(counts):
    """Integer counts as the model sees them: sign(x) log(1 + |x|)."""
    counts = np.asarray(counts, dtype=np.float32)
    return np.sign(counts) * np.log1p(np.abs(counts))


def synthetic_batches(args, rank):
    """Rank's batches (dense, ids, labels): Zipf values per field, labels from a logistic model
    of the rows and dense features (the same model on every rank: it depends on --seed only)."""
    teacher = np.random.default_rng(args.seed)
    row_weight, dense_weight = teacher.normal(0, 0.5, args.rows), teacher.normal(0, 0.5, DENSE)
    rng = np.random.default_rng([args.seed, rank])
    while True:
        ids = table_rows((rng.zipf(args.skew, (args.batch, FIELDS)) - 1) % (1 << 32), args.rows)
        dense = rng.standard_normal((args.batch, DENSE)).astype(np.float32)
        logit = row_weight[ids].sum(1) + dense @ dense_weight
        labels = (rng.random(args.batch) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        yield torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(labels)


def criteo_rows(path):
    """(label, 13 integer features, 26 categorical values) per line of a Criteo-format file; an
    empty integer feature is 0, an empty categorical value -1. A malformed line raises ValueError
    naming the file and the line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 1 + DENSE + FIELDS:
                raise ValueError(f"{path}, line {number}: {len(fields)} tab-separated fields, expected "
                                 f"{1 + DENSE + FIELDS} (label, {DENSE} integer features, {FIELDS} categorical)")
            try:
                label = int(fields[0])
                counts = [int(s) if s else 0 for s in fields[1:1 + DENSE]]
                values = [int(s, 16) & 0xFFFFFFFF if s else -1 for s in fields[1 + DENSE:]]
            except ValueError as e:
                raise ValueError(f"{path}, line {number}: {e}") from None
            if label not in (0, 1):
                raise ValueError(f"{path}, line {number}: label {label}, expected 0 or 1")
            yield label, counts, values


def criteo_batches(args, rank, ranks):
    """Rank's batches from --data: lines rank, rank + ranks, ..., read again from the top at its end."""
    pending = []
    while True:
        mine = 0
        for i, row in enumerate(criteo_rows(args.data)):
            if i % ranks != rank:
                continue
            mine += 1
            pending.append(row)
            if len(pending) == args.batch:
                labels, counts, values = zip(*pending)
                pending = []
                yield (torch.from_numpy(dense_features(counts)),
                       torch.from_numpy(table_rows(np.array(values, dtype=np.int64), args.rows)),
                       torch.tensor(labels, dtype=torch.float32))
        if mine == 0:
            raise ValueError(f"{args.data}: no line for rank {rank} of {ranks}")


def train(args):
    """common.run's result for this model: samples_per_s, step_seconds (median), final_loss,
    zen_bytes and peer_bytes per timed step, losses, model."""
    torch.manual_seed(args.seed)
    mlp = [int(units) for units in args.mlp.split(",") if units]
    model = DeepFM(args.rows, args.dim, mlp)
    about = (f"batch {args.batch}, table {args.rows:,} x {args.dim} (+ first order), "
             f"MLP {'-'.join(map(str, mlp))}")

    def batches(rank, ranks):
        return criteo_batches(args, rank, ranks) if args.data else synthetic_batches(args, rank)

    return common.run(args, model, batches, model.loss, "deepfm", about)


if __name__ == "__main__":
    common.summary(train(parse_args()))
