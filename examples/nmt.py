"""A sequence-to-sequence translation model with attention trained with Horovod or PyTorch DDP,
where Zen is a one-line switch.

    horovodrun -np 4 -H localhost:4 python examples/nmt.py --sync zen
    mpirun -np 4 python examples/nmt.py --small [--sync zen|horovod|horovod-dense] [--src FILE --tgt FILE]
    torchrun --nproc-per-node 4 examples/nmt.py --ddp --small [--sync zen|ddp|ddp-dense]

The model: a GRU encoder and a GRU decoder (hidden 512, embeddings 512; --small: 128 and 128,
vocabulary 30,000 instead of 50,000) with Luong's attention ("general" score h_t' W h_s over the
encoder's outputs, then h~_t = tanh(W_c [c_t; h_t])), and a sampled softmax like lstm_lm's: each
rank scores its batch's targets against the batch's target set plus --negatives uniform negatives
from an output embedding. The source, target and output embeddings are nn.Embedding(sparse=True),
so every large layer has sparse gradients.

Data: synthetic by default (a Zipf source sentence; its translation the reversed sentence mapped
through a fixed permutation of the vocabulary, so the loss can fall), or --src FILE --tgt FILE: a
parallel corpus, one sentence per line, whitespace tokens hashed to ids, sentences cut or padded
to --seq-len (the end-of-sentence token included).

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

PAD, BOS, EOS, FIRST_WORD = 0, 1, 2, 3  # the ids below FIRST_WORD are no word's
SIZES = {"vocab": (50_000, 30_000, "vocabulary of each language (rows of each embedding)"),
         "embed": (512, 128, "embedding dimension"),
         "hidden": (512, 128, "GRU units"),
         "batch": (64, 32, "sentence pairs per rank"),
         "seq_len": (20, 12, "tokens per sentence"),
         "negatives": (2048, 1024, "sampled-softmax negatives per batch")}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(ap, lr=0.5)
    common.add_size_args(ap, SIZES)
    ap.add_argument("--src", default=None, help="source sentences, one a line (with --tgt)")
    ap.add_argument("--tgt", default=None, help="their translations, line by line")
    args = common.parse(ap, argv)
    if (args.src is None) != (args.tgt is None):
        ap.error("--src and --tgt go together")
    return args


class Seq2Seq(nn.Module):
    def __init__(self, vocab, embed, hidden):
        super().__init__()
        self.src_embedding = nn.Embedding(vocab, embed, sparse=True)
        self.tgt_embedding = nn.Embedding(vocab, embed, sparse=True)
        self.encoder = nn.GRU(embed, hidden, batch_first=True)
        self.decoder = nn.GRU(embed, hidden, batch_first=True)
        self.score = nn.Linear(hidden, hidden, bias=False)    # Luong's "general" W
        self.combine = nn.Linear(2 * hidden, hidden)          # W_c
        self.output = nn.Embedding(vocab, hidden, sparse=True)  # sampled-softmax weights
        nn.init.normal_(self.output.weight, std=hidden ** -0.5)  # logits of unit scale at the start

    def loss(self, src, tgt, negatives):
        """Cross-entropy of each target token (padding excluded), the decoder fed the target
        shifted right (teacher forcing)."""
        memory, state = self.encoder(self.src_embedding(src))                  # batch x S x H
        shifted = torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], 1)
        h, _ = self.decoder(self.tgt_embedding(shifted), state)               # batch x T x H
        scores = (h @ self.score(memory).transpose(1, 2)).masked_fill((src == PAD).unsqueeze(1), -torch.inf)
        context = torch.softmax(scores, -1) @ memory
        attended = torch.tanh(self.combine(torch.cat([context, h], -1)))
        words = tgt.reshape(-1) != PAD
        y, a = tgt.reshape(-1)[words], attended.reshape(-1, attended.shape[-1])[words]
        candidates, target = torch.unique(torch.cat([y, negatives]), return_inverse=True)
        return F.cross_entropy(a @ self.output(candidates).t(), target[:y.numel()])


def read_parallel(src_path, tgt_path, vocab, seq_len):
    """Two aligned files as (source, target) id arrays, lines x seq_len: each line's whitespace
    tokens hashed to word ids, then EOS, cut or padded to seq_len. Files with different line
    counts raise ValueError naming both."""
    sides = []
    for path in (src_path, tgt_path):
        with open(path, encoding="utf-8", errors="replace") as f:
            sides.append([line.split() for line in f])
    if len(sides[0]) != len(sides[1]):
        raise ValueError(f"{src_path} has {len(sides[0])} lines but {tgt_path} has {len(sides[1])}: "
                         f"a parallel corpus needs one translation per line")
    if not sides[0]:
        raise ValueError(f"{src_path} and {tgt_path} are empty")

    def ids(words):
        row = [FIRST_WORD + common.token_id(w, vocab - FIRST_WORD) for w in words[:seq_len - 1]] + [EOS]
        return row + [PAD] * (seq_len - len(row))

    return tuple(np.array([ids(words) for words in side], dtype=np.int64) for side in sides)


def synthetic_pairs(rng, permutation, batch, seq_len, vocab):
    """Zipf source sentences and their translations: reversed, each word mapped by permutation."""
    src = FIRST_WORD + (rng.zipf(1.1, (batch, seq_len)) - 1) % (vocab - FIRST_WORD)
    return src, permutation[src[:, ::-1]]


def pair_stream(args, rank):
    """Rank's batches (source, target, negatives): synthetic, or random pairs of --src/--tgt."""
    rng = np.random.default_rng([args.seed, rank])
    if args.src:
        corpus = read_parallel(args.src, args.tgt, args.vocab, args.seq_len)
    else:  # the synthetic language pair: the same permutation on every rank (--seed only)
        permutation = np.arange(args.vocab)
        permutation[FIRST_WORD:] = FIRST_WORD + np.random.default_rng(args.seed).permutation(args.vocab - FIRST_WORD)
    while True:
        if args.src:
            lines = rng.integers(0, len(corpus[0]), args.batch)
            src, tgt = corpus[0][lines], corpus[1][lines]
        else:
            src, tgt = synthetic_pairs(rng, permutation, args.batch, args.seq_len, args.vocab)
        negatives = rng.integers(FIRST_WORD, args.vocab, args.negatives)
        yield torch.from_numpy(src), torch.from_numpy(np.ascontiguousarray(tgt)), torch.from_numpy(negatives)


def train(args):
    """common.run's result for this model: samples_per_s, step_seconds (median), final_loss,
    zen_bytes and peer_bytes per timed step, losses, model."""
    torch.manual_seed(args.seed)
    model = Seq2Seq(args.vocab, args.embed, args.hidden)
    about = (f"batch {args.batch} x {args.seq_len}, vocab {args.vocab:,} x {args.embed} per language, "
             f"hidden {args.hidden}, {args.negatives} negatives")
    return common.run(args, model, lambda rank, ranks: pair_stream(args, rank), model.loss, "nmt", about)


if __name__ == "__main__":
    common.summary(train(parse_args()))
