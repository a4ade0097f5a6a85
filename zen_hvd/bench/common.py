"""Shared benchmark plumbing: launching under mpirun or torchrun, timing syncs, gathering per-rank
rows."""
from __future__ import annotations

import os
import shlex
import statistics
import sys
import time

from .. import runtime
from ..launch import launch_command, mpirun_command, torchrun_command  # noqa: F401
from ..stats import write_csv  # noqa: F401


def add_embedding_args(ap, repeats: int, rate: str) -> None:
    """The options of a benchmark that syncs one Zipf embedding gradient (vs_horovod, vs_ddp):
    ranks, link emulation (`rate`: an example), repeats, the table and its gradient, the CSV."""
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--emulate", default=None, help=f"link rate such as {rate}: namespaces + tc")
    ap.add_argument("--repeats", type=int, default=repeats)
    add_gradient_args(ap)
    ap.add_argument("--out", default=None, help="CSV file of the table printed")


def add_gradient_args(ap) -> None:
    """The embedding gradient's options: the table, and the Zipf tokens each rank looks up."""
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--seed", type=int, default=0)


class Progress:
    """A line per stage of a long benchmark, with the time left estimated from the stages so
    far: `[3/28] deepfm: AGsparse, about 140 s left`. Silent when not `active` (other ranks)."""

    def __init__(self, total: int, active: bool = True):
        self.total, self.active, self.done = total, active, 0
        self.t0 = time.perf_counter()

    def stage(self, text: str) -> None:
        elapsed = time.perf_counter() - self.t0
        left = f", about {elapsed / self.done * (self.total - self.done):.0f} s left" if self.done else ""
        self.done += 1
        if self.active:
            print(f"[{self.done}/{self.total}] {text}{left}", flush=True)


def under_launcher() -> bool:
    """True in a rank of an mpirun or horovodrun job: a benchmark then runs in it, not launching."""
    return runtime.launched_by_mpi() or "HOROVOD_RANK" in os.environ


def ensure_launched(ranks: int, module: str) -> None:
    """If started without a launcher, re-run this module under mpirun (mpirun_command)."""
    if under_launcher() or ranks <= 0:
        return
    cmd = mpirun_command(ranks) + [sys.executable, "-m", module, *sys.argv[1:]]
    print("+", shlex.join(cmd), flush=True)
    os.execvp(cmd[0], cmd)


SHARERS_VAR = "ZEN_HVD_RANKS_SHARING_CORES"


def share_cores() -> None:
    """Give each rank its share of the machine's cores: several ranks on one machine, each with
    torch's default thread pool, oversubscribe the cores and time the spinning, not the sync.
    The ranks sharing the cores are the runtime's local ranks (Horovod's, or torchrun's), or
    ZEN_HVD_RANKS_SHARING_CORES where the runtime cannot tell: the emulated cluster's hosts
    (scripts/netns_cluster.sh) are one rank each to the runtime but share one machine (with 2
    threads per rank there, 4 ranks on 2 cores ran deepfm 10x slower)."""
    import torch

    sharers = int(os.environ.get(SHARERS_VAR) or runtime.local_size())
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, sharers)))


def barrier() -> None:
    """All ranks meet (Horovod's barrier where Horovod runs, else torch.distributed's)."""
    hvd = runtime.horovod()
    if hvd is not None:
        hvd.barrier()
    else:
        import torch.distributed as dist

        dist.barrier()


def time_calls(fn, repeats: int, warmup: int = 2):
    """Median wall time of fn() over `repeats` calls, each started together on all ranks, and
    the data bytes this rank received per call through zen_hvd transports."""
    for _ in range(warmup):
        fn()
    runtime.reset_comm_stats()
    times = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    stats = runtime.comm_stats()
    return statistics.median(times), stats["bytes_received"] / repeats, stats


def gather(values) -> "list[list[float]]":
    """Every rank's row of numbers (float64), on every rank."""
    import torch

    row = torch.tensor([list(map(float, values))], dtype=torch.float64)
    hvd = runtime.horovod()
    if runtime.size() == 1:
        return row.numpy().tolist()
    if hvd is not None:
        return hvd.allgather(row).numpy().tolist()
    import torch.distributed as dist

    rows = [torch.empty_like(row) for _ in range(runtime.size())]
    dist.all_gather(rows, row)
    return torch.cat(rows).numpy().tolist()


def reproduce(module: str) -> str:
    """The line that reruns this benchmark as it was started, first in every summary."""
    args = [a for a in sys.argv[1:] if a != "--child"]
    return f"reproduce: python -m {module} {shlex.join(args)}".rstrip()


def human_bytes(x: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:.1f} {unit}" if unit != "B" else f"{x:.0f} B"
        x /= 1024


def rate_bps(text: str) -> float:
    """A link rate as tc writes it (250mbit, 1gbit) in bits per second."""
    text = text.lower().rstrip("bit/s").rstrip("bps")
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(text[-1:], 1)
    return float(text[:-1] if text[-1:] in "kmg" else text) * scale
