"""Messages corrupted in flight, on real ranks (tests/mpi/fuzz_case.py has the corruptions and
the protocol of one example): a rank that receives a corrupt message raises an error naming
the tensor and the sending rank; no rank crashes or returns a wrong sum; ranks left waiting
for the one that raised end as for any error (the uncaught error aborts an mpirun job; here
the raising rank's farewell, or the stall deadline, ends their wait).

One mpirun per data path runs every scheme's and kind's Hypothesis examples inside the ranks
and writes one JSON record per example; the tests below read those records, one test per
(scheme, round, corruption kind) and data path. A crash (the job ends: a segfault, an
out-of-bounds write) fails the example that caused it, and the run goes on after it in a new job.

    pytest tests/test_fuzz_messages.py                       # host path, 1.5 to 2.5 minutes
    ZEN_HVD_FUZZ_EXAMPLES=10 pytest tests/test_fuzz_messages.py          # more per kind
    ZEN_HVD_FUZZ_DEVICE=1 pytest tests/test_fuzz_messages.py -k device   # the CUDA simulator's
                                         # device path (ZEN_HVD_DATA_PATH=device), ~2.5 minutes
    ZEN_HVD_FUZZ_ONLY=balanced:pull:tag,agsparse:push:pos_dup pytest ... -k "pull-tag or pos_dup"
    ZEN_HVD_FUZZ_REPORT=/tmp/fuzz pytest ...   # every record to /tmp/fuzz.host.jsonl

KNOWN_FAILING lists what the library does not do yet; those tests are expected failures.
"""
import json
import os
import sys

import pytest

from conftest import HERE, mpirun

sys.path.insert(0, os.path.join(HERE, "mpi"))
from fuzz_case import DEVICE_SCHEMES, KINDS, kinds_of, verdict  # noqa: E402

# One job per data path, every scheme in it: 4 ranks, so that hierarchical centralization
# runs two full doubling stages (ZEN_HVD_FUZZ_RANKS=3 or 5 adds its fold and unfold steps).
RANKS = int(os.environ.get("ZEN_HVD_FUZZ_RANKS", "4"))
EXAMPLES = int(os.environ.get("ZEN_HVD_FUZZ_EXAMPLES", "3"))            # per kind, host path
DEVICE_EXAMPLES = int(os.environ.get("ZEN_HVD_FUZZ_DEVICE_EXAMPLES", "1"))
DEVICE = os.environ.get("ZEN_HVD_FUZZ_DEVICE") == "1"
ENV = {
    "ZEN_HVD_TRANSPORT": "mpi4py",
    # The Pull corrupter sends one message per peer (Transport.pull_route "direct"); the ring
    # forwards each message as it came, so the checks on receipt are the same.
    "ZEN_HVD_PULL": "direct",
    # A rank left waiting for a peer that raised is ended by that peer's farewell (within a
    # second); the deadline only ends a wait no farewell ends (a sync of these small tensors
    # takes milliseconds).
    "ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "5",
    "ZEN_HVD_STALL_CHECK_TIME_SECONDS": "0",
    "ZEN_HVD_SEED": "12345",
    "OMP_NUM_THREADS": "1",
}
# The CUDA simulator runs the kernels in Python threads: a rank can wait seconds for a peer.
DEVICE_ENV = {"NUMBA_ENABLE_CUDASIM": "1", "ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "60"}

# What the library does not do yet: (scheme, round, kind) -> what happens (expected failures).
_NAME = ("a corrupt tensor name in one rank's copy of a header: that rank alone sees the names "
         "differ and gathers every rank's name for the error, a collective the others never "
         "join, so it ends at the stall deadline (a StallError naming the tensor, not the sender)")
KNOWN_FAILING = {
    ("balanced", "push", "header_name"): _NAME,
    ("hierarchical", "header", "header_name"): _NAME,
    ("agsparse", "push", "header_name"): _NAME,
}


def _run(path, tmp_path_factory):
    """Every record of one data path, every scheme: relaunches after a crash or a stuck job."""
    out = str(tmp_path_factory.mktemp(f"fuzz_{path}") / "records.jsonl")
    schemes = DEVICE_SCHEMES if path == "device" else sorted({s for s, _ in KINDS})
    env = dict(ENV, **(DEVICE_ENV if path == "device" else {}))
    examples = DEVICE_EXAMPLES if path == "device" else EXAMPLES
    start, records = 0, {}
    for _ in range(8):
        try:
            proc = mpirun(RANKS, "fuzz_case.py", "--schemes", ",".join(schemes), "--out", out,
                          "--examples", examples, "--start", start, "--path", path,
                          "--skip-minimal", int(path == "device"),
                          "--only", os.environ.get("ZEN_HVD_FUZZ_ONLY", ""), env=env, timeout=900,
                          check=False)
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except Exception as e:  # noqa: BLE001  (subprocess.TimeoutExpired: a stuck job)
            rc, text = "timeout", f"{type(e).__name__}: {e}"
        begun = {}
        with open(out) as f:
            for line in f:
                r = json.loads(line)
                if "begin" in r:
                    begun[r["begin"]] = r
                else:
                    records[r["idx"]] = r
        if rc == 0 and "done" in text:
            break
        if rc == "timeout" and not any(i not in records for i in begun):
            raise AssertionError(f"fuzz_case.py ({path}) timed out outside an example")
        lost = sorted(i for i in begun if i not in records)
        if not lost:
            raise AssertionError(f"fuzz_case.py ({path}) failed ({rc}) outside an example:\n"
                                 f"{text[-5000:]}")
        b = begun[lost[0]]
        tail = "\n".join(line for line in text.splitlines() if "Warning" not in line and any(
            w in line.lower() for w in ("signal", "segmentation", "error", "exited", "killed",
                                        "timeout")))[-1500:]
        rec = dict(idx=lost[0], scheme=b["scheme"], round=b["round"], kind=b["kind"], path=path,
                   n=b["n"], example=b["example"], applied=[], expect="raise", outcomes=[],
                   crash=f"the job ended ({rc}) in this example: {tail}")
        rec["passed"], rec["verdict"] = verdict(rec)
        records[lost[0]] = rec
        start = lost[0] + 1
    if os.environ.get("ZEN_HVD_FUZZ_REPORT"):   # every record, for a findings table
        with open(f"{os.environ['ZEN_HVD_FUZZ_REPORT']}.{path}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in sorted(records.values(), key=lambda r: r["idx"]))
    return list(records.values())


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    cache = {}

    def get(scheme, path):
        if path not in cache:
            cache[path] = _run(path, tmp_path_factory)
        return [r for r in cache[path] if r["scheme"] == scheme]
    return get


def _cases(path):
    for (scheme, rnd), kinds in kinds_of(path).items():
        for kind in kinds:
            marks = []
            if (scheme, rnd, kind) in KNOWN_FAILING:
                marks = [pytest.mark.xfail(reason=KNOWN_FAILING[scheme, rnd, kind], strict=False)]
            yield pytest.param(scheme, rnd, kind, id=f"{path}-{scheme}-{rnd}-{kind}", marks=marks)


def _check(records, scheme, rnd, kind):
    only = os.environ.get("ZEN_HVD_FUZZ_ONLY")
    if only and f"{scheme}:{rnd}:{kind}" not in only.split(","):
        pytest.skip("not in ZEN_HVD_FUZZ_ONLY")
    mine = [r for r in records if r["round"] == rnd and r["kind"] == kind]
    assert mine, f"{scheme} {rnd}:{kind}: no example ran"
    applied = [r for r in mine if r["expect"] != "n/a" or r.get("crash")]
    failed = [r for r in mine if not r["passed"]]
    report = "\n".join(_describe(r) for r in failed[:4])
    assert not failed, f"{scheme} {rnd}:{kind}: {len(failed)} of {len(mine)} examples failed\n{report}"
    assert applied, f"{scheme} {rnd}:{kind}: the corruption applied to none of {len(mine)} examples"


def _describe(r):
    ex = r["example"]
    lines = [f"- example {r['idx']} ({r['path']}, {r['n']} ranks; {ex['form']} M={ex['M']} "
             f"nnz={ex['nnz']}, sender rank {ex['sender']}, spread {ex['spread']}): {r['verdict']}"]
    lines += [f"    corrupted: message to rank {a['dest']} ({a['message']}): {a['what']} "
              f"[expect {a['expect']}]" for a in r["applied"]]
    for rank, o in enumerate(r["outcomes"]):
        text = o.get("msg") or o.get("evidence") or ""
        where = f" (at {o['where']})" if o.get("where") else ""
        lines.append(f"    rank {rank}: {o['status']}{' ' + o['type'] if 'type' in o else ''}{where}: "
                     f"{text[:300]}")
    return "\n".join(lines)


@pytest.mark.parametrize("scheme, rnd, kind", list(_cases("host")))
def test_corrupt_message_raises_naming_tensor_and_sender(fuzz, scheme, rnd, kind):
    _check(fuzz(scheme, "host"), scheme, rnd, kind)


@pytest.mark.skipif(not DEVICE, reason="the CUDA simulator is slow: ZEN_HVD_FUZZ_DEVICE=1 runs it")
@pytest.mark.parametrize("scheme, rnd, kind", list(_cases("device")))
def test_corrupt_message_raises_naming_tensor_and_sender_device_path(fuzz, scheme, rnd, kind):
    _check(fuzz(scheme, "device"), scheme, rnd, kind)
