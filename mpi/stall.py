"""Deadlines on the transports' waits: a peer that died or fell out of step ends the job with
an error that names the tensor and the ranks that did not arrive, never a hang.

    ZEN_HVD_STALL_CHECK_TIME_SECONDS     warn once per wait after this long (default: Horovod's
                                         HOROVOD_STALL_CHECK_TIME_SECONDS, else 60; 0: never)
    ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS  give up after this long with StallError (default:
                                         HOROVOD_STALL_SHUTDOWN_TIME_SECONDS when it is set
                                         above 0, else 600; 0: wait forever)

A wait polls its requests and sleeps `poll` seconds between polls, so a waiting rank leaves the
cores to the ranks still computing. An uncaught error ends the MPI job (abort_on_uncaught,
installed by zen_hvd at its first use under an MPI launcher): the ranks still waiting are
ended by mpirun instead of waiting for their own deadline.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time

log = logging.getLogger("zen_hvd.stall")


class StallError(RuntimeError):
    """A wait of a sync passed the stall shutdown time."""


class PeerLeftError(StallError):
    """A wait of a sync is for a rank that has already left (its process ended)."""


class PeerLostError(StallError):
    """A connection to a peer failed during a sync (the peer died or exited)."""


POLL_VAR = "ZEN_HVD_POLL_SECONDS"   # a transport's sleep between polls while it waits
GONE_EVERY = 0.02   # seconds between checks for departed peers while a wait lasts
LAST_MESSAGES = 1.0  # seconds a wait still polls after a departure: what the peer sent may land


def _seconds(ours: str, horovods: str, default: float, positive_only: bool = False) -> float:
    if os.environ.get(ours):
        return float(os.environ[ours])
    theirs = os.environ.get(horovods)
    if theirs and (float(theirs) > 0 or not positive_only):
        return float(theirs)
    return default


@dataclasses.dataclass
class Policy:
    check: float
    shutdown: float
    poll: float

    @classmethod
    def from_env(cls, poll: float) -> "Policy":
        return cls(_seconds("ZEN_HVD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0),
                   _seconds("ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                            600.0, positive_only=True),
                   poll)


def transport_policy() -> Policy:
    """The policy of a transport's waits: ZEN_HVD_POLL_SECONDS (default 5e-5) between polls."""
    return Policy.from_env(float(os.environ.get(POLL_VAR, "0.00005")))


def wait(done, policy: Policy, what, missing, gone=None) -> None:
    """Poll done() until it returns True. After policy.check seconds log a warning, after
    policy.shutdown raise StallError; both name what() (the tensor and the step) and
    missing() (the ranks not arrived, or a phrase when a collective cannot tell); both are
    called only then, so a wait that ends in time formats nothing. gone(), checked every
    GONE_EVERY seconds, returns a phrase when a rank waited for has left: PeerLeftError, unless
    the wait ends within LAST_MESSAGES seconds (the peer's last data was still in flight)."""
    if done():
        return
    start, warned, next_gone = time.monotonic(), False, GONE_EVERY
    while True:
        time.sleep(policy.poll)
        if done():
            return
        elapsed = time.monotonic() - start
        if gone is not None and elapsed >= next_gone:
            next_gone = elapsed + GONE_EVERY
            left = gone()
            if left and not _ends_within(done, policy.poll, LAST_MESSAGES):
                raise PeerLeftError(f"zen_hvd: {what()}: {left}, so the wait can never end: a "
                                    "rank has died, or the ranks are out of step (one ran more "
                                    "steps or syncs than the others)")
        if policy.check > 0 and not warned and elapsed >= policy.check:
            warned = True
            log.warning("zen_hvd: %s: waited %.0f s for %s (a rank is slow, has died, or runs "
                        "other syncs)", what(), elapsed, missing())
        if policy.shutdown > 0 and elapsed >= policy.shutdown:
            raise StallError(
                f"zen_hvd: {what()}: gave up after {elapsed:.0f} s waiting for {missing()} "
                "(ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS): a rank has died, the ranks are out of "
                "step (one ran more steps or syncs than the others), or they use different "
                "transports (transport= and ZEN_HVD_TRANSPORT must agree on every rank)")


def _ends_within(done, poll: float, seconds: float) -> bool:
    """Whether done() turns True within `seconds`. A peer that finished the step and exited
    has sent all of it, but its farewell can overtake its last data: a collective's parts
    travel apart from point-to-point messages, and a send completes only once acknowledged."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(poll)
        if done():
            return True
    return False


def ranks_phrase(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


_installed = False


def abort_on_uncaught() -> None:
    """Make an uncaught exception end the whole MPI job (after printing it), as
    `python -m mpi4py` does: otherwise the failed rank waits in MPI_Finalize and the others
    in their next sync. ZEN_HVD_ABORT_ON_ERROR=0 leaves sys.excepthook alone."""
    global _installed
    if _installed or os.environ.get("ZEN_HVD_ABORT_ON_ERROR", "1") == "0":
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        if issubclass(kind, KeyboardInterrupt):
            return
        try:
            from mpi4py import MPI

            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)
        except Exception:  # noqa: BLE001  (no MPI to abort: exit as Python would)
            pass

    sys.excepthook = hook
