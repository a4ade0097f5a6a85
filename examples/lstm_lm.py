"""An LSTM language model trained with Horovod, where Zen is a one-line switch.

    mpirun -np 4 python examples/lstm_lm.py [--sync zen|horovod|horovod-dense] [--data FILE]
    horovodrun -np 4 -H localhost:4 python examples/lstm_lm.py

The model: a 100k x 512 input embedding (sparse=True), an LSTM, and a sampled softmax over an
output embedding (sparse=True): each rank scores its batch's targets against the batch's
target set plus --negatives uniform negatives. Tokens are synthetic Zipf(1.1) by default;
--data FILE hashes a text file's whitespace tokens to ids.

The switch (see `make_optimizer`):
    opt = horovod.torch.DistributedOptimizer(opt, named_parameters=...)   # --sync horovod
    opt = zen_hvd.DistributedOptimizer(opt, named_parameters=...)         # --sync zen
(or `import zen_hvd as hvd` at the top of a Horovod script).

Bytes per step per rank (received): Zen's sparse syncs are counted by zen_hvd.comm_stats()
(data + control bytes); everything Horovod moves is computed from tensor sizes: its sparse
path allgathers every rank's (uncoalesced) indices and values, so a rank receives the other
ranks' nnz x (8 + 4 D) bytes; its allreduce receives 2 (n-1)/n of the dense tensor's bytes.
"""
from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sync", choices=["zen", "horovod", "horovod-dense"], default="zen")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="steps run before the timed ones")
    ap.add_argument("--batch", type=int, default=16, help="sequences per rank")
    ap.add_argument("--seq-len", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--embed", type=int, default=512)
    ap.add_argument("--negatives", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None, help="a text file (whitespace tokens, hashed to ids)")
    return ap.parse_args(argv)


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
    """Rank's batches: synthetic Zipf tokens, or a text file's tokens hashed to ids."""
    rng = np.random.default_rng([args.seed, rank])
    n_tokens = args.batch * (args.seq_len + 1)
    if args.data:
        with open(args.data, encoding="utf-8", errors="replace") as f:
            ids = np.array([int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                            % args.vocab for w in f.read().split()], dtype=np.int64)
    while True:
        if args.data:
            starts = rng.integers(0, max(1, ids.size - n_tokens), args.batch)
            batch = np.stack([np.resize(ids[s:s + args.seq_len + 1], args.seq_len + 1) for s in starts])
        else:
            batch = (rng.zipf(1.1, n_tokens) - 1) % args.vocab
        negatives = rng.integers(0, args.vocab, args.negatives)
        yield (torch.from_numpy(batch.reshape(args.batch, args.seq_len + 1)),
               torch.from_numpy(negatives))


def make_optimizer(model, args):
    import horovod.torch as horovod
    import zen_hvd

    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    if args.sync == "zen":
        return zen_hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    return horovod.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                        sparse_as_dense=args.sync == "horovod-dense")


def local_nnz(model):
    """Entries of this rank's sparse gradients, before they are synchronized."""
    return {name: p.grad._nnz() for name, p in model.named_parameters()
            if p.grad is not None and p.grad.is_sparse}


def computed_horovod_bytes(model, args, hvd, nnz_before):
    """Bytes this rank received through Horovod this step, from the local gradients' sizes
    (nnz_before: local_nnz before step(); call after step(); see the top of the file)."""
    n, total = hvd.size(), 0.0
    for name, p in model.named_parameters():
        if p.grad is None or name in nnz_before and args.sync == "zen":
            continue  # Zen's syncs are counted by zen_hvd.comm_stats()
        if name in nnz_before and args.sync == "horovod":  # allgather of indices and values
            mine = nnz_before[name]
            nnz = hvd.allgather(torch.tensor([mine]), name=f"lstm_lm.nnz.{name}")
            row = p.grad.sparse_dim() * 8 + p[0].numel() * p.element_size()
            total += (int(nnz.sum()) - mine) * row
        else:  # allreduce of the dense tensor
            total += 2 * (n - 1) / n * p.numel() * p.element_size()
    return total


def train(args):
    """Returns this rank's {samples_per_s, step_seconds (median), final_loss, zen_bytes,
    horovod_bytes} per timed step (the --warmup steps before them are not counted)."""
    import horovod.torch as hvd
    import zen_hvd

    zen_hvd.init()
    torch.manual_seed(args.seed)
    model = LSTMLM(args.vocab, args.embed, args.hidden)
    opt = make_optimizer(model, args)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    stream = token_stream(args, hvd.rank())
    horovod_bytes, times, loss = 0.0, [], None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            zen_hvd.reset_comm_stats()
            horovod_bytes, times = 0.0, []
        tokens, negatives = next(stream)
        hvd.barrier()
        t0 = time.perf_counter()
        loss = model.loss(tokens, negatives)
        loss.backward()
        nnz = local_nnz(model)
        opt.step()
        times.append(time.perf_counter() - t0)
        # Not timed, and after step(): its allgather must not give Horovod's sparse
        # allgathers, queued during backward, untimed time to finish.
        horovod_bytes += computed_horovod_bytes(model, args, hvd, nnz)
        opt.zero_grad()
    final = hvd.allreduce(loss.detach(), name="lstm_lm.loss").item()  # mean over ranks
    zen = zen_hvd.comm_stats()
    steps = max(1, args.steps)
    return dict(samples_per_s=len(times) * args.batch * hvd.size() / max(sum(times), 1e-12),
                step_seconds=float(np.median(times)) if times else 0.0, final_loss=final,
                zen_bytes=(zen["bytes_received"] + zen["control_bytes_received"]) / steps,
                horovod_bytes=horovod_bytes / steps)


def main():
    args = parse_args()
    r = train(args)
    import horovod.torch as hvd

    if hvd.rank() == 0:
        print(f"lstm_lm --sync {args.sync}: {hvd.size()} ranks, {args.steps} steps after {args.warmup} "
              f"warm-up steps, batch {args.batch} x "
              f"{args.seq_len}, vocab {args.vocab} x {args.embed}, hidden {args.hidden}")
        print(f"  {r['samples_per_s']:.1f} samples/s, final loss {r['final_loss']:.6f}, bytes/step/rank "
              f"received: Zen {r['zen_bytes']:,.0f} (counted) + Horovod {r['horovod_bytes']:,.0f} (computed)")


if __name__ == "__main__":
    main()
