"""The commands that start ranks on this machine: mpirun, torchrun, or one rank per network
namespace joined by tc-limited links (scripts/netns_cluster.sh). Shared by the benchmarks, the
soak run and the examples' runner."""
from __future__ import annotations

import os
import sys

_NETNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "netns_cluster.sh")


def mpirun_command(ranks: int) -> list:
    """mpirun for `ranks` local ranks, as every benchmark launches them:
      - each rank bound to one core, ranks wrapping over the cores when there are more ranks
        (unbound, the scheduler can keep three ranks on one core and one on the other for
        seconds, and step times flip between two modes);
      - Open MPI yielding the core while it waits (its busy polling takes the cores from the
        ranks still computing; scripts/netns_cluster.sh passes the same)."""
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "core:overload-allowed",
           "--map-by", "core", "--mca", "mpi_yield_when_idle", "1"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def launch_command(ranks: int, emulate: "str | None", command: list, per_host: int = 1) -> list:
    """`command` on `ranks` ranks: local ranks under mpirun_command, or with `emulate` (a link
    rate such as 1gbit) `per_host` ranks per network namespace (sharing memory), the
    namespaces joined by tc-limited links (scripts/netns_cluster.sh run, which needs root)."""
    if not emulate:
        return mpirun_command(ranks) + list(command)
    script = _NETNS
    hosts = f"{ranks // per_host}x{per_host}" if per_host > 1 else str(ranks)
    return ["bash", os.path.abspath(script), "run", hosts, emulate, "--", *command]


def torchrun_command(ranks: int, emulate: "str | None", python_args: list) -> list:
    """`python_args` (a script and its arguments, or -m MODULE ...) under torchrun: `ranks`
    local processes, or with `emulate` (a link rate such as 1gbit) one torchrun agent and
    process per network namespace joined by tc-limited links (scripts/netns_cluster.sh
    torchrun, which needs root)."""
    if not emulate:
        from .mpi.torch_transport import free_port

        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                "--master-port", str(free_port()), *python_args]
    script = _NETNS
    return ["bash", os.path.abspath(script), "torchrun", str(ranks), emulate, "--", sys.executable, *python_args]
