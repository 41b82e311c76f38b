"""Packed sequences and padding helpers (torch.nn.utils.rnn).

A PackedSequence stores a batch of variable-length sequences time step by time step: the rows
of step t are the sequences still running at t (longest first), and `batch_sizes[t]` counts
them.  Packing, padding and unpacking are each one `index_select` of a row map computed on the
host from the lengths (small integer metadata), so they are differentiable and run as one op.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from ..._core import dtype as dt
from ...framework.functional import creation
from ...framework.functional import shape as S
from ...framework.tensor import Tensor

__all__ = [
    "PackedSequence", "invert_permutation", "pack_padded_sequence", "pad_packed_sequence",
    "pad_sequence", "unpad_sequence", "pack_sequence", "unpack_sequence",
]

_PackedSequenceBase = namedtuple(
    "PackedSequence_", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])


def _index(values, device=None) -> Tensor:
    """An int64 index tensor; `device` may be a tensor's `_where()`: for a global tensor,
    its placement, and the index is broadcast there."""
    return creation.tensor(np.asarray(values, dtype=np.int64), dtype=dt.int64, device=device)


def invert_permutation(permutation):
    if permutation is None:
        return None
    perm = np.asarray(permutation.tolist(), dtype=np.int64)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=np.int64)
    return _index(inv, permutation._where())


class PackedSequence(_PackedSequenceBase):
    """Holds the data and the list of `batch_sizes` of a packed sequence; build it with
    `pack_padded_sequence` or `pack_sequence`, not directly."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is not None:
            if batch_sizes._device.type != "cpu":
                raise ValueError(
                    "batch_sizes should always be on CPU. Instances of PackedSequence should "
                    "never be created manually. They should be instantiated by functions like "
                    "pack_sequence and pack_padded_sequences in nn.utils.rnn. "
                    "https://pytorch.org/docs/stable/nn.html#torch.nn.utils.rnn.pack_sequence")
            return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)
        # PackedSequence(data, batch_sizes) written as PackedSequence((data, batch_sizes))
        if not (isinstance(data, (list, tuple)) and len(data) == 2):
            raise TypeError("PackedSequence takes data and batch_sizes")
        return super().__new__(cls, data[0], data[1], sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs):
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        move = {"device": data._device}
        sorted_i = None if self.sorted_indices is None else self.sorted_indices.to(**move)
        unsorted_i = None if self.unsorted_indices is None else self.unsorted_indices.to(**move)
        return type(self)(data, self.batch_sizes, sorted_i, unsorted_i)

    def cpu(self, *args, **kwargs):
        return self.to(*args, device="cpu", **kwargs)

    def double(self):
        return self.to(dtype=dt.float64)

    def float(self):
        return self.to(dtype=dt.float32)

    def half(self):
        return self.to(dtype=dt.float16)

    def bfloat16(self):
        return self.to(dtype=dt.bfloat16)

    def long(self):
        return self.to(dtype=dt.int64)

    def int(self):
        return self.to(dtype=dt.int32)

    @property
    def is_cuda(self) -> bool:
        return self.data._device.type == "cuda"

    def is_pinned(self) -> bool:
        return False


def _lengths_list(lengths) -> list[int]:
    if isinstance(lengths, Tensor):
        if lengths.ndim != 1:
            raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got "
                               f"{lengths.ndim}D {lengths.dtype} tensor")
        return [int(v) for v in lengths.tolist()]
    return [int(v) for v in lengths]


def _batch_sizes(sorted_lengths: list[int]) -> np.ndarray:
    lens = np.asarray(sorted_lengths, dtype=np.int64)
    steps = np.arange(int(lens[0]) if lens.size else 0)
    return (lens[None, :] > steps[:, None]).sum(axis=1).astype(np.int64)


def pack_padded_sequence(input, lengths, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch [T, B, *] ([B, T, *] with batch_first) of sequences of `lengths`."""
    lens = _lengths_list(lengths)
    batch_dim = 0 if batch_first else 1
    sorted_indices = None
    if not enforce_sorted:
        order = np.argsort(-np.asarray(lens, dtype=np.int64), kind="stable")
        lens = [lens[i] for i in order]
        sorted_indices = _index(order, input._where())
        input = input.index_select(batch_dim, sorted_indices)
    if batch_first:
        input = S.transpose(input, 0, 1)
    steps, batch = input.shape[0], input.shape[1]
    if len(lens) != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got "
                           f"{len(lens)} (batch_size={batch})")
    if any(n <= 0 for n in lens):
        raise RuntimeError("Length of all samples has to be greater than 0, but found an "
                           "element in 'lengths' that is <= 0")
    if any(a < b for a, b in zip(lens, lens[1:])):
        raise RuntimeError(
            "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
            "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence "
            "to sidestep this requirement if you do not need ONNX exportability.")
    if lens[0] > steps:
        raise RuntimeError(f"pack_padded_sequence: a length of {lens[0]} is longer than the "
                           f"input's {steps} time steps")
    sizes = _batch_sizes(lens)
    rows = np.concatenate([t * batch + np.arange(n) for t, n in enumerate(sizes)])
    flat = S.reshape(input, (steps * batch,) + tuple(input.shape[2:]))
    data = flat.index_select(0, _index(rows, input._where()))
    return PackedSequence(data, _index(sizes), sorted_indices, None)


def _packed_rows(sizes: np.ndarray, steps: int, n_rows: int) -> np.ndarray:
    """For each position t * B + b of a padded [steps, B] layout, the packed row holding it,
    or n_rows (the padding row) where sequence b has ended."""
    batch = int(sizes[0])
    where = np.full((steps, batch), n_rows, dtype=np.int64)
    offset = 0
    for t, n in enumerate(sizes):
        where[t, :n] = offset + np.arange(n)
        offset += int(n)
    return where.reshape(-1)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0, total_length=None):
    """Inverse of pack_padded_sequence: (padded [T, B, *], lengths int64 tensor)."""
    data, batch_sizes, _, unsorted = sequence
    sizes = np.asarray(batch_sizes.tolist(), dtype=np.int64)
    max_len = int(sizes.size)
    if total_length is not None:
        if total_length < max_len:
            raise ValueError(f"Expected total_length to be at least the length of the longest "
                             f"sequence in input, but got total_length={total_length} and max "
                             f"sequence length being {max_len}")
        steps = int(total_length)
    else:
        steps = max_len
    batch = int(sizes[0])
    rest = tuple(data.shape[1:])
    pad = creation.full((1,) + rest, padding_value, dtype=data.dtype, device=data._where())
    rows = _packed_rows(sizes, max_len, data.shape[0])
    if steps > max_len:
        rows = np.concatenate([rows, np.full((steps - max_len) * batch, data.shape[0])])
    padded = S.cat([data, pad], 0).index_select(0, _index(rows, data._where()))
    padded = S.reshape(padded, (steps, batch) + rest)
    lengths = (sizes[None, :] > np.arange(batch)[:, None]).sum(axis=1).astype(np.int64)
    if unsorted is not None:
        padded = padded.index_select(1, unsorted)
        lengths = lengths[np.asarray(unsorted.tolist(), dtype=np.int64)]
    if batch_first:
        padded = S.transpose(padded, 0, 1)
    return padded, _index(lengths)


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack sequences [L_i, *] into [max L, B, *] ([B, max L, *] with batch_first)."""
    if padding_side not in ("left", "right"):
        raise RuntimeError(f"Expected padding_side to be one of left or right, but got "
                         f"{padding_side}.")
    if isinstance(sequences, Tensor):
        sequences = S.unbind(sequences, 0)
    sequences = list(sequences)
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    rest = tuple(sequences[0].shape[1:])
    for s in sequences:
        if tuple(s.shape[1:]) != rest:
            raise RuntimeError(f"The size of tensor a ({rest[0] if rest else 0}) must match "
                               f"the size of tensor b ({s.shape[1] if s.ndim > 1 else 0}) at "
                               f"non-singleton dimension 1")
    lens = np.asarray([s.shape[0] for s in sequences], dtype=np.int64)
    steps, batch = int(lens.max()), len(sequences)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    n_rows = int(lens.sum())
    t = np.arange(steps)[:, None]
    shift = 0 if padding_side == "right" else (steps - lens)[None, :]
    pos = t - shift  # the row of sequence b at padded step t, when 0 <= pos < len
    valid = (pos >= 0) & (pos < lens[None, :])
    rows = np.where(valid, starts[None, :] + pos, n_rows).reshape(-1)
    first = sequences[0]
    pad = creation.full((1,) + rest, padding_value, dtype=first.dtype, device=first._where())
    out = S.cat(sequences + [pad], 0).index_select(0, _index(rows, first._where()))
    out = S.reshape(out, (steps, batch) + rest)
    return S.transpose(out, 0, 1) if batch_first else out


def unpad_sequence(padded_sequences, lengths, batch_first: bool = False) -> list:
    """Split a padded batch back into a list of sequences of `lengths`."""
    if not batch_first:
        padded_sequences = S.transpose(padded_sequences, 0, 1)
    return [S.narrow(padded_sequences[i], 0, 0, n)
            for i, n in enumerate(_lengths_list(lengths))]


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of sequences [L_i, *] (longest first unless enforce_sorted is False)."""
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths,
                                enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list:
    """Inverse of pack_sequence: the list of sequences, in their original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
