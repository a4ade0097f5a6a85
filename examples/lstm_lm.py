"""An LSTM language model trained with Horovod or PyTorch DDP, where Zen is a one-line switch.

    horovodrun -np 4 -H localhost:4 python examples/lstm_lm.py --sync zen
    mpirun -np 4 python examples/lstm_lm.py --small [--sync zen|horovod|horovod-dense] [--data FILE]
    torchrun --nproc-per-node 4 examples/lstm_lm.py --ddp --small [--sync zen|ddp|ddp-dense]

The model: a 100k x 1000 input embedding (sparse=True), an LSTM of 1000 units, and a sampled
softmax over an output embedding (sparse=True): each rank scores its batch's targets against the
batch's target set plus --negatives uniform negatives. --small is the CPU size: embedding 512,
hidden 128. Tokens are synthetic Zipf(1.1) by default; --data FILE reads a plain text corpus,
one sentence per line: its whitespace tokens hashed to ids, each line ended by an end-of-sentence
token, and each sequence a window of the text.

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

SIZES = {"vocab": (100_000, 100_000, "vocabulary (rows of both embeddings)"),
         "embed": (1000, 512, "input embedding dimension"),
         "hidden": (1000, 128, "LSTM units"),
         "batch": (16, 16, "sequences per rank"),
         "seq_len": (20, 20, "tokens per sequence"),
         "negatives": (1024, 1024, "sampled-softmax negatives per batch")}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(ap, lr=0.5)
    common.add_size_args(ap, SIZES)
    ap.add_argument("--data", default=None, help="a text file, one sentence per line")
    return common.parse(ap, argv)


class LSTMLM(nn.Module):
    def __init__(self, vocab, embed, hidden):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed, sparse=True)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.output = nn.Embedding(vocab, hidden, sparse=True)  # sampled-softmax weights

    def loss(self, tokens, negatives):
        x, y = tokens[:, :-1], tokens[:, 1:].reshape(-1)
        h, _ = self.lstm(self.embedding(x))
        candidates, target = torch.unique(torch.cat([y, negatives]), return_inverse=True)
        logits = h.reshape(-1, h.shape[-1]) @ self.output(candidates).t()
        return F.cross_entropy(logits, target[:y.numel()])


def token_stream(args, rank):
    """Rank's batches (tokens, negatives): synthetic Zipf tokens, or windows of the --data text."""
    rng = np.random.default_rng([args.seed, rank])
    n_tokens = args.batch * (args.seq_len + 1)
    if args.data:
        ids = common.read_corpus(args.data, args.vocab)
    while True:
        if args.data:
            batch = common.text_windows(ids, rng, args.batch, args.seq_len + 1)
        else:
            batch = (rng.zipf(1.1, n_tokens) - 1) % args.vocab
        negatives = rng.integers(0, args.vocab, args.negatives)
        yield (torch.from_numpy(batch.reshape(args.batch, args.seq_len + 1)),
               torch.from_numpy(negatives))


def train(args):
    """common.run's result for this model: samples_per_s, step_seconds (median), final_loss,
    zen_bytes and peer_bytes per timed step, losses, model."""
    torch.manual_seed(args.seed)
    model = LSTMLM(args.vocab, args.embed, args.hidden)
    about = (f"batch {args.batch} x {args.seq_len}, vocab {args.vocab:,} x {args.embed}, "
             f"hidden {args.hidden}, {args.negatives} negatives")
    return common.run(args, model, lambda rank, ranks: token_stream(args, rank), model.loss, "lstm_lm", about)


if __name__ == "__main__":
    common.summary(train(parse_args()))
