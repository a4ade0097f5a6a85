"""Every scheme a sync can run, and what each declares about itself:

    name            what scheme= and the logs call it;
    code            its number in the header (header.py), the same on every rank;
    device          whether it has a device path (a CUDA tensor stays on its GPU: balanced.py
                    on backend.Device, device_hierarchy.py);
    auto            whether scheme="auto" may pick it (auto.py);
    header_in_push  whether it carries the header in its own first round (.sync(request,
                    source, header, ctx, backend)); the others plan, then exchange headers,
                    then run (.plan, .run).

The dispatch (sync.py), auto's candidates and the cost model's list read these declarations.
"""
from __future__ import annotations

from .balanced import BalancedParallelism
from .baselines import DenseAllReduce, OmniReduce, SparCML, SparsePS
from .hierarchical import HierarchicalCentralization
from .oneshot import OneShotCentralization
from .two_level import TwoLevel

_ALL = (BalancedParallelism(), HierarchicalCentralization(), DenseAllReduce(), OneShotCentralization(),
        SparCML(), OmniReduce(), SparsePS())
SCHEMES = {s.name: s for s in _ALL}
NAMES = {s.code: s.name for s in _ALL}        # header code -> name
assert len(NAMES) == len(SCHEMES), "two schemes declare the same header code"
# The two-level sync's header names the scheme it runs across hosts (two_level.py).
NAMES.update({TwoLevel.header_code(c): f"{name} (two levels)" for c, name in list(NAMES.items())})
NAMES[TwoLevel.header_code(None)] = "auto (two levels)"
AUTO = tuple(s.name for s in _ALL if s.auto)
DEVICE = tuple(s.name for s in _ALL if s.device)
HEADER_IN_PUSH = tuple(s.name for s in _ALL if s.header_in_push)
