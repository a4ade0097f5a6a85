"""Multi-rank cases for DGC (zen_hvd.Compression.dgc) in zen_hvd.DistributedOptimizer.

    mpirun -np N python tests/mpi/dgc_cases.py

After every step each compressed gradient must equal a dense Horovod allreduce (Average) of
what the ranks' DGC selected, on every rank bitwise alike; DGC through balanced parallelism
and through AGsparse must train the same way; bad settings raise on every rank. Exits
non-zero on every rank at the first failure.
"""
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as horovod
import zen_hvd as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
V, D, H, C = 50, 6, 24, 5
passed = []


class Net(nn.Module):
    """An embedding (by rows through Zen), two compressed matrices, dense biases."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D, sparse=True)
        self.fc1 = nn.Linear(2 * D, H)
        self.fc2 = nn.Linear(H, C)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.emb(x).flatten(1))))


def loss_at(model, step):
    g = torch.Generator().manual_seed(100 * step + me)
    x = torch.randint(0, V, (8, 2), generator=g)
    return F.cross_entropy(model(x), torch.randint(0, C, (8,), generator=g))


def fresh_model():
    torch.manual_seed(7)
    model = Net()
    horovod.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def same_on_all_ranks(tensors):
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    every = horovod.allgather(flat.unsqueeze(0), name="dgc_cases.same")
    return bool((every == every[0]).all())


def case(fn):
    fn()
    passed.append(fn.__name__)
    return fn


@case
def sums_what_was_selected():
    """The compressed gradients are the average of the ranks' selections (dense reference);
    the embedding goes by rows, the biases by Horovod's allreduce."""
    model = fresh_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.dgc(ratio=0.1))
    [bucket] = opt.dgc_buckets
    assert [p for p in bucket.params] == [model.fc2.weight, model.fc1.weight], "bucket order"
    assert opt.zen_parameter_names == ["emb.weight"]
    for step in range(6):
        opt.zero_grad()
        loss_at(model, step).backward()
        opt.synchronize()
        sent = bucket.last_sent.to_dense()
        k = sum(math.ceil(0.1 * p.numel()) for p in bucket.params)   # each parameter its top 10%
        assert 0 < bucket.last_sent._nnz() <= k, (bucket.last_sent._nnz(), k)
        reference = horovod.allreduce(sent, op=horovod.Average, name=f"dgc_cases.ref.{step}")
        got = torch.cat([p.grad.reshape(-1) for p in bucket.params])
        assert torch.allclose(got, reference, rtol=1e-6, atol=1e-7), (got - reference).abs().max()
        assert same_on_all_ranks([p.grad for p in bucket.params]), "gradients differ across ranks"
        with opt.skip_synchronize():
            opt.step()
    assert same_on_all_ranks(list(model.parameters())), "parameters differ across ranks"


@case
def balanced_and_agsparse_train_alike():
    """The same DGC selections summed by another scheme (and another transport): the same
    losses and parameters."""
    runs = {}
    for scheme, transport in (("balanced", None), ("agsparse", "horovod")):
        model = fresh_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                       named_parameters=model.named_parameters(), scheme=scheme,
                                       transport=transport,
                                       compression=hvd.Compression.dgc(ratio=0.05, warmup_steps=2))
        losses = []
        for step in range(8):
            opt.zero_grad()
            loss = loss_at(model, step)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs[scheme] = (losses, [p.detach().clone() for p in model.parameters()])
    (la, pa), (lb, pb) = runs.values()
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(la, lb)), (la, lb)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(pa, pb))
    assert la[0] != la[-1]


@case
def warmup_sends_more_at_first():
    model = fresh_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.dgc(ratio=0.01, warmup_steps=1))
    [bucket] = opt.dgc_buckets
    counts = []
    for step in range(5):
        opt.zero_grad()
        loss_at(model, step).backward()
        opt.step()
        counts.append(bucket.last_sent._nnz())
    limits = [sum(math.ceil(d * p.numel()) for p in bucket.params) for d in (0.25, 0.0625, 0.015625, 0.01, 0.01)]
    assert all(c <= lim for c, lim in zip(counts, limits)) and counts[0] > limits[1], (counts, limits)


def expect_value_error(text, make):
    try:
        make()
    except ValueError as e:
        assert text in str(e), str(e)
        return
    raise AssertionError(f"no ValueError ({text})")


@case
def bad_settings_raise_on_every_rank():
    model = fresh_model()
    dgc = hvd.Compression.dgc()
    expect_value_error("sparse_as_dense=True", lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=dgc, sparse_as_dense=True))
    expect_value_error("op=Adasum", lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=dgc, op=hvd.Adasum))
    expect_value_error("momentum=0.9 on top", lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), compression=dgc))
    # momentum=0 keeps the optimizer's momentum: accepted
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                             named_parameters=model.named_parameters(),
                             compression=hvd.Compression.dgc(momentum=0))


def dgc_run(model, opt, steps):
    for step in steps:
        opt.zero_grad()
        loss_at(model, step).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def dgc_optimizer(model):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                    named_parameters=model.named_parameters(),
                                    compression=hvd.Compression.dgc(ratio=0.05, warmup_steps=2))


@case
def state_dict_resumes_exactly():
    """Each rank's own state_dict (residuals, step count) resumes training bitwise; without
    DGC's state (a warning says so) the same steps give other parameters; rank 0's loaded everywhere restores the step
    count and starts the other ranks' residuals from zero, with a warning."""
    model = fresh_model()
    opt = dgc_optimizer(model)
    dgc_run(model, opt, range(3))
    saved, weights = copy.deepcopy(opt.state_dict()), copy.deepcopy(model.state_dict())
    assert saved["zen_dgc"]["rank"] == me and saved["zen_dgc"]["buckets"], saved.keys()
    expected = dgc_run(model, opt, range(3, 6))

    def resumed(state):
        again = fresh_model()
        again.load_state_dict(weights)
        o = dgc_optimizer(again)
        o.load_state_dict(state)
        return dgc_run(again, o, range(3, 6)), o

    got, _ = resumed(copy.deepcopy(saved))
    assert all(torch.equal(a, b) for a, b in zip(got, expected)), "resumed training differs"
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh, _ = resumed({k: v for k, v in copy.deepcopy(saved).items() if k != "zen_dgc"})
    assert not all(torch.equal(a, b) for a, b in zip(fresh, expected)), "the DGC state made no difference"
    assert any("no DGC state" in str(w.message) for w in caught), [str(w.message) for w in caught]

    rank0 = horovod.broadcast_object(saved, root_rank=0, name="dgc_cases.state")
    again = fresh_model()
    o = dgc_optimizer(again)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o.load_state_dict(rank0)
    [bucket] = o.dgc_buckets
    assert bucket.steps == 3
    if me == 0:
        assert not caught and torch.equal(bucket.memory.v, saved["zen_dgc"]["buckets"][bucket.name]["v"])
    else:
        assert any("residuals start from zero" in str(w.message) for w in caught)
        assert not bucket.memory.v.any() and not bucket.memory.u.any()
    wrong = copy.deepcopy(saved)
    wrong["zen_dgc"]["buckets"] = {"dgc.other+0": next(iter(wrong["zen_dgc"]["buckets"].values()))}
    lr = o.param_groups[0]["lr"]
    wrong["param_groups"][0]["lr"] = lr * 2
    expect_value_error("are not this optimizer's", lambda: o.load_state_dict(wrong))
    assert o.param_groups[0]["lr"] == lr, "a refused state_dict was partly loaded"


horovod.barrier()
if me == 0:
    print(f"all DGC cases passed ({len(passed)} cases, {n} ranks: {', '.join(passed)})")
