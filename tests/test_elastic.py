"""Elastic Horovod (hvd.elastic.run) with zen_hvd.DistributedOptimizer: a worker joins, then
one exits mid-step, and training goes on to the same model as a float64 replay of the steps
with the ranks each step had (tests/mpi/elastic_case.py)."""
import stat

import pytest

from conftest import horovodrun_elastic


# A survivor may wait in a Zen sync on the other survivor, which has already gone to Horovod's
# reset; that wait ends at the stall shutdown time (the torch transport's gloo timeout, 600 s
# by default), with HorovodInternalError, and the reset goes on. A short one keeps it in time.
STALL = {"ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "60"}


@pytest.mark.parametrize("transport", ["torch", "horovod"])
def test_worker_joins_then_one_exits(tmp_path, transport):
    hosts = tmp_path / "hosts"
    # One host alone does not start horovodrun's elastic driver; the second starts empty.
    hosts.write_text("localhost:2\n127.0.0.1:0\n")
    discovery = tmp_path / "discover.sh"
    discovery.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discovery.chmod(discovery.stat().st_mode | stat.S_IXUSR)
    proc = horovodrun_elastic(2, 3, "elastic_case.py", hosts, discovery=str(discovery),
                              env={"ZEN_HVD_TRANSPORT": transport, **STALL}, timeout=400)
    assert "elastic: ok" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
