"""zen_hvd: Zen's communication-optimal sparse gradient synchronization for Horovod and PyTorch DDP.

`cuda_kernels/` and `mpi/` live at the top of the repository but install inside the zen_hvd
namespace (zen_hvd.cuda_kernels, zen_hvd.mpi), so nothing named `mpi` lands in site-packages.
Pins for a reproducible machine live in scripts/setup.sh; here we only declare ranges. Horovod
is optional (extra "horovod"): torchrun and DDP users need only torch.
"""
from setuptools import setup

setup(
    name="zen_hvd",
    version="0.1.0",
    description="Zen balanced-parallelism sparse allreduce for Horovod and PyTorch DDP",
    python_requires=">=3.9",
    packages=["zen_hvd", "zen_hvd.bench", "zen_hvd.cuda_kernels", "zen_hvd.mpi"],
    package_dir={
        "zen_hvd": "zen_hvd",
        "zen_hvd.cuda_kernels": "cuda_kernels",
        "zen_hvd.mpi": "mpi",
    },
    install_requires=[
        "torch>=2.1",
        "numba>=0.58",
        "numpy",
    ],
    extras_require={
        "horovod": ["horovod>=0.28"],
        "mpi": ["mpi4py>=3.1"],
        "cuda": ["numba-cuda"],
        "test": ["pytest", "hypothesis", "mmh3"],
        "bench": ["matplotlib", "tqdm"],
    },
)
