"""What a scheme is asked to do in one sync: one Request, the same for every scheme."""
from __future__ import annotations

import dataclasses

import numpy as np

from .units import Layout


@dataclasses.dataclass
class Request:
    """One tensor's sync as a scheme receives it (sync.allreduce_units builds it).

    prescale, scale, divisor: every input is multiplied by prescale before the sum, the sum
    by scale (the postscale factor with Average's 1/n folded in, floating dtypes), or
    divided by divisor, truncating (Average of an integer tensor; 0: none).
    ordered: a sparse result with ascending units; else in the order the servers send them.
    repeats (with not ordered): the caller adds the rows of a repeated unit, as torch adds an
    uncoalesced gradient, so a scheme may return every rank's rows without merging them.
    out: a dense [M, D] buffer of the backend, zero outside the union, for the result.
    The header row goes beside the request: every scheme fills its own copy (counts, nnz,
    input error) and sends it in its first round.
    """

    name: str
    layout: Layout
    vdtype: np.dtype | None     # the values' dtype on a Push scheme's wire (float16 travels as float32)
    scheme_names: dict          # header code -> scheme name, for the errors
    prescale: float = 1.0
    scale: float = 1.0
    divisor: int = 0
    ordered: bool = True
    repeats: bool = False
    out: object = None
    tensor: object = None       # the input, on the backend's device (float16 widened for a Push)
