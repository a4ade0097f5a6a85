"""A small GPT-style decoder trained with Deep Gradient Compression (DGC, top 5%) through Zen.

    horovodrun -np 4 -H localhost:4 python examples/gpt.py                 # Zen + DGC 5%
    mpirun -np 4 python examples/gpt.py --small [--dgc 0.01] [--sync horovod|horovod-dense]
    torchrun --nproc-per-node 4 examples/gpt.py --ddp --small [--sync zen|ddp|ddp-dense]

The model has a Llama-like shape, scaled down: token embedding (sparse=True: by rows through
Zen), --layers pre-norm blocks (RMSNorm, causal multi-head self-attention, a SwiGLU MLP) and
an untied output projection. Full size: 6 layers of width 512, 8 heads, vocabulary 32,000;
--small: 2 layers of width 128, 4 heads, vocabulary 8,000.

The switch is one line (examples/common.py, make_optimizer):
    opt = zen_hvd.DistributedOptimizer(opt, named_parameters=...,
                                       compression=zen_hvd.Compression.dgc(ratio=0.05))
DGC's momentum correction takes the place of the optimizer's momentum for the compressed
matrices, so their parameter group runs SGD without momentum; every other parameter (the
embedding, the norms) uses momentum 0.9, as do all parameters with --sync horovod*, so the two
runs apply the same momentum. --dgc 1 sends everything (DGC's bookkeeping, no compression).
Under torchrun with --ddp, DGC runs in Zen's DDP comm hook instead,
    model.register_comm_hook(zen_hvd.ddp.ZenState(dgc=0.05), zen_hvd.ddp.zen_hook)
on every dense bucket from the second step on (DDP's buckets are final then), with plain error
feedback: the optimizer keeps momentum 0.9 on every parameter, as with --sync ddp*.

Tokens are synthetic by default: a fixed random bigram chain (each token has 4 likely
successors), so the loss can fall well below log(vocab); --data FILE reads a text file, one
sentence per line (whitespace tokens hashed to ids).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the examples' common.py
import common  # noqa: E402

SIZES = {"vocab": (32_000, 8_000, "vocabulary"),
         "width": (512, 128, "model width"),
         "layers": (6, 2, "decoder blocks"),
         "heads": (8, 4, "attention heads"),
         "batch": (16, 8, "sequences per rank"),
         "seq_len": (128, 32, "tokens per sequence")}
MOMENTUM = 0.9


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(ap, lr=0.5)
    common.add_size_args(ap, SIZES)
    ap.set_defaults(dgc=0.05)   # this example's point; --sync horovod* runs without it
    ap.add_argument("--data", default=None, help="a text file, one sentence per line")
    return common.parse(ap, argv)


class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """x + attention(norm(x)), then x + SwiGLU(norm(x))."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        hidden = 4 * width * 2 // 3
        self.gate, self.up = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).transpose(1, 3).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class GPT(nn.Module):
    def __init__(self, vocab, width, layers, heads, seq_len):
        super().__init__()
        self.embedding = nn.Embedding(vocab, width, sparse=True)
        self.position = nn.Parameter(torch.randn(seq_len, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.output = nn.Linear(width, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def loss(self, tokens):
        x, y = tokens[:, :-1], tokens[:, 1:]
        h = self.embedding(x) + self.position[:x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.output(self.norm(h)).flatten(0, 1), y.reshape(-1))


def token_stream(args, rank):
    """Rank's batches of token sequences: the synthetic bigram chain, or windows of --data."""
    rng = np.random.default_rng([args.seed, rank])
    n = args.seq_len + 1
    if args.data:
        ids = common.read_corpus(args.data, args.vocab)
        while True:
            yield (torch.from_numpy(common.text_windows(ids, rng, args.batch, n)),)
    successors = np.random.default_rng(args.seed).integers(0, args.vocab, (args.vocab, 4))
    while True:
        seq = np.empty((args.batch, n), np.int64)
        seq[:, 0] = rng.integers(0, args.vocab, args.batch)
        for t in range(1, n):
            seq[:, t] = successors[seq[:, t - 1], rng.integers(0, 4, args.batch)]
        yield (torch.from_numpy(seq),)


def optimizer(model, args):
    """SGD: no momentum on the matrices DGC compresses (its momentum correction is theirs),
    momentum 0.9 on everything else, and on everything without DGC or with --ddp (the hook's
    DGC has no momentum correction)."""
    if args.dgc is None or args.ddp:
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM)
    compressed = [p for name, p in model.named_parameters() if p.dim() >= 2 and name != "embedding.weight"]
    ids = {id(p) for p in compressed}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return torch.optim.SGD([dict(params=compressed, momentum=0.0), dict(params=rest, momentum=MOMENTUM)],
                           lr=args.lr)


def train(args):
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.width, args.layers, args.heads, args.seq_len)
    params = sum(p.numel() for p in model.parameters())
    about = (f"{args.layers} layers x width {args.width}, {args.heads} heads, vocab {args.vocab:,}, "
             f"{params / 1e6:.1f}M parameters, batch {args.batch} x {args.seq_len}, "
             f"log(vocab) = {math.log(args.vocab):.2f}")
    return common.run(args, model, lambda rank, ranks: token_stream(args, rank), model.loss, "gpt", about,
                      optimizer=optimizer(model, args))


if __name__ == "__main__":
    common.summary(train(parse_args()))
