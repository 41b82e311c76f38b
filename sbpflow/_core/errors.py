"""Errors raised at the op boundary.

Every message names the op, the argument, what was expected and what was given.  The
exception classes are torch's: RuntimeError for shape mismatches, IndexError for
out-of-range dims and indices, TypeError for wrong argument types.
"""

from __future__ import annotations


def op_error(op: str, msg: str, cls: type[Exception] = RuntimeError) -> Exception:
    return cls(f"{op}(): {msg}")


def normalize_dim(op: str, dim: int, ndim: int, arg: str = "dim") -> int:
    """Wrap a possibly negative dim; raise torch's IndexError when out of range."""
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise op_error(op, f"argument '{arg}' must be int, not {type(dim).__name__}", TypeError)
    if dim < lo or dim > hi:
        raise op_error(
            op,
            f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {dim})"
            f" for argument '{arg}'",
            IndexError,
        )
    return dim % ndim if ndim else 0


def normalize_dims(op: str, dims, ndim: int, arg: str = "dim") -> tuple[int, ...]:
    """Normalize an int, a sequence of ints, or None (all dims) into a sorted unique tuple."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(normalize_dim(op, d, ndim, arg) for d in dims)
    if len(set(out)) != len(out):
        raise op_error(op, f"dim {out} appears multiple times in the list of dims")
    return tuple(sorted(out))


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy/torch broadcasting of shapes, with torch's error message."""
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(s, ndim - len(s)):
            if d == out[i] or d == 1:
                continue
            if out[i] == 1:
                out[i] = d
                continue
            raise op_error(
                op,
                f"The size of tensor a ({out[i]}) must match the size of tensor b ({d}) at "
                f"non-singleton dimension {i}; shapes are "
                + ", ".join(str(list(x)) for x in shapes),
            )
    return tuple(out)
