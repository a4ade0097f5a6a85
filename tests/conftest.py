"""Shared test helpers: launching multi-rank scripts under mpirun or horovodrun."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def mpirun(np_, script, *args, env=None, timeout=600, check=True):
    """Run tests/mpi/<script> on np_ local ranks under mpirun; return the completed process
    (check: raise unless it exited 0)."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed (run scripts/setup.sh)")
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    # Local ranks inherit mpirun's environment, so `env` reaches them without -x.
    cmd += [sys.executable, os.path.join(HERE, "mpi", script), *map(str, args)]
    return _run(cmd, dict(os.environ, **(env or {})), timeout, check)


NO_HOROVOD = {"PYTHONPATH": os.path.join(HERE, "no_horovod")}   # Horovod and mmh3 unimportable


def torchrun(np_, script, *args, env=None, timeout=600, check=True):
    """Run tests/mpi/<script> on np_ local processes under torchrun (torch.distributed's
    launcher; no Horovod, no MPI)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(np_),
           "--master-port", str(_free_port()), os.path.join(HERE, "mpi", script), *map(str, args)]
    env = {"OMP_NUM_THREADS": "1", **(env or {})}
    return _run(cmd, dict(os.environ, **env), timeout, check)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def horovodrun_gloo(np_, script, *args, env=None, timeout=600):
    """Run tests/mpi/<script> under `horovodrun --gloo` (no MPI job)."""
    exe = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(exe):
        pytest.skip("horovodrun is not installed (run scripts/setup.sh)")
    cmd = [exe, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
           sys.executable, os.path.join(HERE, "mpi", script), *map(str, args)]
    # Horovod's gloo collectives give up after 30 s by default; 4 ranks on 2 shared cores
    # can leave one rank that far behind (the job ends with "Application timeout caused pair
    # closure"), so the tests allow more, as a slow cluster would set it.
    env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "180", **(env or {})}
    return _run(cmd, dict(os.environ, **env), timeout)


def horovodrun_elastic(np_, max_np, script, *args, discovery, env=None, timeout=600):
    """Run tests/mpi/<script> under elastic `horovodrun` (gloo) with the host discovery script
    `discovery`, starting np_ workers, at least np_ and at most max_np."""
    exe = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(exe):
        pytest.skip("horovodrun is not installed (run scripts/setup.sh)")
    cmd = [exe, "-np", str(np_), "--min-np", str(np_), "--max-np", str(max_np),
           "--host-discovery-script", discovery,
           sys.executable, os.path.join(HERE, "mpi", script), *map(str, args)]
    # The driver ranks hosts it discovers together in a set's order: a fixed hash seed keeps
    # that order, so the first host's workers keep ranks 0.. when a host joins.
    env = {"PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", **(env or {})}
    return _run(cmd, dict(os.environ, **env), timeout)


def _run(cmd, env, timeout, check=True):
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return proc
