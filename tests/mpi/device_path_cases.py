"""The device data path in real multi-rank syncs: balanced parallelism (balanced.py on backend.Device)
and hierarchical centralization (zen_hvd/device_hierarchy.py).

    NUMBA_ENABLE_CUDASIM=1 mpirun -np N python tests/mpi/device_path_cases.py [--transport T] [--examples K]
    torchrun --nproc-per-node 2 tests/mpi/device_path_cases.py --device cuda   # a GPU (gpu_check.sh)

Off a GPU the device kernels run in Numba's CUDA simulator on CPU tensors
(ZEN_HVD_DATA_PATH=device), so sizes stay small. With --device cuda the inputs are CUDA
tensors and the kernels run on the GPU; the host path then works on host copies. Every case
syncs the same inputs under each scheme on the host path and on the device path and checks: the two results are bitwise equal, equal to a float64
sum of every rank's input, and identical on every rank; a rank on the host path and a rank on
the device path meet in one sync (the same wire format); bad input raises the same error on
every rank.
"""
import argparse
import os

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from common import digest, same_on_all_ranks

import zen_hvd
from zen_hvd import runtime
from zen_hvd.header import InvalidTensorError, TensorMismatchError

parser = argparse.ArgumentParser()
parser.add_argument("--transport", default=None)
parser.add_argument("--examples", type=int, default=12)
parser.add_argument("--device", default="cpu", help="where the inputs live: cpu (the simulator) or cuda")
args = parser.parse_args()
DEV = torch.device(args.device)

zen_hvd.init()
n, me = zen_hvd.size(), zen_hvd.rank()
tr = runtime.get_transport(args.transport)
count = iter(range(10 ** 6))
# ZEN_HVD_DEVICE_BUFFERS=1 (or a GPU with NCCL, CUDA-aware MPI or Horovod's GPU operations):
# the transport moves the device path's buffers as tensors (_push_device, _pull_joined_device),
# not staged through numpy. Counted, so that a route not taken fails the run.
ROUTE = n > 1 and tr.moves_device_memory(DEV)
routed = {"_push_device": 0, "_pull_joined_device": 0, "_swap_device": 0}
if ROUTE:
    def counted(method):
        clean = getattr(tr, method)

        def call(*a):
            routed[method] += 1
            return clean(*a)
        return call

    for method in routed:
        setattr(tr, method, counted(method))
SIZED = ROUTE and tr.sizes_first   # sizes first, then the data (NCCL's protocol)
SCHEMES = ("balanced", "hierarchical")   # the schemes with a device path


def sync(t, path, scheme="balanced", **kw):
    os.environ["ZEN_HVD_DATA_PATH"] = path
    try:
        return zen_hvd.sparse_allreduce(t, name=f"case{next(count)}", scheme=scheme,
                                        transport=args.transport, **kw)
    finally:
        del os.environ["ZEN_HVD_DATA_PATH"]


def inputs(seed, M, D, density, dtype, sparse, duplicates):
    """Every rank's [M, D] input (each rank builds them all from the seed): row-sparse,
    uncoalesced when `duplicates`, or dense (sparse None); and their float64 sum."""
    rng = np.random.default_rng(seed)
    ts = []
    for r in range(n):
        units = np.sort(rng.choice(M, int(rng.binomial(M, density)), replace=False)).astype(np.int64)
        if duplicates and units.size:
            units = np.concatenate([units, rng.choice(units, units.size // 2 + 1)])
        vals = rng.integers(-50, 50, (units.size, D)) if not dtype.is_floating_point else \
            rng.standard_normal((units.size, D))
        t = torch.sparse_coo_tensor(torch.from_numpy(units).reshape(1, -1),
                                    torch.from_numpy(vals).to(dtype), (M, D))
        ts.append((t if sparse else t.to_dense()).to(DEV))
    ref = sum(t.to_dense().double() for t in ts)
    return ts, ref


def check(seed, M, D, density, dtype, sparse, duplicates, op, prescale):
    ts, ref = inputs(seed, M, D, density, dtype, sparse, duplicates)
    for scheme in SCHEMES:
        check_one(ts, ref, scheme, seed, M, D, density, dtype, sparse, duplicates, op, prescale)


def check_one(ts, ref, scheme, seed, M, D, density, dtype, sparse, duplicates, op, prescale):
    kw = dict(op=op, prescale_factor=prescale, scheme=scheme)
    host, device = sync(ts[me], "host", **kw), sync(ts[me], "device", **kw)
    where = f"{scheme}: seed={seed} M={M} D={D} density={density} {dtype} sparse={sparse} op={op}"
    assert host.is_sparse == device.is_sparse == bool(sparse), where
    if sparse:
        assert torch.equal(host._indices(), device._indices()), f"{where}: other units"
        h, d = host._values(), device._values()
    else:
        h, d = host, device
    # An uncoalesced input's duplicates are summed by torch's coalesce on the device and in
    # input order on the host: the same sum, possibly rounded differently.
    same = torch.equal(h, d) if not duplicates else torch.allclose(h.double(), d.double(), atol=1e-5)
    assert h.dtype == d.dtype == dtype and same, f"{where}: host and device differ"
    want = ref * prescale / (n if op == zen_hvd.Average else 1)
    if not dtype.is_floating_point and op == zen_hvd.Average:
        want = torch.trunc(ref * prescale / n)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)
    assert torch.allclose(device.to_dense().double().cpu(), want, **tol), f"{where}: wrong sum"
    assert device.device.type == DEV.type and same_on_all_ranks(tr, digest(device.cpu())), f"{where}: ranks differ"


# Fixed cases: the bitmap and positions Pull formats, the sorted aggregate (a table far larger
# than its non-zeros), duplicates, dense tables, integers averaged, half precision.
fixed = [
    (1, 500, 4, 0.3, torch.float32, "row", False, zen_hvd.Average, 1.0),
    (2, 5000, 2, 0.02, torch.float32, "row", True, zen_hvd.Sum, 1.0),
    (3, 10 ** 6, 3, 1e-5, torch.float64, "row", False, zen_hvd.Sum, 0.5),
    (4, 200, 3, 0.5, torch.float32, None, False, zen_hvd.Average, 1.0),
    (5, 300, 2, 0.4, torch.int64, "row", False, zen_hvd.Average, 1.0),
    (6, 400, 1, 0.1, torch.float16, "row", False, zen_hvd.Sum, 1.0),
    (7, 64, 2, 0.0, torch.float32, "row", False, zen_hvd.Sum, 1.0),
    (8, 64, 2, 1.0, torch.float32, "row", False, zen_hvd.Average, 2.0),
]
for case in fixed:
    check(*case)


@settings(max_examples=args.examples, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2 ** 31), M=st.integers(1, 2000), D=st.sampled_from([1, 3, 8]),
       density=st.floats(0, 1), dtype=st.sampled_from([torch.float32, torch.float64, torch.int32]),
       sparse=st.sampled_from(["row", None]), duplicates=st.booleans(),
       op=st.sampled_from([zen_hvd.Average, zen_hvd.Sum]))
def test_random(seed, M, D, density, dtype, sparse, duplicates, op):
    check(seed, M, D, density, dtype, sparse, duplicates and sparse is not None, op, 1.0)


test_random()

if ROUTE:
    assert all(routed.values()), routed   # Push, Pull, and the hierarchy's steps

# One rank on the host path, the others on the device path: one wire format, one result.
if not SIZED:
    ts, ref = inputs(11, 700, 3, 0.2, torch.float32, "row", False)
    for scheme in SCHEMES:
        mixed = sync(ts[me], "host" if me == 0 else "device", scheme, op=zen_hvd.Sum)
        assert torch.allclose(mixed.to_dense().double().cpu(), ref, atol=1e-5), scheme
        assert same_on_all_ranks(tr, digest(mixed.cpu())), scheme

# auto keeps a tensor on its device: a dense table, for which the host path's auto picks a
# scheme without a device path (a baseline), picks among the schemes with one.
ts, ref = inputs(13, 400, 2, 1.0, torch.float32, "row", False)
for path in ("host", "device"):
    os.environ["ZEN_HVD_DATA_PATH"] = path
    for _ in range(3):   # auto decides after its first check calls
        got = zen_hvd.sparse_allreduce(ts[me], name=f"auto_{path}", op=zen_hvd.Sum, transport=args.transport)
    del os.environ["ZEN_HVD_DATA_PATH"]
    assert torch.allclose(got.to_dense().double().cpu(), ref, atol=1e-5), path
    picked = zen_hvd.sync.last_sync["scheme"]
    assert (picked not in SCHEMES) == (path == "host"), (path, picked)

# Under the sized protocol (NCCL's) the header round names ranks on different kinds of
# device before the hierarchy starts, on every rank.
if SIZED:
    t = torch.sparse_coo_tensor(torch.tensor([[1, 2]]), torch.ones(2, 2), (100, 2)).to(DEV)
    try:
        sync(t, "host" if me == 0 else "device", "hierarchical")
        raise AssertionError("hierarchical: ranks on host and device paths were not caught")
    except TensorMismatchError as e:
        assert "different kinds of device" in str(e) and "rank 0: host, rank 1: GPU" in str(e), e

# A corrupt Push message (rank 1 sends rank 0 eight bytes more than its header says): on
# either path every rank raises, naming the tensor and the server that saw it.
if n > 1:
    def corrupted(clean):
        def push(send, counts, control=0):
            counts = [int(c) for c in counts]
            join = np.concatenate if isinstance(send, np.ndarray) else torch.cat
            longer = join([send[:counts[0]], send[:8], send[counts[0]:]])
            return clean(longer, [counts[0] + 8] + counts[1:], control)
        return push

    for path in ("host", "device"):
        clean = tr.push
        tr.push = corrupted(clean) if me == 1 else clean
        try:
            sync(torch.sparse_coo_tensor(torch.tensor([[1, 2]]), torch.ones(2, 2), (100, 2)).to(DEV), path)
            raise AssertionError(f"{path}: a corrupt Push message was not caught")
        except InvalidTensorError as e:
            assert "servers [0]" in str(e) and "does not match its header" in str(e), e
        finally:
            tr.push = clean

# A Push message of the right size whose positions lie outside the server's range (rank 1
# rewrites the first position it sends the first server it sends any to, which depends on the
# drawn seed): on either path every rank raises instead of a kernel indexing with it (out of
# bounds on the host; on a GPU an illegal address would end the CUDA context).
if n > 1:
    def out_of_range(clean, hit):
        def push(send, counts, control=0):
            send = send.copy() if isinstance(send, np.ndarray) else send.clone()
            server = next(r for r, c in enumerate(counts) if int(c) > control)
            hit.append(server)
            start = int(sum(int(c) for c in counts[:server])) + control
            first = send[start:start + 4]
            (first.view(np.int32) if isinstance(first, np.ndarray) else first.view(torch.int32))[:] = 2 ** 31 - 1
            return clean(send, counts, control)
        return push

    for path in ("host", "device"):
        clean, hit = tr.push, []
        tr.push = out_of_range(clean, hit) if me == 1 else clean
        try:
            sync(torch.sparse_coo_tensor(torch.tensor([[1, 2, 3, 5, 8, 13]]), torch.ones(6, 2), (100, 2)).to(DEV),
                 path)
            raise AssertionError(f"{path}: positions out of range were not caught")
        except InvalidTensorError as e:
            server = tr.broadcast_int(hit[0] if hit else -1, root=1)
            assert f"servers [{server}]" in str(e) and "does not match its header" in str(e), e
        finally:
            tr.push = clean

# Bad input: every rank raises the same error, naming the tensor, and the next sync works.
bad = torch.sparse_coo_tensor(torch.tensor([[1, 500 if me == n - 1 else 2]]), torch.ones(2, 2), (100, 2)).to(DEV)
os.environ["ZEN_HVD_DATA_PATH"] = "device"
for scheme in SCHEMES:
    try:
        zen_hvd.sparse_allreduce(bad, name="out_of_range", scheme=scheme, transport=args.transport)
        raise AssertionError(f"{scheme}: an index out of range was not caught")
    except InvalidTensorError as e:
        assert "out_of_range" in str(e) and "500" in str(e), e
    try:
        t = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1, 2, dtype=torch.float64 if me else torch.float32),
                                    (100, 2)).to(DEV)
        zen_hvd.sparse_allreduce(t, name="dtypes", scheme=scheme, transport=args.transport)
        raise AssertionError(f"{scheme}: a dtype mismatch was not caught")
    except TensorMismatchError as e:
        assert "dtypes" in str(e), e
del os.environ["ZEN_HVD_DATA_PATH"]
check(12, 300, 2, 0.3, torch.float32, "row", False, zen_hvd.Sum, 1.0)

# Ranks on different kinds of device under the sized protocol (NCCL's): a size message meets
# a data message, and every rank raises instead of waiting for the other's next message.
# Last: the round that raised leaves its peers' messages unread.
if SIZED:
    t = torch.sparse_coo_tensor(torch.tensor([[1, 2]]), torch.ones(2, 2), (100, 2)).to(DEV)
    try:
        sync(t, "host" if me == 0 else "device")
        raise AssertionError("ranks on host and device paths were not caught")
    except ValueError as e:
        assert "same kind of device" in str(e), e
    if me == 0:
        print("device_path_cases: mixed devices raised on every rank")

if me == 0:
    route = "device buffers moved as tensors" if ROUTE else "device buffers staged through host memory"
    print(f"device_path_cases: all cases passed ({len(fixed)} fixed, {args.examples} random, "
          f"{n} ranks, {tr.name} transport, {route})")
