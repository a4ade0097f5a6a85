"""Elastic Horovod with zen_hvd.DistributedOptimizer: a worker joins, then one exits.

    horovodrun -np 2 --min-np 2 --max-np 3 --host-discovery-script D python elastic_case.py HOSTS

D prints the file HOSTS. The job starts on "localhost:2" and "127.0.0.1:0" (horovodrun's
elastic driver does not start on one host alone). Before step 2 rank 0 gives 127.0.0.1 a
slot and the ranks wait for the new worker (a HostsUpdatedInterrupt, then a
reset); the worker that joined has no optimizer state and gets rank 0's through
hvd.elastic.TorchState. Before step 5's backward that worker exits (os._exit), so the others
lose a peer in the middle of a step: the Zen sync or Horovod's allreduce raises
HorovodInternalError, elastic restores the commit after step 4 and the two left redo step 5.

At the end rank 0 replays the committed steps in float64 in one process (the mean over each
step's ranks of their losses, with the ranks each step had) and prints "elastic: ok" when the
trained model equals it. ZEN_HVD_TRANSPORT picks the transport.
"""
import copy
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import zen_hvd as hvd

STEPS, JOIN_AT, LEAVE_AT = 8, 2, 5
NEW_HOST = "127.0.0.1"
V, D, C = 40, 4, 3
hosts_file = sys.argv[1]
hvd.init()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)                      # dense gradient, Zen by rows
        self.bag = nn.EmbeddingBag(V, D, mode="sum", sparse=True)   # torch sparse, Zen
        self.fc = nn.Linear(D, C)                          # Horovod's allreduce

    def forward(self, x):
        return self.fc(torch.tanh(self.emb(x).mean(1) + self.bag(x)))


def loss_of(model, step, r, size):
    g = torch.Generator().manual_seed(100 * step + 10 * size + r)
    x = (torch.rand(3, 4, generator=g) ** 2 * V).long()
    return F.cross_entropy(model(x), torch.randint(0, C, (3,), generator=g))


def sgd(model):
    return torch.optim.SGD([dict(params=[model.bag.weight]),
                            dict(params=[model.emb.weight, *model.fc.parameters()], momentum=0.9)],
                           lr=0.5)


torch.manual_seed(0)
model = Net()
initial = copy.deepcopy(model)
opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        if state.step == JOIN_AT and hvd.size() == 2:
            if hvd.rank() == 0:
                with open(hosts_file, "w") as f:
                    f.write(f"localhost:2\n{NEW_HOST}:1\n")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:   # ends with HostsUpdatedInterrupt
                time.sleep(0.2)
                state.check_host_updates()
            raise RuntimeError("the new worker did not join within 120 s")
        if state.step == LEAVE_AT and os.environ.get("HOROVOD_HOSTNAME") == NEW_HOST:
            os._exit(1)
        opt.zero_grad()
        loss_of(model, state.step, hvd.rank(), hvd.size()).backward()
        opt.step()
        state.sizes = state.sizes + [hvd.size()]
        state.step += 1
        state.commit()


state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])
train(state)

if hvd.rank() == 0:
    expected = [2] * JOIN_AT + [3] * (LEAVE_AT - JOIN_AT) + [2] * (STEPS - LEAVE_AT)
    assert state.sizes == expected, f"sizes per step {state.sizes}, expected {expected}"
    ref = initial.double()
    ref_opt = sgd(ref)
    for step, size in enumerate(state.sizes):
        ref_opt.zero_grad()
        sum(loss_of(ref, step, r, size) for r in range(size)).div(size).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        err = (p.detach().double() - q.detach()).abs().max().item()
        assert err < 1e-5, f"{name}: differs from the float64 replay by {err:.3g}"
    print(f"elastic: ok ({hvd.comm_stats()['calls']} transport calls, sizes {state.sizes})",
          flush=True)
