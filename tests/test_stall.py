"""The stall policy's waits (mpi/stall.py), on its own: a departed peer's last data may land
after its farewell, and a peer that really left ends the wait with PeerLeftError."""
import time

import pytest

from zen_hvd.mpi import stall

POLICY = stall.Policy(check=0.0, shutdown=30.0, poll=0.001)


def test_data_landing_after_a_farewell_ends_the_wait_normally():
    # A peer finished the collective and exited: its farewell is seen first, its last part
    # completes the request 0.2 s later (the race of a final allgather).
    seen = []

    def done():
        return bool(seen) and time.monotonic() - seen[0] > 0.2

    def gone():
        seen.append(time.monotonic())
        return "rank 2 left after 74 syncs (this rank is in sync 74)"

    stall.wait(done, POLICY, lambda: "tensor 't' (sync)", lambda: "rank 2", gone)
    assert seen   # the farewell was seen, and the wait still ended without an error


def test_a_peer_that_left_for_good_raises_peer_left():
    with pytest.raises(stall.PeerLeftError, match="tensor 't' \\(Push\\): rank 1 left after 1 syncs"):
        stall.wait(lambda: False, POLICY, lambda: "tensor 't' (Push)", lambda: "rank 1",
                   lambda: "rank 1 left after 1 syncs (this rank is in sync 2)")


def test_a_silent_peer_ends_the_wait_at_the_shutdown_deadline():
    policy = stall.Policy(check=0.0, shutdown=0.1, poll=0.001)
    with pytest.raises(stall.StallError, match="gave up after .* waiting for rank 3"):
        stall.wait(lambda: False, policy, lambda: "tensor 't' (Pull)", lambda: "rank 3", lambda: None)
