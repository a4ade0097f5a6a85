"""The optimizer's Zen syncs of every step, in a fixed order, on one background thread.

A Zen sync is a collective that every rank must issue in the same order. One worker thread,
started once for the optimizer's lifetime, walks every step's items in a fixed order (the order
backward usually produces them), waiting for each item's gradients (its parameters' backward
hooks); so the sync of a gradient overlaps the rest of backward. An item is anything with

    name, params, num_units   the tensor's name, its parameters, its units (for the profile);
    sync(size, **kw)          its gradients through Zen -> (what write_back takes, info);
    write_back(out)           the synchronized gradient into its parameters' .grad;
    step_done()               after each step;

a Zen parameter (discovery.ZenParam, by rows) or a DGC bucket (dgc.Bucket, by elements).
Errors raised in the thread (the same on every rank: the header check in sync.py) are re-raised
by finish().
"""
from __future__ import annotations

import atexit
import hashlib
import queue
import threading
import time
import weakref

from . import ops, runtime
from .header import TensorMismatchError


class Round:
    """One step's Zen syncs: a ready event per item (Zen parameter or DGC bucket), the
    parameters whose gradients arrived, whether the gradient is fresh (a backward pass, any
    parameter's hook, or zero_grad() reached the optimizer), the results, the first error."""

    def __init__(self, order, step):
        self.step, self.fresh = step, False
        self.ready = {zp: threading.Event() for zp in order}
        self.arrived = set()   # the parameters whose gradients have arrived
        self.touched = set()
        self.results, self.error = {}, None
        self.started, self.done = False, threading.Event()


def _stop_thread(rounds, thread):
    rounds.put(None)
    thread.join(timeout=10)


class Worker:
    """The Zen syncs of every step, in a fixed order, on one background thread that lives as
    long as the optimizer (each step's round is handed to it through a queue). An item is a
    Zen parameter (_ZenParam, by rows) or a DGC bucket (dgc.Bucket, by elements)."""

    def __init__(self, zen_params, op, predivide, scheme, transport, process_set, early, profile):
        self.order = zen_params
        self._lock = threading.Lock()
        self.scheme, self.transport, self.process_set = scheme, transport, process_set
        self.early = early  # start syncing from the backward hooks (False: at synchronize())
        self.profile = {zp.name: dict(syncs=0, seconds=0.0, bytes_sent=0, bytes_received=0,
                                      rows=0, density=0.0, union_density=0.0)
                        for zp in zen_params} if profile else None
        self._op, self._predivide = op, predivide
        self._generation = None   # the runtime generation the settings below were made for
        self._queue = queue.SimpleQueue()
        self._thread = None
        self.steps = 0   # rounds begun: the step count the header carries
        self.round = self._new_round()

    def _new_round(self):
        self.steps += 1
        return Round(self.order, self.steps)

    @property
    def ready(self):
        return self.round.ready

    @property
    def touched(self):
        return self.round.touched

    @property
    def started(self):
        return self.round.started

    def mark_ready(self, zp):
        self.round.ready[zp].set()
        if self.early:
            self._start()

    def arrive(self, item, param):
        """The item's parameter `param` has its gradient; the item is ready with the last."""
        with self._lock:
            self.round.arrived.add(param)
            if not all(p in self.round.arrived for p in item.params):
                return
        self.mark_ready(item)

    def _start(self):
        if self.round.started:
            return
        self.round.started = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, args=(self._queue, weakref.ref(self)),
                                            name="zen_hvd.optimizer", daemon=True)
            self._thread.start()
            # The thread ends with the optimizer, or before the interpreter shuts down (a
            # thread still blocked then would be torn down inside native code).
            weakref.finalize(self, self._queue.put, None)
            atexit.register(_stop_thread, self._queue, self._thread)
        self._queue.put(self.round)

    @staticmethod
    def _loop(rounds, worker_ref):
        """The thread's body. It holds the worker only while it runs a round, so an optimizer
        that goes away ends its thread (weakref.finalize puts the None)."""
        while True:
            rnd = rounds.get()
            worker = worker_ref()
            if rnd is None or worker is None:
                return
            try:
                worker._begin()
                for zp in worker.order:
                    rnd.ready[zp].wait()
                    rnd.results[zp] = worker._sync(zp, rnd)
            except BaseException as e:  # re-raised by finish(), on every rank alike
                rnd.error = e
            del worker
            rnd.done.set()

    def _begin(self):
        """At a round's start, once per set of ranks (the first round, and the first after an
        elastic reset): the ranks agree on the items, and the scaling follows the size."""
        runtime.context(self.transport, self.process_set)   # resets if the ranks changed
        if self._generation == runtime.generation:
            return
        check_same_items(self.order, self.transport, self.process_set)
        tr = runtime.get_transport(self.transport, self.process_set)
        size = self.size = tr.size
        self._rank = tr.rank
        # Horovod's pre/postscale split of the average: as factors of the sync.
        self.op, self.prescale, self.postscale = (ops.Sum, 1.0 / self._predivide, self._predivide / size) \
            if self._predivide != 1.0 else (self._op, 1.0, 1.0)
        self._generation = runtime.generation

    def _sync(self, item, rnd):
        """Sync one item (item.sync: a Zen parameter by rows, a DGC bucket by elements);
        returns what its write_back takes."""
        kw = dict(name=item.name, op=self.op, scheme=self.scheme, transport=self.transport,
                  process_set=self.process_set, prescale_factor=self.prescale,
                  postscale_factor=self.postscale, step=(rnd.step, rnd.fresh))
        t0 = time.perf_counter()
        out, info = item.sync(self.size, **kw)
        if self.profile is not None:
            self._record(item, info, time.perf_counter() - t0)
        return out

    def _record(self, item, info, seconds):
        """The profile of one sync, from the info it returned."""
        prof = self.profile[item.name]
        prof["syncs"] += 1
        prof["seconds"] += seconds
        for k in ("bytes_sent", "bytes_received"):
            prof[k] += info[k]
        prof["rows"] = int(info["nnz"][self._rank])   # elements, for a DGC bucket
        prof["density"] = prof["rows"] / item.num_units
        prof["union_density"] = info["union_size"] / item.num_units

    def release_all(self):
        """Every parameter not yet ready syncs what it has (an empty gradient if none)."""
        for ev in self.round.ready.values():
            ev.set()

    def finish(self):
        """Wait for this step's syncs; returns {zen param: synchronized sparse gradient, or None
        when it was synchronized in place}."""
        self.release_all()
        self._start()
        rnd = self.round
        rnd.done.wait()
        for item in self.order:
            item.step_done()
        self.round = self._new_round()
        if rnd.error is not None:
            raise rnd.error
        return rnd.results

    def discard(self):
        """Drop this step's syncs (finishing those already started)."""
        if self.round.started:
            self.finish()
        else:
            self.round = self._new_round()


def check_same_items(items, transport, process_set):
    """Every rank must sync the same Zen parameters and DGC buckets in the same order: compare
    a digest."""
    h = hashlib.blake2b("\n".join(item.name for item in items).encode(), digest_size=7)
    table = runtime.get_transport(transport, process_set).allgather_int64(
        [int.from_bytes(h.digest(), "little")])
    if (table != table[0]).any():
        raise TensorMismatchError(
            "zen_hvd.DistributedOptimizer: ranks disagree about which parameters are sparse "
            f"(this rank's: {[item.name for item in items]}); build the same model on every "
            "rank or pass the same sparse_params= everywhere")
