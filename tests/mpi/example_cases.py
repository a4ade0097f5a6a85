"""The examples on real ranks: each one's --small model, made tinier still, trained with
--sync zen and with --sync horovod-dense from the same seed, ends with the same parameters
(float tolerance), and those parameters moved from their initial values. gpt trains with DGC:
the same selections summed by balanced parallelism (auto) and by AGsparse end alike too.
With --ddp (under torchrun, no Horovod), the same on PyTorch DDP: Zen's comm hook (--sync zen)
against DDP's own reduction (--sync ddp: gloo's sparse allgather), and gpt's DGC through the
hook by auto and by AGsparse.

    mpirun -np 2 python tests/mpi/example_cases.py [lstm_lm deepfm nmt gpt]
    torchrun --nproc-per-node 2 tests/mpi/example_cases.py --ddp [lstm_lm deepfm nmt gpt]
"""
import importlib.util
import os
import sys

import torch

import zen_hvd

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
TINY = {"lstm_lm": ["--vocab", "2000", "--embed", "16", "--hidden", "16", "--batch", "4",
                    "--seq-len", "6", "--negatives", "64"],
        "deepfm": ["--rows", "5000", "--mlp", "16", "--batch", "32"],
        "nmt": ["--vocab", "2000", "--embed", "16", "--hidden", "16", "--batch", "4",
                "--seq-len", "5", "--negatives", "64"],
        "gpt": ["--vocab", "500", "--width", "16", "--layers", "1", "--heads", "2", "--batch", "2",
                "--seq-len", "8"]}
# Pairs of runs that must end alike: (label, first, second); gpt's default --dgc is 0.05.
PAIRS = {"gpt": [("zen and horovod-dense", ["--sync", "zen", "--dgc", "0"], ["--sync", "horovod-dense"]),
                 ("DGC through auto and through agsparse", ["--sync", "zen"],
                  ["--sync", "zen", "--scheme", "agsparse"])]}
DDP_PAIRS = {"gpt": [("DDP's zen hook and DDP's own reduction", ["--sync", "zen", "--dgc", "0"], ["--sync", "ddp"]),
                     ("DDP's DGC hook through auto and through agsparse", ["--sync", "zen"],
                      ["--sync", "zen", "--scheme", "agsparse"])]}
STEPS = ["--steps", "3", "--warmup", "1"]
DDP = "--ddp" in sys.argv


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parameters(example, argv):
    model = example.train(example.parse_args(argv))["model"]
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def check(name):
    example = load(name)
    base = ["--small", "--no-progress", "--seed", "0", *TINY[name]] + (["--ddp"] if DDP else [])
    initial = parameters(example, base + ["--steps", "0", "--warmup", "0"])
    pairs = DDP_PAIRS.get(name, [("DDP's zen hook and DDP's own reduction", ["--sync", "zen"], ["--sync", "ddp"])]) \
        if DDP else PAIRS.get(name, [("zen and horovod-dense", ["--sync", "zen"], ["--sync", "horovod-dense"])])
    for label, first, second in pairs:
        same(name, label, initial, parameters(example, base + STEPS + first),
             parameters(example, base + STEPS + second))


def same(name, label, initial, zen, dense):
    assert zen.keys() == dense.keys() == initial.keys()
    for key in zen:
        assert torch.isfinite(zen[key]).all(), f"{name}: {key} is not finite"
        assert torch.allclose(zen[key], dense[key], rtol=1e-4, atol=1e-6), (
            f"{name}: {key} differs by {(zen[key] - dense[key]).abs().max().item():.3g}")
        assert not torch.equal(zen[key], initial[key]), f"{name}: {key} did not move"
    diff = max((zen[k] - dense[k]).abs().max().item() for k in zen)
    moved = min((zen[k] - initial[k]).abs().max().item() for k in zen)
    if zen_hvd.rank() == 0:
        print(f"{name}: {label} end with the same {len(zen)} parameters (largest difference "
              f"{diff:.2g}; every parameter moved, the least by {moved:.2g})", flush=True)


for example_name in [a for a in sys.argv[1:] if a != "--ddp"] or TINY:
    check(example_name)
assert not DDP or "horovod" not in sys.modules, "Horovod was imported under --ddp"
if zen_hvd.rank() == 0:
    print("example_cases: all passed" + (" (DDP)" if DDP else ""), flush=True)
