"""Special functions NumPy lacks, vectorised to double precision."""

from __future__ import annotations

import math

import numpy as np

_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    # Placeholder accuracy path: exact per element (slow); replaced by a vectorised
    # rational approximation in ops work.
    return _erf_scalar(x.astype(np.float64)).astype(np.float64)
