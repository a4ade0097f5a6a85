"""A peer that leaves or falls out of step: the job must end with an error, not hang.

    mpirun -np 3 python tests/mpi/fault_cases.py MODE [TRANSPORT]

MODE:
  exit        rank 1 calls sys.exit(1) between two syncs; the others wait for its Push.
  extra_step  rank 1 runs one optimizer step more than the others, which have finished.
  step_again  rank 1 calls optimizer.step() twice after one backward pass, mid-training: its
              extra step pairs with the others' next, and every rank raises the same error
              (each prints it; the test expects it three times).
  exit_in_pull  rank 1 exits where its Pull would go out.
  exit_across   two levels: the last rank exits where its share's sync across hosts starts.
  raise       rank 1 raises an uncaught error between two syncs.
  hang        rank 1 sleeps instead of its second sync (alive, silent).
  transport   rank 1 syncs over Horovod's collectives, the others over mpi4py (the ranks'
              agreement on the transport, at its first use, raises on every rank).
A rank that exits says farewell to its peers, so those waiting for it raise PeerLeftError
within a second; a silent rank ends the others' wait at the (short, in the test) stall
deadline. The test expects mpirun to exit non-zero with the tensor and the ranks named.
"""
import sys
import time

import torch
from torch import nn

import zen_hvd

mode = sys.argv[1]
transport = sys.argv[2] if len(sys.argv) > 2 else "mpi4py"
zen_hvd.init()
me, n = zen_hvd.rank(), zen_hvd.size()
grad = torch.sparse_coo_tensor(torch.tensor([[me, 5]]), torch.ones(2, 3), (10, 3))

if mode in ("exit", "raise", "hang"):
    zen_hvd.sparse_allreduce(grad, name="fault.first", transport=transport)
    if me == 1:
        if mode == "exit":
            sys.exit(1)
        if mode == "hang":
            time.sleep(200)
            sys.exit(0)
        raise RuntimeError("rank 1 fails between syncs")
    zen_hvd.sparse_allreduce(grad, name="fault.second", transport=transport)
    print(f"rank {me}: the second sync returned without rank 1", flush=True)
elif mode == "exit_in_pull":
    # Rank 1 sends its Push, then exits where its Pull would go out (its farewell still goes).
    zen_hvd.sparse_allreduce(grad, name="fault.first", transport=transport)
    if me == 1:
        from zen_hvd import runtime

        runtime.get_transport(transport)._pull_joined = lambda *a: sys.exit(1)
    zen_hvd.sparse_allreduce(grad, name="fault.pull", transport=transport)
    print(f"rank {me}: the sync returned without rank 1's Pull", flush=True)
elif mode == "exit_across":
    # Two levels (ZEN_HVD_RANKS_PER_HOST=2, ZEN_HVD_TWO_LEVEL=on, 4 ranks): the last rank
    # exits where its share's sync across hosts would start, after the header round and the
    # Push inside its host.
    zen_hvd.sparse_allreduce(grad, name="fault.first", transport=transport)
    if me == n - 1:
        from zen_hvd import runtime, two_level

        two_level.levels(runtime.get_transport(transport)).cross._push = lambda *a: sys.exit(1)
    zen_hvd.sparse_allreduce(grad, name="fault.across", transport=transport)
    print(f"rank {me}: the sync returned without rank {n - 1}", flush=True)
elif mode == "extra_step":
    torch.manual_seed(0)
    model = nn.Embedding(10, 3, sparse=True)
    opt = zen_hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), transport=transport)
    steps = 3 + (me == 1)
    for _ in range(steps):
        model(torch.tensor([me, 7])).sum().backward()
        opt.step()
        opt.zero_grad()
    print(f"rank {me}: finished {steps} steps", flush=True)
elif mode == "step_again":
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 1))
    opt = zen_hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), transport=transport)
    try:
        for step in range(4):
            model(torch.tensor([me, 7])).sum().backward()
            opt.step()
            if me == 1 and step == 1:
                opt.step()
            opt.zero_grad()
        print(f"rank {me}: finished the steps", flush=True)
    except zen_hvd.TensorMismatchError as e:
        print(f"rank {me} raised: {e}", flush=True)
elif mode == "transport":
    zen_hvd.sparse_allreduce(grad, name="fault.mixed", transport="horovod" if me == 1 else "mpi4py")
    print(f"rank {me}: a sync over mixed transports returned", flush=True)
else:
    raise SystemExit(f"unknown mode {mode!r}")
