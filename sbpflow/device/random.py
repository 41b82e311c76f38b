"""Counter-based random numbers (Philox 4x64).

Every logical random tensor is a pure function of (seed, offset, logical index): element `e`
uses 64-bit words `offset + k*e .. offset + k*e + k-1` of the Philox stream for `seed`.  So a
rank can draw just its piece of a global tensor, and any split of the same logical tensor gives
the same values.  Words come in blocks of 4 per counter step; we advance to the block that holds
the first word we need and discard the leading remainder.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_WORDS_PER_BLOCK = 4


def words(seed: int, start: int, count: int) -> np.ndarray:
    """`count` consecutive uint64 words of the stream `seed`, starting at word `start`."""
    bg = np.random.Philox(key=seed & (2**64 - 1))
    block, skip = divmod(start, _WORDS_PER_BLOCK)
    if block:
        bg.advance(block)
    raw = bg.random_raw(count + skip)
    return raw[skip:] if skip else raw


def mantissa_bits(dtype=None) -> int:
    """Bits of a uniform draw that `dtype` holds exactly (its significand, hidden bit included);
    53 for float64, non-float dtypes and None."""
    np_dtype = None if dtype is None else np.dtype(getattr(dtype, "np", dtype))
    if np_dtype is None or not (np_dtype.kind == "f" or np_dtype == ml_dtypes.bfloat16):
        return 53
    return min(int(ml_dtypes.finfo(np_dtype).nmant) + 1, 53)


def uniform_from_words(w: np.ndarray, dtype=None) -> np.ndarray:
    """Map uint64 words to float64 in [0, 1) using their top bits.

    With a `dtype`, only as many bits as its significand holds are kept, so every value is exact
    in that dtype and the cast cannot round up to 1.0 (a float32 draw from 53 bits would, about
    once in 2**25 draws).
    """
    bits = mantissa_bits(dtype)
    return (w >> np.uint64(64 - bits)).astype(np.float64) * (1.0 / float(1 << bits))


def words_for_piece(seed, offset, logical_shape, piece_slices, words_per_elem=1):
    """The words for a rectangular piece of a logical tensor, shaped (*piece_shape, k).

    The piece is given as one slice per axis.  Contiguous runs along the last axes are drawn in
    one call each, so a split along axis 0 costs one call.
    """
    shape = tuple(logical_shape)
    k = words_per_elem
    if not shape:
        return words(seed, offset, k).reshape(k)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    ranges = [range(*s.indices(n)) for s, n in zip(piece_slices, shape, strict=True)]
    piece_shape = tuple(len(r) for r in ranges)
    # Find the longest suffix of axes the piece covers fully: those form contiguous runs.
    run_axis = len(shape)
    while run_axis > 0 and len(ranges[run_axis - 1]) == shape[run_axis - 1]:
        run_axis -= 1
    if run_axis == 0:
        return words(seed, offset, k * strides[0] * shape[0] if shape else k).reshape(
            *piece_shape, k
        )
    run_axis -= 1  # the axis whose sub-range is contiguous together with the full tail
    r = ranges[run_axis]
    run_len = len(r) * strides[run_axis]
    out = np.empty((int(np.prod(piece_shape[:run_axis], dtype=np.int64)), run_len * k), np.uint64)
    for j, idx in enumerate(np.ndindex(*piece_shape[:run_axis])):
        base = sum(ranges[a][i] * strides[a] for a, i in enumerate(idx))
        base += r.start * strides[run_axis]
        out[j] = words(seed, offset + base * k, run_len * k)
    return out.reshape(*piece_shape, k)
