"""torch.linalg for sbpflow: decompositions, solves, determinants, norms, pinv, lstsq, ...

The functions live in `framework/functional/linalg.py` (named `linalg_<name>` there); the ones
deliberately left out (complex results, LU) raise NotImplementedError saying so.
"""

from .framework.functional.linalg import LINALG as _LINALG

globals().update(_LINALG)

__all__ = sorted(_LINALG)
