"""Messages corrupted in flight: a rank that receives one raises an error naming the tensor
and the sending rank, and no rank returns a wrong sum.

    mpirun -np N python tests/mpi/fuzz_case.py --schemes S[,S...] --out FILE [--examples K]
        [--start I] [--path host|device] [--skip-minimal 1] [--only scheme:round:kind,...]

(ZEN_HVD_TRANSPORT=mpi4py; NUMBA_ENABLE_CUDASIM=1 for --path device; see
tests/test_fuzz_messages.py for the environment the test sets.)

One rank of each example (the sender, drawn) corrupts the messages it sends in one round of a
sync, on its side of the transport: the Transport hooks the sync uses (runtime.context's
transport, mpi/transport.py) are wrapped on that rank only, so the bytes on the wire are what
a corrupt peer (or a corrupting network) would deliver. Rounds:

  balanced      push    the Push parts [header][positions][values] (Transport._push)
                pull    the Pull message [values][pad][bitmap or positions][int64 tag 2K+fmt]
                        (Transport._pull_joined)
  hierarchical  header  the header round (Transport._push of the header alone)
                step    one message of the recursive doubling [int64 tag 4K+fmt][index][values]
                        (Transport._swap)
  agsparse      push    the one-shot message [header][positions][values] (Transport._push_all)

Corruptions leave the values alone (a changed value is a different gradient: no protocol
without a checksum can tell). Each kind says what a correct library does (`expect`):
  raise         the message is malformed (truncated, extended, a header field the ranks
                compare, a count, a tag, an index out of the server's range, a duplicate
                index, a bitmap whose popcount or tail disagrees with its tag, positions
                out of their ascending order where the format sends them ascending): a rank
                that receives it raises an error naming the tensor and the sending rank; the
                others return the right sum, raise, or wait for it (then the job ends as for
                any error: the uncaught error aborts it under mpirun, or the stall deadline);
  harmless      a header field no rank reads for this scheme (error_detail, step, the counts
                of other servers): every rank returns the right sum (or every rank raises);
  undetectable  a position flipped onto another valid unit: a different gradient; recorded,
                asserted only not to crash or hang.
"spread" one: the message to one peer is corrupted; all: the message to every peer (the
sender's own part never travels, so it stays intact).

Rank 0 draws the examples with Hypothesis (a fixed seed per kind: the same sequence every run)
and broadcasts them over MPI.COMM_WORLD; every rank builds every rank's input from the
example's seed, so each checks its result against a float64 sum of all inputs (integer
values: the float32 sum is exact). After each example every rank reports its outcome: "ok"
(right sum, a well-formed result), "wrong" (a result that is not the sum, or a malformed
sparse tensor), "raised" (type and message), "hang" (a StallError: the rank waited for a peer
that had raised). A rank that raised sends its peers the transport's farewell, so that a peer
left waiting for it ends its wait at once (PeerLeftError) instead of at the stall deadline:
such a peer is still a hang, the farewell only keeps the run short. When any rank raised,
every rank then drops zen_hvd's state (runtime.reset): the next sync builds a new transport on
a new communicator, whatever messages the corrupt one left unread. A failure of the corrupter
itself is recorded as a harness error, never as a finding. Rank 0 writes one JSON line per example to
--out ("begin" before it runs, then the record), so that a crash (a segfault ends the job)
leaves the example that caused it: the pytest side (tests/test_fuzz_messages.py) relaunches
after it.
"""
import argparse
import json
import os
import random
import re
import sys
import time
import traceback
import zlib

import numpy as np

# (scheme, round) -> the corruption kinds applied in that round
KINDS = {
    ("balanced", "push"): ("truncate", "truncate_header", "extend", "header_agreed", "header_dtype",
                           "header_name", "header_count", "header_error", "header_other",
                           "pos_oob", "pos_dup", "pos_flip"),
    ("balanced", "pull"): ("truncate", "extend", "tag", "bit_extra", "bit_clear", "bit_past",
                           "pos_oob", "pos_dup", "pos_order", "pos_flip"),
    ("hierarchical", "header"): ("truncate", "extend", "header_agreed", "header_dtype",
                                 "header_name", "header_error", "header_other"),
    ("hierarchical", "step"): ("truncate", "extend", "tag", "bit_extra", "bit_clear", "bit_past",
                               "pos_oob", "pos_dup", "pos_order", "pos_flip"),
    ("agsparse", "push"): ("truncate", "truncate_header", "extend", "header_agreed", "header_dtype",
                           "header_name", "header_count", "header_error", "header_other",
                           "pos_oob", "pos_dup", "pos_flip"),
}
DEVICE_SCHEMES = ("balanced", "hierarchical")   # the schemes with a device data path
# On the device path (ZEN_HVD_DATA_PATH=device) the header round and its check are the host
# path's code (sync.exchange_headers, header.check_table): only what the device code reads.
DEVICE_KINDS = {
    ("balanced", "push"): ("truncate", "extend", "header_count", "pos_oob", "pos_dup", "pos_flip"),
    ("balanced", "pull"): KINDS[("balanced", "pull")],
    ("hierarchical", "step"): KINDS[("hierarchical", "step")],
}


def kinds_of(path):
    return DEVICE_KINDS if path == "device" else KINDS


def verdict(rec):
    """(passed, what happened) of one example record (see the module doc)."""
    expect, outs = rec["expect"], rec["outcomes"]
    status = [o["status"] for o in outs]
    raised = [r for r, s in enumerate(status) if s == "raised"]
    named = [r for r in raised if outs[r]["named"]]
    hung = [r for r, s in enumerate(status) if s == "hang"]
    wrong = [r for r, s in enumerate(status) if s == "wrong"]
    ok = [r for r, s in enumerate(status) if s == "ok"]
    desc = ", ".join(f"{k} {v}" for k, v in (("raised", raised), ("hang", hung), ("wrong", wrong),
                                             ("ok", ok)) if v)
    if rec.get("crash"):
        return False, "crash: " + rec["crash"]
    if "harness" in status:
        return False, "the corrupter failed (a harness error, not a finding): " + \
            next(o["msg"] for o in outs if o["status"] == "harness")
    if expect == "n/a":            # nothing was corrupted: a clean sync
        return len(ok) == len(outs), "not applied; " + desc
    if len(named) != len(raised):
        return False, "error not naming the tensor: " + desc
    if expect == "undetectable":
        return True, "undetectable: " + desc
    # a rank that received only undetectable corruptions (a different gradient) may return
    # that gradient's sum
    excused = {a["dest"] for a in rec["applied"] if a["expect"] == "undetectable"} - \
        {a["dest"] for a in rec["applied"] if a["expect"] != "undetectable"}
    if set(wrong) - excused:
        return False, "silently wrong: " + desc
    if expect == "harmless" and (len(ok) == len(outs) or len(named) == len(outs)):
        return True, desc
    if expect == "raise" and named:
        # Ranks that did not receive the corrupt message return the correct sum, or wait for
        # the rank that raised (the job then ends as for any error: the uncaught error aborts
        # it under mpirun, or the stall deadline).
        sender = rec["example"]["sender"]
        if not any(names_rank(outs[r]["msg"], sender) for r in named):
            return False, f"no error names the sending rank {sender}: " + desc
        return True, desc
    return False, "no rank raised: " + desc


def names_rank(msg, r):
    """Whether an error message names rank (or server) r."""
    for m in re.finditer(r"\b(?:rank|ranks|server|servers)\s+(\[[^\]]*\]|\d+)", msg):
        if r in [int(x) for x in re.findall(r"\d+", m.group(1))]:
            return True
    return False


# -- the examples -----------------------------------------------------------------------
def strategy(scheme, rnd, kind, n):
    from hypothesis import strategies as st

    if rnd in ("pull", "step") and kind.startswith("pos_"):
        M, nnz = st.integers(1000, 2000), st.integers(2, 8)       # a positions-format index
    elif rnd in ("pull", "step") and kind.startswith("bit_"):
        M, nnz = st.integers(500, 1500), st.integers(60, 250)     # a bitmap index
    elif kind.startswith("pos_"):
        M, nnz = st.integers(300, 1500), st.integers(8, 150)      # parts of a few positions
    else:
        M, nnz = st.integers(300, 1500), st.integers(1, 150)
    return st.fixed_dictionaries(dict(
        seed=st.integers(0, 2 ** 31 - 1), M=M, form=st.sampled_from(["rows", "dense1d"]),
        D=st.integers(1, 4), nnz=st.lists(nnz, min_size=n, max_size=n),
        sender=st.integers(0, n - 1), spread=st.sampled_from(["one", "all"]),
        pick=st.integers(0, 2 ** 16), r=st.integers(0, 2 ** 32 - 1)))


def inputs(ex, n):
    """Every rank's input (integer values, exact in float32), their float64 sum [M, D] and
    the union of their units."""
    import torch

    rng = np.random.default_rng(ex["seed"])
    M, D = ex["M"], (ex["D"] if ex["form"] == "rows" else 1)
    ts, ref, union = [], np.zeros((M, D)), set()
    for r in range(n):
        units = np.sort(rng.choice(M, min(M, ex["nnz"][r]), replace=False)).astype(np.int64)
        vals = rng.integers(1, 10, (units.size, D)) * rng.choice([-1, 1], (units.size, D))
        ref[units] += vals
        union.update(units.tolist())
        if ex["form"] == "rows":
            t = torch.sparse_coo_tensor(torch.from_numpy(units).reshape(1, -1),
                                        torch.from_numpy(vals.astype(np.float32)), (M, D),
                                        check_invariants=True).coalesce()
        else:
            t = torch.zeros(M, dtype=torch.float32)
            t[torch.from_numpy(units)] = torch.from_numpy(vals[:, 0].astype(np.float32))
        ts.append(t)
    return ts, ref, union


def check_result(out, ex, ref, union):
    """("ok" or "wrong", evidence) of a sync's result against the float64 sum."""
    import torch

    M, D = ref.shape
    problems = []
    if ex["form"] == "dense1d":
        if out.is_sparse or tuple(out.shape) != (M,):
            return "wrong", f"a result of layout {out.layout}, shape {tuple(out.shape)}"
        got = out.double().numpy().reshape(M, 1)
    else:
        if not out.is_sparse or tuple(out.shape) != (M, D):
            return "wrong", f"a result of layout {out.layout}, shape {tuple(out.shape)}"
        idx = out._indices()[0].numpy()
        if idx.size > 1 and not (idx[1:] > idx[:-1]).all():
            problems.append(f"indices not strictly ascending ({idx.size - np.unique(idx).size} "
                            f"repeated){' though marked coalesced' if out.is_coalesced() else ''}")
        have = set(idx.tolist())
        if have != union:
            problems.append(f"units missing {sorted(union - have)[:5]}, extra {sorted(have - union)[:5]}")
        if idx.size and (idx.min() < 0 or idx.max() >= M):
            return "wrong", "; ".join(problems + ["indices out of range"])
        got = torch.sparse_coo_tensor(out._indices(), out._values().double(), (M, D),
                                      check_invariants=False).to_dense().numpy()
    diff = np.flatnonzero((got != ref).any(axis=1))
    if diff.size:
        u = int(diff[0])
        problems.append(f"{diff.size} rows differ from the sum (unit {u}: {got[u].tolist()} "
                        f"instead of {ref[u].tolist()})")
    return ("wrong", "; ".join(problems)) if problems else ("ok", "")


# -- corruption --------------------------------------------------------------------------
class HarnessError(RuntimeError):
    """The corrupter itself failed (not the library): the example proves nothing."""


def swap_schedule(me, n):
    """The peers this rank sends a set to, in order, in RecursiveDoubling.run."""
    p = 1 << (n.bit_length() - 1)
    extra, sends = n - p, []
    if extra and me >= p:
        sends.append(me - p)
    step = 1
    while step < p:
        if me < p:
            sends.append(me ^ step)
        step <<= 1
    if extra and me < extra:
        sends.append(me + p)
    return sends


class Corrupter:
    """Wraps one round's Transport hook on the sender's transport (instance attributes, so the
    class's methods are untouched) and corrupts what it sends. `applied` records what was
    done and what a correct library does about it."""

    def __init__(self, tr, scheme, rnd, kind, ex, M, D, path):
        from zen_hvd.cuda_kernels import h0
        from zen_hvd.header import COL, COUNTS, FIELDS

        self.tr, self.scheme, self.rnd, self.kind, self.ex = tr, scheme, rnd, kind, ex
        self.M, self.n, self.me = M, tr.size, tr.rank
        self.vsz = D * 4                                  # float32 values
        self.h0, self.COL, self.COUNTS, self.FIELDS = h0, COL, COUNTS, FIELDS
        self.rng = random.Random(ex["r"])
        self.applied = []          # one entry per corrupted message
        self.pushes = self.swaps = 0
        sends = swap_schedule(self.me, self.n)
        self.swap_call = ex["pick"] % len(sends) if sends else -1
        self.hooks = []

    # -- installing ----------------------------------------------------------------------
    def install(self):
        hook = {("balanced", "push"): "_push", ("hierarchical", "header"): "_push",
                ("agsparse", "push"): "_push_all", ("balanced", "pull"): "_pull_joined",
                ("hierarchical", "step"): "_swap"}[(self.scheme, self.rnd)]
        if hook == "_pull_joined" and (not hasattr(self.tr, "_exchange") or self.tr.pull_route() != "direct"):
            raise HarnessError("the Pull corrupter needs a point-to-point transport's _exchange and "
                               "the direct Pull (ZEN_HVD_PULL=direct)")
        self.orig_push = self.tr._push
        self.orig = getattr(self.tr, hook)
        setattr(self.tr, hook, getattr(self, hook[1:]))
        self.hooks = [hook]

    def uninstall(self):
        for h in self.hooks:
            self.tr.__dict__.pop(h, None)

    def peers(self):
        others = [r for r in range(self.n) if r != self.me]
        k = self.ex["pick"] % len(others)
        return others[k:] + others[:k]

    def corrupt_each(self, messages, mtype):
        """messages[r]: what goes to rank r; corrupts one peer's or every peer's (spread)."""
        out = list(messages)
        for dest in self.peers():
            got = self.safely(messages[dest], mtype, dest)
            if got is not None:
                out[dest] = got
                if self.ex["spread"] == "one":
                    break
        return out

    # -- the wrapped hooks ---------------------------------------------------------------
    def push(self, send, send_counts):
        self.pushes += 1
        if self.pushes > 1:
            return self.orig(send, send_counts)
        counts = [int(c) for c in send_counts]
        offs = np.cumsum([0] + counts)
        msgs = [send[offs[r]:offs[r + 1]] for r in range(self.n)]
        mtype = "push_part" if self.scheme == "balanced" else "header_only"
        msgs = self.corrupt_each(msgs, mtype)
        return self.orig(np.concatenate(msgs), [m.size for m in msgs])

    def push_all(self, send):
        # Transport._push_all's route (a push whose every part is `send`), so that one peer's
        # copy can differ: the same PUSH messages on the wire as the transport's own.
        msgs = self.corrupt_each([send] * self.n, "oneshot")
        parts = self.orig_push(np.concatenate(msgs), [m.size for m in msgs])
        parts[self.me] = send
        return parts

    def pull_joined(self, send, body_nbytes):
        # The Pull sends one message to every peer; to corrupt one peer's copy, the messages
        # go out one per peer through the point-to-point transport's exchange (its Pull tag),
        # and the received ones are joined as Transport._pull_joined joins them.
        from zen_hvd.mpi.transport import joined

        tag = getattr(self.tr, "pull_tag", None)
        if tag is None:   # the mpi4py transport before PointToPoint (commit 3013194)
            from zen_hvd.mpi.mpi4py_transport import PULL_TAG as tag
        msgs = self.corrupt_each([send] * self.n, "pull")
        parts = self.tr._exchange(msgs, tag)
        parts[self.me] = send
        return joined(parts, body_nbytes), [p.size for p in parts]

    def swap(self, send, peer, receive, *rest):
        if send is not None and peer is not None:
            call, self.swaps = self.swaps, self.swaps + 1
            if call == self.swap_call:
                host = send if isinstance(send, np.ndarray) else send.cpu().numpy()
                got = self.safely(host, "step", peer)
                if got is not None:   # on the device route (a tensor), as a tensor again
                    send = got if host is send else torch_like(got, send)
        return self.orig(send, peer, receive, *rest)

    # -- one message ---------------------------------------------------------------------
    def safely(self, msg, mtype, dest):
        try:
            return self.corrupt(msg, mtype, dest)
        except Exception as e:  # noqa: BLE001
            raise HarnessError(f"the corrupter failed on a {mtype} message: "
                               f"{type(e).__name__}: {e}") from e

    def corrupt(self, msg, mtype, dest):
        """A corrupted copy of msg (uint8), or None when this kind does not apply to it."""
        from zen_hvd.wire import index_dtype

        msg = np.ascontiguousarray(msg).copy()
        M, n, me, rng, kind = self.M, self.n, self.me, self.rng, self.kind
        H = (self.COUNTS + n) * 8
        index = None   # (offset, count, isz, bound, ascending, unique) of a positions index
        bitmap = None  # (offset, words, bound) of a bitmap index
        tag_at = None  # (offset, tag) of a closing or opening int64 tag
        if mtype in ("push_part", "oneshot"):
            if msg.size < H:
                return None
            head = msg[:H].view(np.int64)
            if mtype == "push_part":
                k, bound = int(head[self.COUNTS + dest]), self.h0.server_size(M, n, dest)
                isz = index_dtype(self.h0.server_size(M, n, 0)).itemsize
            else:
                k, bound, isz = int(head[self.COL["nnz"]]), M, index_dtype(M).itemsize
            # the one-shot message may repeat a unit: an uncoalesced gradient's rows travel as
            # they are (then a duplicate is a different gradient, not a corrupt message)
            index = (H, k, isz, bound, False, mtype == "push_part")
        elif mtype == "pull":
            tag = int(msg[-8:].view(np.int64)[0])
            K, fmt = tag >> 1, tag & 1
            bound = self.h0.server_size(M, n, me)
            at = (K * self.vsz + 7) & ~7
            if fmt == 0:
                index = (at, K, index_dtype(self.h0.server_size(M, n, 0)).itemsize, bound, True, True)
            else:
                bitmap = (at, (bound + 63) // 64, bound)
            tag_at = (msg.size - 8, tag, 1)
        elif mtype == "step":
            tag = int(msg[:8].view(np.int64)[0])
            K, fmt = tag >> 2, tag & 3
            if fmt == 0:
                index = (8, K, index_dtype(M).itemsize, M, True, True)
            elif fmt == 1:
                bitmap = (8, (M + 63) // 64, M)
            tag_at = (0, tag, 2)

        what, expect = None, "raise"
        if kind == "truncate":
            keep_min = H if mtype in ("push_part", "oneshot") else 0
            if msg.size <= keep_min:
                return None
            cut = rng.randint(1, msg.size - keep_min)
            what, msg = f"dropped the last {cut} of {msg.size} bytes", msg[:msg.size - cut]
        elif kind == "truncate_header":
            keep = rng.randint(0, H - 1)
            what, msg = f"cut to {keep} bytes (the header is {H})", msg[:keep]
        elif kind == "extend":
            extra = rng.randint(1, 16)
            what = f"{extra} bytes appended to {msg.size}"
            msg = np.concatenate([msg, np.frombuffer(rng.randbytes(extra), np.uint8)])
        elif kind.startswith("header_"):
            fields = self._header_fields(kind, dest)
            if not fields:
                return None
            f = rng.choice(fields)
            if kind == "header_dtype":   # a dtype code past header.DTYPES
                code = rng.choice([9, 10, 255, 2 ** 40])
                msg[f * 8:f * 8 + 8].view(np.int64)[0] = code
                what = f"header field 'dtype' set to {code} (DTYPES has 9 entries)"
            elif kind == "header_error":
                code = rng.choice([1, 2])
                msg[f * 8:f * 8 + 8].view(np.int64)[0] = code
                what = f"header field 'error' set to {code}"
            elif kind == "header_count" and rng.random() < 0.5:
                # one more or one less: with 4-byte positions and values and an odd count,
                # the padded message has the same size
                old = int(msg[f * 8:f * 8 + 8].view(np.int64)[0])
                new = old + rng.choice([-1, 1])
                msg[f * 8:f * 8 + 8].view(np.int64)[0] = new
                what = f"header field {self._field_name(f)!r}: {old} -> {new}"
            else:
                b, mask = rng.randrange(8), rng.randint(1, 255)
                old = int(msg[f * 8:f * 8 + 8].view(np.int64)[0])
                msg[f * 8 + b] ^= mask
                new = int(msg[f * 8:f * 8 + 8].view(np.int64)[0])
                what = f"header field {self._field_name(f)!r}: {old} -> {new}"
            if kind == "header_other":
                expect = "harmless"
        elif kind == "tag":
            if tag_at is None:
                return None
            at, tag, shift = tag_at
            choice = rng.randrange(3)
            if choice == 0:
                new = tag + rng.choice([-1, 1, -1, 1, -2, 2, 3]) * (1 << shift)   # K +- d
            elif choice == 1:
                new = tag ^ rng.randint(1, (1 << shift) - 1)                    # the format
            else:
                new = tag ^ (rng.randint(1, 255) << (8 * rng.randrange(8)))
                new = int(np.array([new & ((1 << 64) - 1)], np.uint64).view(np.int64)[0])
            msg[at:at + 8].view(np.int64)[0] = new
            what = f"tag {tag} (K={tag >> shift}, format {tag & ((1 << shift) - 1)}) -> {new} " \
                   f"(K={new >> shift}, format {new & ((1 << shift) - 1)})"
        elif kind.startswith("bit_"):
            if bitmap is None:
                return None
            at, nwords, bound = bitmap
            words = msg[at:at + 8 * nwords].view(np.uint64)
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")
            ones, zeros = np.flatnonzero(bits[:bound]), np.flatnonzero(bits[:bound] == 0)
            if kind == "bit_extra":
                if not zeros.size:
                    return None
                j = int(zeros[rng.randrange(zeros.size)])
                bits[j] = 1
                what = f"bit {j} set (of {bound}; {ones.size} set before)"
            elif kind == "bit_clear":
                if not ones.size:
                    return None
                j = int(ones[rng.randrange(ones.size)])
                bits[j] = 0
                what = f"bit {j} cleared (of {bound}; {ones.size} set before)"
            else:   # bit_past: one set bit moved past the range (the popcount stays)
                if bound % 64 == 0 or not ones.size:
                    return None
                j0, j = int(ones[rng.randrange(ones.size)]), rng.randrange(bound, 64 * nwords)
                bits[j0], bits[j] = 0, 1
                what = f"bit {j0} moved to bit {j}, past the range of {bound} bits (popcount kept)"
            words[:] = np.packbits(bits, bitorder="little").view(np.uint64)
        elif kind.startswith("pos_"):
            if index is None:
                return None
            at, k, isz, bound, ascending, unique = index
            dt = np.dtype(np.int32 if isz == 4 else np.int64)
            if at + k * isz > msg.size:
                return None
            pos = msg[at:at + k * isz].view(dt)
            before = pos.copy()
            if kind == "pos_oob" and k >= 1:
                i = rng.randrange(k)
                pos[i] = rng.choice([bound, bound + rng.randint(1, 1000), np.iinfo(dt).max, -1,
                                     np.iinfo(dt).min])
                what = f"position {i} of {k}: {before[i]} -> {pos[i]} (range {bound})"
            elif kind == "pos_dup" and k >= 2:
                i, j = rng.sample(range(k), 2)
                pos[i] = pos[j]
                what = f"position {i} of {k}: {before[i]} -> {pos[i]} (a duplicate of position {j})"
                if not unique:
                    expect = "undetectable"
            elif kind == "pos_order" and k >= 2 and ascending:
                i, j = sorted(rng.sample(range(k), 2))
                pos[i], pos[j] = before[j], before[i]
                what = f"positions {i} and {j} of {k} swapped ({before[i]}, {before[j]})"
            elif kind == "pos_flip" and k >= 1:
                i, b = rng.randrange(k), rng.randrange(8 * isz)
                msg[at + i * isz + b // 8] ^= np.uint8(1 << (b % 8))   # pos is a view of msg
                new = int(pos[i])
                others = np.delete(before, i)
                if not 0 <= new < bound:
                    expect, why = "raise", "out of range"
                elif new in others:
                    expect, why = ("raise", "a duplicate") if unique else ("undetectable", "a repeated unit")
                elif ascending and not (np.diff(pos.astype(np.int64)) > 0).all():
                    expect, why = "raise", "out of ascending order"
                else:
                    expect, why = "undetectable", "another valid unit"
                what = f"position {i} of {k}: bit {b} flipped, {before[i]} -> {new} ({why})"
            else:
                return None
        if what is None:
            return None
        self.applied.append(dict(dest=int(dest), message=mtype, what=what, expect=expect))
        return msg

    def _header_fields(self, kind, dest):
        COL, COUNTS, n = self.COL, self.COUNTS, self.n
        agreed = [COL[f] for f in self.FIELDS[:self.FIELDS.index("error")] if f != "name"]
        if kind == "header_agreed":
            return agreed
        if kind == "header_name":
            return [COL["name"]]
        if kind == "header_error":
            return [COL["error"]]
        if kind == "header_dtype":
            return [COL["dtype"]]
        count = COUNTS + dest if self.scheme == "balanced" else COL["nnz"]
        if kind == "header_count":
            return [count]
        # header_other: what no rank reads in this scheme
        others = [COL["error_detail"], COL["step"]] + [COUNTS + q for q in range(n)]
        if self.scheme != "agsparse":
            others.append(COL["nnz"])
        return [f for f in others if f != count or self.scheme == "hierarchical"]

    def _field_name(self, f):
        return self.FIELDS[f] if f < self.COUNTS else f"counts[{f - self.COUNTS}]"


def library_frame(e):
    """Where in zen_hvd an exception was raised: its innermost frame in the library's files
    (file:function:line), and the innermost frame when that is elsewhere (numpy, torch)."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if any(d in f.filename.replace("\\", "/")
                                     for d in ("/zen_hvd/", "/mpi/", "/cuda_kernels/"))
            and not f.filename.endswith("fuzz_case.py")]
    where = [f"{f.filename.rsplit('/', 1)[-1]}:{f.name}:{f.lineno}" for f in mine[-1:] + frames[-1:]]
    return " <- ".join(dict.fromkeys(reversed(where)))


def torch_like(a, t):
    import torch

    return torch.from_numpy(a).to(t.device)


# -- the run -----------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", required=True, help="comma-separated: balanced,hierarchical,agsparse")
    ap.add_argument("--out", required=True)
    ap.add_argument("--examples", type=int, default=3, help="examples per kind")
    ap.add_argument("--start", type=int, default=0, help="skip the examples before this one")
    ap.add_argument("--path", default="host", choices=["host", "device"])
    ap.add_argument("--skip-minimal", type=int, default=0,
                    help="1: do not run each kind's first (simplest) example (few examples per kind)")
    ap.add_argument("--only", default="", help="scheme:round:kind[,...] to run only those")
    args = ap.parse_args()

    os.environ["ZEN_HVD_DATA_PATH"] = args.path
    import torch  # noqa: F401
    from hypothesis import HealthCheck, Phase, given, seed, settings

    import zen_hvd
    from zen_hvd import runtime
    from zen_hvd.mpi import stall

    zen_hvd.init()
    from mpi4py import MPI

    # A peer that raised says farewell (below); what it sent before is long delivered.
    stall.LAST_MESSAGES = 0.3
    world = MPI.COMM_WORLD
    n, me = world.Get_size(), world.Get_rank()

    # The harness's own messages (COMM_WORLD, apart from the transports' communicators) poll
    # and sleep: MPI's blocking calls spin, and ranks spinning on shared cores starve the
    # ranks still working.
    def wait(request):
        while not request.Test():
            time.sleep(0.002)

    def send_all(obj, tag):
        for q in [world.isend(obj, dest=r, tag=tag) for r in range(n) if r != me]:
            while not q.test()[0]:
                time.sleep(0.002)

    def recv_from(src, tag):
        while (m := world.improbe(source=src, tag=tag)) is None:
            time.sleep(0.002)
        return m.recv()

    def bcast(obj=None):
        if me == 0:
            send_all(obj, 7)
            return obj
        return recv_from(0, 7)

    def allgather(obj):
        send_all(obj, 8)
        return [obj if r == me else recv_from(r, 8) for r in range(n)]
    schemes = args.schemes.split(",")
    only = {tuple(x.split(":")) for x in args.only.split(",") if x}
    out = open(args.out, "a") if me == 0 else None

    def run(idx, scheme, rnd, kind, ex):
        ts, ref, union = inputs(ex, n)
        M, D = ref.shape
        name = f"fuzz.{scheme}.{rnd}.{kind}.{idx}"
        tc = time.monotonic()
        tr = runtime.context().transport       # the transport this sync will use
        tc = time.monotonic() - tc
        corr = None
        if me == ex["sender"]:
            corr = Corrupter(tr, scheme, rnd, kind, ex, M, D, args.path)
            corr.install()
        t0 = time.monotonic()
        try:
            got = zen_hvd.sparse_allreduce(ts[me], name=name, op=zen_hvd.Sum, scheme=scheme)
            status, evidence = check_result(got, ex, ref, union)
            outcome = dict(status=status, evidence=evidence)
        except HarnessError as e:
            outcome = dict(status="harness", type=type(e).__name__, msg=str(e))
        except zen_hvd.StallError as e:
            outcome = dict(status="hang", type=type(e).__name__, msg=str(e))
        except Exception as e:  # noqa: BLE001  (every error is an outcome to record)
            msg = str(e)
            outcome = dict(status="raised", type=type(e).__name__, msg=msg,
                           named=repr(name) in msg or name in msg,
                           names_sender=names_rank(msg, ex["sender"]),
                           where=library_frame(e))
        finally:
            if corr is not None:
                corr.uninstall()
        outcome["seconds"] = round(time.monotonic() - t0, 3)
        outcome["context_seconds"] = round(tc, 3)
        if outcome["status"] in ("raised", "hang", "harness"):
            tr._farewell()   # peers waiting for this rank end their wait now
        if corr is not None:
            outcome["applied"] = corr.applied
        outcomes = allgather(outcome)
        if any(o["status"] in ("raised", "hang", "harness") for o in outcomes):
            runtime.reset()  # a new transport (a new communicator) for the next example
        return outcomes

    def record(idx, scheme, rnd, kind, ex, outcomes):
        applied = next(o["applied"] for o in outcomes if "applied" in o)
        expects = [a["expect"] for a in applied]
        expect = "n/a" if not applied else "raise" if "raise" in expects else \
            "harmless" if "harmless" in expects else "undetectable"
        rec = dict(idx=idx, scheme=scheme, round=rnd, kind=kind, path=args.path, n=n, example=ex,
                   applied=applied, expect=expect,
                   outcomes=[{k: v for k, v in o.items() if k != "applied"} for o in outcomes])
        rec["passed"], rec["verdict"] = verdict(rec)
        return rec

    counter = iter(range(10 ** 9))

    def kind_run(scheme, rnd, kind):
        first = [True]

        @seed(zlib.crc32(f"{scheme}:{rnd}:{kind}".encode()))
        @settings(max_examples=args.examples + args.skip_minimal, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(ex=strategy(scheme, rnd, kind, n))
        def one(ex):
            if args.skip_minimal and first:
                first.pop()   # Hypothesis's first example is its simplest: the same for every kind
                return
            idx = next(counter)
            if idx < args.start:
                return
            out.write(json.dumps(dict(begin=idx, scheme=scheme, round=rnd, kind=kind,
                                      path=args.path, n=n, example=ex)) + "\n")
            out.flush()
            t0 = time.monotonic()
            if idx == int(os.environ.get("ZEN_HVD_FUZZ_SELFTEST_CRASH_AT", -1)):
                os.abort()   # checks the pytest side's crash handling (tests/test_fuzz_messages.py)
            bcast(("run", idx, scheme, rnd, kind, ex))
            rec = record(idx, scheme, rnd, kind, ex, run(idx, scheme, rnd, kind, ex))
            rec["wall"] = round(time.monotonic() - t0, 3)
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print(f"[{idx}] {scheme} {rnd}:{kind} {'pass' if rec['passed'] else 'FAIL'}: {rec['verdict']}",
                  flush=True)
        one()

    # a clean sync first: every kernel compiled and every rank in step before the clocks run
    clean = dict(seed=1, M=500, form="rows", D=2, nnz=[20] * n, sender=-1, spread="one", pick=0, r=0)
    for scheme in schemes:
        ts, ref, union = inputs(clean, n)
        got = zen_hvd.sparse_allreduce(ts[me], name=f"fuzz.warmup.{scheme}", op=zen_hvd.Sum, scheme=scheme)
        assert check_result(got, clean, ref, union)[0] == "ok", f"{scheme}: a clean sync failed"
    wait(world.Ibarrier())
    if me == 0:
        for scheme in schemes:
            for (s, rnd), kinds in kinds_of(args.path).items():
                for kind in kinds if s == scheme else ():
                    if not only or (scheme, rnd, kind) in only:
                        kind_run(scheme, rnd, kind)
        bcast(("stop",))
        print(f"fuzz_case: {args.schemes} ({args.path}, {n} ranks) done", flush=True)
    else:
        while True:
            msg = bcast()
            if msg[0] == "stop":
                break
            _, idx, scheme, rnd, kind, ex = msg
            run(idx, scheme, rnd, kind, ex)


if __name__ == "__main__":
    sys.exit(main())
