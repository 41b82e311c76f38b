"""Small programs run on local and on global tensors, for the global fast-path tests.

tests/framework/test_global_fast_path.py runs them on one rank and
tests/framework/global_fast_path_check.py on two, comparing the global results (logical
values, SBPs) of the cached, inline path with the uncached instruction path and with the same
program on local tensors, bit for bit. Inputs are small integers in floating point (and
int64 where named), so sums and products are exact in any order: a global result that
differs in one bit is a wrong result, not rounding.

A program takes its input tensors and `where`, the keyword arguments a factory needs to make
a tensor like them (`{}` locally; placement and sbp for global runs), and returns a list of
tensors.
"""

from __future__ import annotations

import numpy as np

import sbpflow as flow

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum


def logical(shape, seed, dtype=np.float32) -> np.ndarray:
    """The same array on every rank (small integers)."""
    return np.random.default_rng(seed).integers(-5, 6, shape).astype(dtype)


def _elementwise(x, y, where):
    return [x + y, x * y, x - y, x * 2.0 + 1.0, (x - y).relu(), -x, x.abs(),
            flow.maximum(x, y), x > y]


def _broadcast(x, v, where):
    return [x + v, x * v, v - x]


def _reduce(x, where):
    return [x.sum(), x.sum(dim=0), x.sum(dim=1, keepdim=True), x.mean(dim=0),
            x.mean(dim=1), x.mean()]


def _matmul(a, b, where):
    return [a @ b, (a @ b).sum(dim=1)]


def _views(x, where):
    # Views, and ops on non-contiguous inputs (a transposed or strided view).
    t = x.T
    return [t, t[1:], x.reshape(6, 4), x.view(2, 12), x[:, 1:5], x.unsqueeze(0),
            t.contiguous(), t + 1.0, x[:, ::2] * 2.0, t.T, x.view(flow.int32)]


def _inplace(x, y, where):
    z = x.clone()
    z.add_(y)
    z.mul_(2.0)
    v = z.T
    v.sub_(1.0)  # a write through a view reaches z
    w = x.clone()
    w[1:3] = 7.0
    return [z, v, w]


def _zero_dim(x, s, where):
    return [s * 2.0, x * s, x.sum() + s, s.relu(), s.reshape(1)]


def _empty(x, y, where):
    return [x + y, x.sum(dim=0), x.T * 2.0, x.reshape(-1)]


def _factories(where):
    return [flow.zeros(4, 3, **where), flow.ones(4, 3, **where) * 3.0,
            flow.arange(12, **where), flow.full((4, 3), 2.5, **where)]


def _positions(x, where):
    # Kernels that read their piece's position in the logical tensor.
    return [x.tril(), x.triu(1), x.cumsum(dim=1)]


def _integers(i, j, where):
    return [i + j, i * 3, i // 2, i % 3, i.sqrt(), i * 0.5]


def _autograd(x, w, where):
    loss = ((x @ w).relu() * 2.0 + x.sum()).sum() + (x.T * 3.0).sum()
    loss.backward()
    return [loss, x.grad, w.grad]


def _random(x, where):
    # Two draws of each: a cached call must draw a fresh seed and offset every time.
    flow.manual_seed(1234)
    out = [flow.rand(4, 6, **where), flow.rand(4, 6, **where), flow.randn(4, 6, **where)]
    out += [flow.nn.functional.dropout(x, 0.5), flow.nn.functional.dropout(x, 0.5)]
    return out


# name -> (input shapes, input dtypes or None for float32, program, needs grad)
PROGRAMS = {
    "elementwise": (((4, 6), (4, 6)), None, _elementwise, False),
    "broadcast": (((4, 6), (6,)), None, _broadcast, False),
    "reduce": (((4, 8),), None, _reduce, False),  # means over 4, 8, 32: exact
    "matmul": (((4, 6), (6, 4)), None, _matmul, False),
    "views": (((4, 6),), None, _views, False),
    "inplace": (((4, 6), (4, 6)), None, _inplace, False),
    "zero_dim": (((4, 6), ()), None, _zero_dim, False),
    "empty": (((0, 6), (0, 6)), None, _empty, False),
    "factories": ((), None, _factories, False),
    "positions": (((4, 6),), None, _positions, False),
    "integers": (((4, 6), (4, 6)), (np.int64, np.int64), _integers, False),
    "autograd": (((4, 6), (6, 4)), None, _autograd, True),
    "random": (((4, 6),), None, _random, False),
}


def sbp_choices(shapes, dtypes=None):
    """The SBP assignments a program is run with: all inputs alike (B, S(0), S(1), P), and a
    few mixes (some of which box). An SBP an input cannot take (a split of a missing axis, P
    of a bool) falls back to B; a program without inputs gets its factories' SBPs."""
    if not shapes:
        return [(B,), (S(0),), (P,)]  # the factories' sbp= (arange is 1-d)
    rows = [(B,) * len(shapes), (S(0),) * len(shapes), (S(1),) * len(shapes),
            (P,) * len(shapes)]
    if len(shapes) == 2:
        rows += [(S(0), B), (B, S(1)), (P, B), (S(1), S(0))]
    out = []
    for row in rows:
        fixed = tuple(B if (isinstance(s, type(S(0))) and s.axis >= len(shape)) else s
                      for s, shape in zip(row, shapes))
        if fixed not in out:
            out.append(fixed)
    return out


def run(name, placement=None, sbps=None):
    """Program `name` on local tensors (placement None) or global ones with `sbps`: its
    outputs as (numpy value, dtype name, shape, stride, sbp or None). (A view of a boxed copy
    has the copy's contiguous strides, not the local view's: compare strides of global runs
    with each other.)"""
    shapes, dtypes, fn, grad = PROGRAMS[name]
    dtypes = dtypes or (np.float32,) * len(shapes)
    ins = []
    for k, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        a = logical(shape, 10 + k, dtype)
        t = flow.tensor(a) if placement is None else flow.tensor(a, placement=placement,
                                                                 sbp=sbps[k])
        ins.append(t.requires_grad_() if grad else t)
    # Factories: like the first input (a program without inputs: the SBP it is run with).
    where = {} if placement is None else {"placement": placement, "sbp": sbps[0]}
    outs = fn(*ins, where)
    return [(o.numpy(), str(o.dtype), tuple(o.shape), o.stride(),
             None if placement is None else o.sbp) for o in outs]
