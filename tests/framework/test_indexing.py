"""Indexing, views and shape functions against torch 2.13.

Each case runs the same program on torch and on sbpflow and compares values, gradients (via
backward with a random cotangent), whether the result is a view, writes through views showing
in the base, version counters, and the exception type and message of bad input.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import sbpflow as flow
from sbpflow.framework.functional.shape import compute_stride


def _F(lib):
    return TF if lib is torch else flow.nn.functional


def _data(shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _pair(a, requires_grad=False):
    f = flow.tensor(a)
    t = torch.tensor(a)
    if requires_grad:
        f.requires_grad_()
        t.requires_grad_()
    return f, t


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x.detach()._host())


def _same(f, t, what=""):
    assert tuple(f.shape) == tuple(t.shape), f"{what}: shape {tuple(f.shape)} != {tuple(t.shape)}"
    assert f.dtype.name == str(t.dtype).replace("torch.", ""), f"{what}: dtype"
    np.testing.assert_allclose(_np(f), _np(t), rtol=1e-12, atol=1e-12, err_msg=what)


def _same_layout(f, t, what=""):
    """Equal strides (on axes longer than 1: others are arbitrary) and storage offsets."""
    big = [i for i, n in enumerate(t.shape) if n > 1]
    assert [f.stride(i) for i in big] == [t.stride(i) for i in big], (
        f"{what}: strides {f.stride()} != {t.stride()}")
    if t.numel():
        assert f.storage_offset() == t.storage_offset(), f"{what}: storage offset"


def _is_view(x) -> bool:
    return x._base is not None


# -- __getitem__ ---------------------------------------------------------------------------
# Keys are built per library, so tensor indices are that library's tensors.
GET_KEYS = {
    "int": lambda L: 1,
    "neg_int": lambda L: -2,
    "int_int": lambda L: (1, 2),
    "slice": lambda L: slice(1, 3),
    "slice_step": lambda L: (slice(None), slice(None, None, 2)),
    "slice_clamped": lambda L: (slice(-100, 100), slice(1, 100)),
    "empty_slice": lambda L: slice(3, 1),
    "ellipsis_int": lambda L: (Ellipsis, 0),
    "none_front": lambda L: (None, 1),
    "none_middle": lambda L: (slice(None), None, 0),
    "ellipsis_none": lambda L: (Ellipsis, None),
    "all_ints": lambda L: (1, 2, 3),
    "ellipsis_only": lambda L: Ellipsis,
    "empty_tuple": lambda L: (),
    "zero_d_int_tensor": lambda L: L.tensor(2),
    "list": lambda L: [0, 2, 2, -1],
    "long_tensor": lambda L: L.tensor([[0, 1], [2, 0]]),
    "int32_tensor": lambda L: L.tensor([1, 0], dtype=L.int32),
    "two_lists": lambda L: ([0, 1], [3, 2]),
    "broadcast_lists": lambda L: ([[0], [2]], [1, 3]),
    "int_then_list": lambda L: (0, slice(None), [0, 3]),
    "separated_lists": lambda L: ([0, 1], slice(None), [1, 3]),
    "adjacent_after_slice": lambda L: (slice(None), [0, 2], [1, 3]),
    "none_between_lists": lambda L: (None, [1, 0], None, [1, 2]),
    "slice_then_list": lambda L: (slice(1, 3), [3, 0]),
    "ellipsis_list": lambda L: (Ellipsis, [0, 3]),
    "bool_mask_1d": lambda L: L.tensor([True, False, True]),
    "bool_mask_2d": lambda L: L.tensor([[True, False, True, False]] * 3),
    "mask_after_slice": lambda L: (slice(None), L.tensor([False, True, True, False])),
    "bool_list": lambda L: [True, False, True],
    "python_true": lambda L: True,
    "python_false": lambda L: False,
    "zero_d_bool": lambda L: L.tensor(True),
    "empty_list": lambda L: [],
    "list_as_tuple": lambda L: [0, slice(None)],
    "numpy_index": lambda L: (slice(None), np.array([2, 0])),
    "float_list_truncates": lambda L: [1.7, 0.2],
    "later_ellipses_are_empty": lambda L: (Ellipsis, 0, Ellipsis),
    "ellipsis_none_ellipsis": lambda L: (Ellipsis, None, Ellipsis),
    "range_and_tensor": lambda L: (range(3), L.tensor([0, 2, 1])),  # Forward-Forward's
    "range_only": lambda L: range(1, 3),
    "range_after_slice": lambda L: (slice(None), range(0, 4, 2)),
    "whole_slice": lambda L: slice(None),
    "whole_bounds_bare": lambda L: slice(0, 3),
    "whole_bounds_in_tuple": lambda L: (slice(None), slice(0, 4)),
    "slice_then_whole": lambda L: (slice(1, 3), slice(None)),
    "int_then_whole": lambda L: (0, slice(None), slice(0, 5)),
    "none_then_whole": lambda L: (None, slice(None)),
}


@pytest.mark.parametrize("name", list(GET_KEYS))
def test_getitem_matches_torch(name):
    a = _data((3, 4, 5), seed=1)
    xf, xt = _pair(a, requires_grad=True)
    make = GET_KEYS[name]
    yf, yt = xf[make(flow)], xt[make(torch)]
    _same(yf, yt, name)
    # torch's node names: x[0] selects, x[1:] slices, x[None] unsqueezes, x[[0]] indexes
    assert yf.grad_fn.name() == yt.grad_fn.name(), (name, yf.grad_fn, yt.grad_fn)
    assert _is_view(yf) == _is_view(yt), f"{name}: view {_is_view(yf)} vs torch {_is_view(yt)}"
    if _is_view(yt):
        _same_layout(yf, yt, name)
    cot = _data(tuple(yt.shape), seed=2)
    yf.backward(flow.tensor(cot))
    yt.backward(torch.tensor(cot))
    _same(xf.grad, xt.grad, f"{name} grad")


def test_getitem_zero_dim_tensor():
    f, t = _pair(np.asarray(2.5))
    for key in (None, Ellipsis, (), True, False, (None, None)):
        _same(f[key], t[key], repr(key))


def test_getitem_int_tensor_and_uint8_mask():
    a = _data((4, 3), seed=3)
    f, t = _pair(a)
    idx = np.array([3, 0, 3])
    _same(f[flow.tensor(idx, dtype=flow.int32)], t[torch.tensor(idx, dtype=torch.int32)])
    mask = np.array([1, 0, 1, 1], dtype=np.uint8)
    with pytest.warns(UserWarning):
        expected = t[torch.tensor(mask)]
    _same(f[flow.tensor(mask)], expected)


def test_getitem_gradient_accumulates_repeated_indices():
    xf, xt = _pair(_data((4,), seed=4), requires_grad=True)
    (xf[[0, 0, 3, 0]] * flow.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    (xt[[0, 0, 3, 0]] * torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)).sum().backward()
    _same(xf.grad, xt.grad)


def test_getitem_double_backward():
    xf, xt = _pair(_data((3, 4), seed=5), requires_grad=True)
    for x, lib in ((xf, flow), (xt, torch)):
        y = (x[[0, 2], 1:] ** 2).sum()
        (g,) = lib.autograd.grad(y, x, create_graph=True)
        (g * g).sum().backward()
    _same(xf.grad, xt.grad)


def test_iteration_yields_views_of_rows():
    f, t = _pair(_data((3, 2), seed=6))
    rows = list(f)
    assert len(rows) == 3 and all(_is_view(r) for r in rows)
    for rf, rt in zip(rows, t, strict=True):
        _same(rf, rt)


# -- __setitem__ ---------------------------------------------------------------------------
SET_CASES = {
    "int_scalar": (lambda L: 1, lambda L: 7.5),
    "slice_tensor": (lambda L: (slice(None), 1), lambda L: L.tensor([1.0, 2.0, 3.0, 4.0, 5.0],
                                                                     dtype=L.float64)),
    "broadcast_row": (lambda L: slice(0, 2), lambda L: L.tensor([1.0, 2.0, 3.0, 4.0, 5.0],
                                                                dtype=L.float64)),
    "leading_ones_stripped": (lambda L: 0, lambda L: L.ones(1, 1, 4, 5, dtype=L.float64)),
    "ellipsis": (lambda L: Ellipsis, lambda L: 2),
    "none_key": (lambda L: (None, 0, 1), lambda L: L.tensor([9.0] * 5, dtype=L.float64)),
    "step_slice": (lambda L: (slice(None), slice(None), slice(None, None, 2)), lambda L: -1.0),
    "cast_from_float32": (lambda L: 2, lambda L: L.ones(4, 5)),
    "cast_from_int": (lambda L: (0, 0), lambda L: L.tensor([1, 2, 3, 4, 5])),
    "list_index": (lambda L: [0, 2], lambda L: 3.0),
    "list_index_tensor": (lambda L: ([0, 2], [1, 3]),
                          lambda L: L.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]], dtype=L.float64)),
    "mixed_int_list": (lambda L: (1, slice(None), [0, 4]), lambda L: L.tensor([5.0, 6.0],
                                                                            dtype=L.float64)),
    "bool_mask": (lambda L: L.tensor([True, False, True]), lambda L: 0.5),
    "bool_mask_3d": (lambda L: L.tensor(_data((3, 4, 5), seed=7) > 0), lambda L: -3.0),
    "mask_value_tensor": (lambda L: (slice(None), L.tensor([True, False, False, True])),
                          lambda L: L.tensor([[1.0], [2.0]], dtype=L.float64)),
    "python_true": (lambda L: True, lambda L: 4.0),
    "negative_index_list": (lambda L: [-1], lambda L: 8.0),
    "range_and_tensor": (lambda L: (range(3), L.tensor([0, 2, 1])), lambda L: 1.0),
    "range_values": (lambda L: (range(3), 1), lambda L: L.tensor([[1.0] * 5] * 3,
                                                                  dtype=L.float64)),
}


@pytest.mark.parametrize("name", list(SET_CASES))
def test_setitem_matches_torch(name):
    make_key, make_value = SET_CASES[name]
    a = _data((3, 4, 5), seed=8)
    f, t = _pair(a)
    f[make_key(flow)] = make_value(flow)
    t[make_key(torch)] = make_value(torch)
    _same(f, t, name)
    assert f._version == t._version == 1


def test_setitem_casts_values_into_integer_tensors():
    f = flow.zeros(4, dtype=flow.int64)
    t = torch.zeros(4, dtype=torch.int64)
    for x in (f, t):
        x[0] = 1.7
        x[[1, 2]] = 5
        x[3:] = True
    assert f.tolist() == t.tolist()


@pytest.mark.parametrize("name", list(SET_CASES))
def test_setitem_gradients_match_torch(name):
    make_key, make_value = SET_CASES[name]
    a = _data((3, 4, 5), seed=9)
    results = []
    for lib in (flow, torch):
        x = lib.tensor(a, requires_grad=True)
        y = x * 2  # a non-leaf, so it may be written in place
        value = make_value(lib)
        if isinstance(value, (flow.Tensor, torch.Tensor)) and value.dtype == lib.float64:
            value = value.clone().requires_grad_()
        y[make_key(lib)] = value
        (y * lib.tensor(_data((3, 4, 5), seed=10))).sum().backward()
        vgrad = value.grad if isinstance(value, (flow.Tensor, torch.Tensor)) else None
        results.append((x.grad, vgrad, y))
    (xg_f, vg_f, y_f), (xg_t, vg_t, y_t) = results
    _same(y_f.detach(), y_t.detach(), f"{name} value")
    _same(xg_f, xg_t, f"{name} grad of base")
    assert (vg_f is None) == (vg_t is None)
    if vg_t is not None:
        _same(vg_f, vg_t, f"{name} grad of value")


def test_setitem_through_a_view_writes_the_base():
    f, t = _pair(_data((3, 4), seed=11))
    vf, vt = f[1:], t[1:]
    vf[0, [1, 3]] = 100.0
    vt[0, [1, 3]] = 100.0
    vf[1] = -1.0
    vt[1] = -1.0
    _same(f, t)
    assert f._version == vf._version == t._version == 2


def test_setitem_through_view_of_requires_grad_base():
    a = _data((3, 4), seed=12)
    out = []
    for lib in (flow, torch):
        x = lib.tensor(a, requires_grad=True)
        v = lib.tensor([1.5, 2.5], dtype=lib.float64, requires_grad=True)
        y = x * 3  # mul saves its inputs, not y, so y may be written
        row = y[2]  # a view of y
        row[[0, 3]] = v
        (y * y).sum().backward()
        out.append((x.grad, v.grad))
    _same(out[0][0], out[1][0], "base grad")
    _same(out[0][1], out[1][1], "value grad")


def test_augmented_assignment_with_advanced_key():
    f, t = _pair(_data((4, 2), seed=13))
    f[[0, 2]] += 1
    t[[0, 2]] += 1
    _same(f, t)
    assert f._version == t._version == 1


def test_setitem_on_leaf_requiring_grad_raises_like_torch():
    for key in (0, [0]):
        f = flow.zeros(3, requires_grad=True)
        t = torch.zeros(3, requires_grad=True)
        with pytest.raises(RuntimeError) as theirs:
            t[key] = 1.0
        with pytest.raises(RuntimeError) as ours:
            f[key] = 1.0
        assert str(ours.value) == str(theirs.value)


def test_saved_tensor_modified_by_setitem_is_detected():
    x = flow.tensor(_data((3,), seed=14), requires_grad=True)
    y = x * 1
    z = y * y  # saves y
    y[0] = 5.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


# -- index_put -----------------------------------------------------------------------------
def test_index_put_matches_torch():
    a = _data((4, 3), seed=15)
    for accumulate in (False, True):
        f, t = _pair(a, requires_grad=True)
        vf, vt = _pair(_data((3,), seed=16), requires_grad=True)
        idx = [[0, 3, 0 if accumulate else 1]]
        rf = f.index_put((flow.tensor(idx[0]),), vf, accumulate=accumulate)
        rt = t.index_put((torch.tensor(idx[0]),), vt, accumulate=accumulate)
        _same(rf, rt)
        cot = _data((4, 3), seed=17)
        rf.backward(flow.tensor(cot))
        rt.backward(torch.tensor(cot))
        _same(f.grad, t.grad)
        _same(vf.grad, vt.grad)


def test_index_put_inplace_with_mask_and_bumps_version():
    f, t = _pair(_data((2, 3), seed=18))
    mask = [[True, False, True], [False, False, True]]
    f.index_put_((flow.tensor(mask),), flow.tensor(1.0, dtype=flow.float64))
    t.index_put_((torch.tensor(mask),), torch.tensor(1.0, dtype=torch.float64))
    _same(f, t)
    assert f._version == t._version == 1


# -- views ---------------------------------------------------------------------------------
VIEW_PROGRAMS = {
    "flatten": lambda x: x.flatten(),
    "flatten_mid": lambda x: x.flatten(1, 2),
    "flatten_same": lambda x: x.flatten(1, 1),
    "unflatten": lambda x: x.unflatten(2, (2, -1)),
    "squeeze_all": lambda x: x[:, :1].squeeze(),
    "squeeze_dims": lambda x: x[:, :1, None].squeeze((1, 2)),
    "squeeze_noop": lambda x: x.squeeze(0),
    "unsqueeze": lambda x: x.unsqueeze(-1),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "narrow_tensor_start": lambda lib_x: lib_x.narrow(2, -3, 2),
    "select": lambda x: x.select(2, -1),
    "movedim": lambda x: x.movedim((0, 1), (2, 0)),
    "moveaxis": lambda x: x.moveaxis(0, -1),
    "swapaxes": lambda x: x.swapaxes(0, 2),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_last": lambda x: x.diagonal(1, -2, -1),
    "diagonal_transposed": lambda x: x.transpose(1, 2).diagonal(-1, 1, 2),
    "t_of_matrix": lambda x: x[0].t(),
    "reshape_merges_strided": lambda x: x[:, :, ::2].reshape(6, 2),
    "reshape_splits_axis": lambda x: x.permute(1, 0, 2).reshape(3, 2, 2, 2),
}


def _base_tensor():
    return torch.arange(24.0, dtype=torch.float64).reshape(2, 3, 4)


@pytest.mark.parametrize("name", list(VIEW_PROGRAMS))
def test_view_functions_match_torch_and_share_memory(name):
    t = _base_tensor()
    f = flow.tensor(t.numpy())
    prog = VIEW_PROGRAMS[name]
    vt, vf = prog(t), prog(f)
    _same(vf, vt, name)
    _same_layout(vf, vt, name)
    vt.mul_(-2)
    vf.mul_(-2)
    _same(f, t, f"{name}: write through the view")
    assert f._version == t._version


@pytest.mark.parametrize("name", list(VIEW_PROGRAMS))
def test_view_function_gradients_match_torch(name):
    a = _base_tensor().numpy()
    f, t = _pair(a, requires_grad=True)
    prog = VIEW_PROGRAMS[name]
    vt, vf = prog(t), prog(f)
    cot = _data(tuple(vt.shape), seed=19)
    vf.backward(flow.tensor(cot))
    vt.backward(torch.tensor(cot))
    _same(f.grad, t.grad, name)


def test_flatten_returns_input_when_nothing_merges():
    f = flow.ones(2, 3)
    assert f.flatten(1, 1) is f and f.flatten(-1) is f


def test_reshape_copies_only_when_strides_forbid_a_view():
    t = _base_tensor()
    f = flow.tensor(t.numpy())
    cases = [
        (lambda x: x.transpose(0, 2).reshape(24), False),  # transposed: must copy
        (lambda x: x.transpose(0, 1).reshape(3, 8), False),  # rows of 4 are 12 apart
        (lambda x: x.permute(1, 0, 2).reshape(3, 2, 2, 2), True),  # splits an axis
        (lambda x: x[:, :, ::2].reshape(6, 2), True),  # a strided axis kept whole
        (lambda x: x[:, :2].reshape(16), False),  # a gap between rows
        (lambda x: x.flatten(), True),
        (lambda x: x.transpose(1, 2).flatten(1), False),
        (lambda x: x[None].expand(2, 2, 3, 4).reshape(4, 12), False),
        (lambda x: x[None].expand(2, 2, 3, 4).reshape(2, 2, 12), True),
    ]
    for prog, view in cases:
        rt, rf = prog(t), prog(f)
        _same(rf, rt)
        assert (rt.data_ptr() == t.data_ptr() or _is_view(rt)) == view
        assert _is_view(rf) == view
        if view:
            _same_layout(rf, rt)


@pytest.mark.parametrize("seed", range(40))
def test_compute_stride_agrees_with_torch_view(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(1, 4, size=rng.integers(1, 5)))
    base = torch.zeros(shape)
    perm = tuple(int(i) for i in rng.permutation(len(shape)))
    x = base.permute(perm)
    if rng.random() < 0.5 and x.shape[0] > 1:
        x = x[: x.shape[0] - 1]
    numel = x.numel()
    factors = [d for d in range(1, numel + 1) if numel % d == 0]
    first = int(rng.choice(factors))
    for new in ((numel,), (first, numel // first), tuple(x.shape) + (1,)):
        try:
            expected = x.view(new).stride()
        except RuntimeError:
            expected = None
        got = compute_stride(tuple(x.shape), x.stride(), new)
        if expected is None:
            assert got is None, (tuple(x.shape), x.stride(), new)
        else:
            assert got is not None
            sizes_above_one = [i for i, n in enumerate(new) if n > 1]
            assert [got[i] for i in sizes_above_one] == [expected[i] for i in sizes_above_one]


SPLIT_PROGRAMS = {
    "split_int": lambda x: x.split(2, 1),
    "split_sizes": lambda x: x.split([1, 3], -1),
    "split_empty_axis": lambda x: x[:, :0].split(2, 1),
    "chunk": lambda x: x.chunk(2, 2),
    "chunk_uneven": lambda x: x.chunk(4, 1),
    "chunk_empty_axis": lambda x: x[:0].chunk(3),
    "tensor_split_sections": lambda x: x.tensor_split(3, 2),
    "tensor_split_indices": lambda x: x.tensor_split([1, 4, 2, 7], 2),
    "tensor_split_negative": lambda x: x.tensor_split([-1], 1),
    "unbind": lambda x: x.unbind(1),
}


@pytest.mark.parametrize("name", list(SPLIT_PROGRAMS))
def test_split_functions_return_views_and_gradients(name):
    a = _base_tensor().numpy()
    f, t = _pair(a, requires_grad=True)
    prog = SPLIT_PROGRAMS[name]
    pf, pt = prog(f), prog(t)
    assert len(pf) == len(pt)
    total_f, total_t = 0, 0
    for k, (xf, xt) in enumerate(zip(pf, pt, strict=True)):
        _same(xf, xt, f"{name} piece {k}")
        assert _is_view(xf)
        cot = _data(tuple(xt.shape), seed=20 + k)
        total_f = total_f + (xf * flow.tensor(cot)).sum()
        total_t = total_t + (xt * torch.tensor(cot)).sum()
    if pt and any(p.numel() for p in pt):
        total_f.backward()
        total_t.backward()
        _same(f.grad, t.grad, f"{name} grad")


# -- copies: cat, stack, flip, roll, tril, pad, repeat --------------------------------------
def _grad_check(program, shapes, seed=30, dtypes=None):
    """Run program on torch and sbpflow inputs; compare outputs and input gradients."""
    arrays = [_data(s, seed=seed + i) for i, s in enumerate(shapes)]
    if dtypes:
        arrays = [a.astype(d) for a, d in zip(arrays, dtypes, strict=True)]
    fs = [flow.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    ts = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    of, ot = program(flow, *fs), program(torch, *ts)
    _same(of, ot, "output")
    if ot.requires_grad:
        cot = _data(tuple(ot.shape), seed=seed + 99)
        of.backward(flow.tensor(cot, dtype=of.dtype))
        ot.backward(torch.tensor(cot, dtype=ot.dtype))
        for k, (a, b) in enumerate(zip(fs, ts, strict=True)):
            if b.grad is not None:
                np.testing.assert_allclose(_np(a.grad), _np(b.grad), rtol=1e-5, atol=1e-6,
                                           err_msg=f"grad {k}")


COPY_PROGRAMS = {
    "cat_dim1": (lambda L, a, b: L.cat([a, b], dim=1), [(2, 3), (2, 4)], None),
    "cat_promotes": (lambda L, a, b: L.cat((a, b)), [(2, 3), (1, 3)], [np.float32, np.float64]),
    "cat_int_float": (lambda L, a, b: L.cat([a, b]), [(2, 3), (1, 3)], [np.int32, np.float32]),
    "cat_legacy_empty": (lambda L, a, b: L.cat([a, b[:0].reshape(0)]), [(2, 3), (2,)], None),
    "stack": (lambda L, a, b: L.stack([a, b], -1), [(2, 3), (2, 3)], None),
    "flip": (lambda L, a: L.flip(a, (0, 2)), [(2, 3, 4)], None),
    "fliplr": (lambda L, a: L.fliplr(a), [(2, 3)], None),
    "roll_flat": (lambda L, a: L.roll(a, 5), [(2, 3, 4)], None),
    "roll_dims": (lambda L, a: L.roll(a, (1, -2), (0, 2)), [(2, 3, 4)], None),
    "tril": (lambda L, a: L.tril(a, -1), [(2, 3, 4)], None),
    "triu": (lambda L, a: a.triu(1), [(4, 3)], None),
    "pad_constant": (lambda L, a: _F(L).pad(
        a, (1, 2, -1, 1), value=0.5), [(2, 3, 4)], None),
    "pad_reflect": (lambda L, a: _F(L).pad(
        a, (2, 1, 1, 2), mode="reflect"), [(2, 3, 4)], None),
    "pad_replicate": (lambda L, a: _F(L).pad(
        a, (3, -1), mode="replicate"), [(2, 3, 4)], None),
    "pad_circular": (lambda L, a: _F(L).pad(
        a, (-1, 2, 2, 1), mode="circular"), [(1, 2, 3, 4)], None),
    "repeat": (lambda L, a: a.repeat(2, 1, 3), [(2, 3)], None),
    "repeat_interleave_int": (lambda L, a: a.repeat_interleave(2, dim=1), [(2, 3)], None),
    "repeat_interleave_flat": (lambda L, a: L.repeat_interleave(a, 3), [(2, 2)], None),
    "repeat_interleave_tensor": (lambda L, a: a.repeat_interleave(L.tensor([1, 0, 2]), dim=1),
                                 [(2, 3)], None),
    "diagonal_copy": (lambda L, a: L.diagonal_copy(a, 1, 0, 2), [(3, 2, 4)], None),
    "diagonal_of_noncontiguous": (lambda L, a: a.diagonal(0, 0, 2), [(3, 2, 4)], None),
}


@pytest.mark.parametrize("name", list(COPY_PROGRAMS))
def test_copy_functions_match_torch(name):
    program, shapes, dtypes = COPY_PROGRAMS[name]
    _grad_check(program, shapes, dtypes=dtypes)


def test_pad_is_reexported_by_nn_functional():
    x = flow.ones(2, 3)
    assert flow.nn.functional.pad is flow.pad
    assert flow.nn.functional.pad(x, (1, 1)).shape == (2, 5)


def test_repeat_interleave_of_counts():
    counts = [2, 0, 3]
    assert flow.repeat_interleave(flow.tensor(counts)).tolist() == torch.repeat_interleave(
        torch.tensor(counts)).tolist()


# -- gather / scatter / index_select / index_add / masks ------------------------------------
INDEX_PROGRAMS = {
    "gather": (lambda L, x: L.gather(x, 1, L.tensor([[0, 3, 3], [2, 1, 0], [1, 1, 1]])),
               (3, 4)),
    "gather_method": (lambda L, x: x.gather(0, L.tensor([[1, 0, 2, 2]])), (3, 4)),
    "take_along_dim": (lambda L, x: L.take_along_dim(x, L.tensor([[0], [3], [1]]), 1), (3, 4)),
    "take_along_dim_broadcast": (lambda L, x: L.take_along_dim(x, L.tensor([[0, 2]]), 1),
                                 (3, 4)),
    "take_along_dim_flat": (lambda L, x: L.take_along_dim(x, L.tensor([11, 0, 5])), (3, 4)),
    "take": (lambda L, x: L.take(x, L.tensor([[11, 0], [5, 5]])), (3, 4)),
    "scatter": (lambda L, x: L.scatter(x, 1, L.tensor([[0, 2], [3, 1], [1, 0]]),
                                       x[:, :2] * 3), (3, 4)),
    "scatter_value": (lambda L, x: x.scatter(0, L.tensor([[2, 0, 1, 1]]), 9.5), (3, 4)),
    "scatter_add": (lambda L, x: L.scatter_add(x, 0, L.tensor([[2, 2, 1, 0], [2, 2, 2, 2]]),
                                               x[:2] ** 2), (3, 4)),
    "scatter_add_empty_index": (lambda L, x: L.scatter_add(
        x, 1, L.zeros(3, 0, dtype=L.int64), x[:, :0]), (3, 4)),
    "scatter_add_empty_index_1d": (lambda L, x: x[0].scatter_add(
        0, L.zeros(0, dtype=L.int64), x[0, :0]) * 2, (3, 4)),
    "scatter_empty_index": (lambda L, x: x.scatter(0, L.zeros(0, 4, dtype=L.int64), 9.5),
                            (3, 4)),
    "index_select": (lambda L, x: L.index_select(x, 1, L.tensor([3, 3, 0])), (3, 4)),
    "index_add": (lambda L, x: x.index_add(0, L.tensor([2, 0, 2]), x * 2, alpha=0.5), (3, 4)),
    "masked_fill": (lambda L, x: x.masked_fill(L.tensor([True, False, False, True]), -1.0),
                    (3, 4)),
    "masked_fill_broadcasts": (lambda L, x: L.masked_fill(x[0], L.tensor(
        [[True, False, True, False], [False] * 4]), 2.0), (3, 4)),
    "masked_fill_tensor_value": (lambda L, x: x.masked_fill(L.tensor([False, True, True,
                                                                       False]), x[0, 0]),
                                 (3, 4)),
    "masked_select": (lambda L, x: L.masked_select(x, L.tensor([True, False, True, True])),
                      (3, 4)),
}


@pytest.mark.parametrize("name", list(INDEX_PROGRAMS))
def test_index_functions_match_torch(name):
    program, shape = INDEX_PROGRAMS[name]
    _grad_check(program, [shape], seed=40)


def test_inplace_index_functions_bump_versions():
    a = _data((3, 4), seed=41)
    programs = [
        lambda L, x: x.scatter_(1, L.tensor([[1], [0], [3]]), 5.0),
        lambda L, x: x.scatter_add_(0, L.tensor([[0, 1, 2, 0]]), L.ones(1, 4,
                                                                        dtype=L.float64)),
        lambda L, x: x.index_add_(1, L.tensor([0, 0]), L.ones(3, 2, dtype=L.float64)),
        lambda L, x: x.masked_fill_(L.tensor([[True], [False], [True]]), 0.0),
        lambda L, x: x.tril_(),
    ]
    for k, prog in enumerate(programs):
        f, t = _pair(a)
        rf, rt = prog(flow, f), prog(torch, t)
        assert rf is f and rt is t
        _same(f, t, f"program {k}")
        assert f._version == t._version == 1


def test_scatter_gradient_of_src_larger_than_index():
    """torch cannot differentiate this case; the grad is the gather at the index, zero
    elsewhere, which finite differences confirm."""
    x = flow.tensor(_data((3, 5), seed=42), requires_grad=True)
    src = flow.tensor(_data((4, 6), seed=43), requires_grad=True)
    index = np.array([[0, 4], [3, 1], [1, 2]])
    cot = _data((3, 5), seed=44)
    out = flow.scatter(x, 1, flow.tensor(index), src)
    out.backward(flow.tensor(cot))
    expected_src = np.zeros((4, 6))
    expected_src[:3, :2] = np.take_along_axis(cot, index, 1)
    np.testing.assert_allclose(_np(src.grad), expected_src)
    expected_x = cot.copy()
    np.put_along_axis(expected_x, index, 0.0, 1)
    np.testing.assert_allclose(_np(x.grad), expected_x)


def test_nonzero_matches_torch():
    a = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    f, t = _pair(a)
    assert flow.nonzero(f).tolist() == torch.nonzero(t).tolist()
    for pf, pt in zip(flow.nonzero(f, as_tuple=True), torch.nonzero(t, as_tuple=True),
                      strict=True):
        assert pf.tolist() == pt.tolist()
    assert tuple(flow.nonzero(flow.tensor(0.0)).shape) == tuple(torch.nonzero(
        torch.tensor(0.0)).shape)


# -- errors --------------------------------------------------------------------------------
def _x(L):
    return L.ones(2, 3)


ERRORS = {
    "int_out_of_range": (lambda L: _x(L)[5], ["index 5 is out of bounds for dimension 0 "
                                              "with size 2"]),
    "neg_int_out_of_range": (lambda L: _x(L)[:, -4], ["index -4", "dimension 1", "size 3"]),
    "tensor_out_of_range": (lambda L: _x(L)[[0, 5]], ["index 5 is out of bounds for "
                                                      "dimension 0 with size 2"]),
    "tensor_out_of_range_dim": (lambda L: _x(L)[:, [0, -4]], ["index -4", "size 3"]),
    "too_many_indices": (lambda L: _x(L)[0, 0, 0], ["too many indices for tensor of "
                                                    "dimension 2"]),
    "zero_dim_int": (lambda L: L.tensor(1.0)[0], ["invalid index of a 0-dim tensor"]),
    "float_tensor_index": (lambda L: _x(L)[L.tensor([0.0])], [
        "tensors used as indices must be long, int, byte or bool tensors"]),
    "int16_index": (lambda L: _x(L)[L.tensor([0], dtype=L.int16)], ["tensors used as indices"]),
    "float_key": (lambda L: _x(L)[1.5], ["only integers, slices"]),
    "negative_step": (lambda L: _x(L)[::-1], ["step must be greater than zero"]),
    "zero_step": (lambda L: _x(L)[::0], ["slice step cannot be zero"]),
    "mask_shape": (lambda L: _x(L)[L.tensor([True, False, True])], [
        "The shape of the mask [3] at index 0 does not match the shape of the indexed tensor "
        "[2, 3] at index 0"]),
    "mask_shape_later_axis": (lambda L: _x(L)[:, L.tensor([True, False])], [
        "mask [2]", "at index 1"]),
    "broadcast_indices": (lambda L: _x(L)[[0, 1], [0, 1, 2]], [
        "shape mismatch: indexing tensors could not be broadcast together with shapes [2], "
        "[3]"]),
    "setitem_value_shape": (lambda L: _x(L).__setitem__(0, L.ones(4)), ["3", "4"]),
    "setitem_advanced_value_shape": (lambda L: _x(L).__setitem__([0, 1], L.ones(4)), [
        "shape mismatch: value tensor of shape [4] cannot be broadcast to indexing result of "
        "shape [2, 3]"]),
    "setitem_advanced_dtype": (lambda L: _x(L).__setitem__([0], L.ones(3, dtype=L.float64)), [
        "Index put requires the source and destination dtypes match, got Float for the "
        "destination and Double for the source."]),
    "index_put_out_of_range": (lambda L: L.zeros(3).index_put((L.tensor([0, 5]),),
                                                              L.tensor([1.0, 2.0]), True),
                               ["index 5 is out of bounds for dimension 0 with size 3"]),
    "gather_out_of_range": (lambda L: L.gather(_x(L), 1, L.tensor([[0], [3]])), [
        "index 3 is out of bounds for dimension 1 with size 3"]),
    "gather_negative": (lambda L: L.gather(_x(L), 1, L.tensor([[0], [-1]])), ["index -1"]),
    "gather_ndim": (lambda L: L.gather(_x(L), 1, L.tensor([0])), [
        "Index tensor must have the same number of dimensions as input tensor"]),
    "gather_size": (lambda L: L.gather(_x(L), 1, L.zeros(3, 1, dtype=L.int64)), [
        "Size does not match at dimension 0"]),
    "gather_float_index": (lambda L: L.gather(_x(L), 1, L.zeros(2, 1)), [
        "Expected dtype int32/int64 for index"]),
    "scatter_out_of_range": (lambda L: L.scatter(_x(L), 0, L.tensor([[2]]), 1.0), [
        "index 2 is out of bounds for dimension 0 with size 2"]),
    "scatter_src_dtype": (lambda L: L.scatter(_x(L), 0, L.tensor([[1]]),
                                              L.ones(1, 1, dtype=L.float64)), [
        "scatter(): Expected self.dtype to be equal to src.dtype"]),
    "scatter_bad_reduce": (lambda L: L.scatter(_x(L), 0, L.tensor([[1]]), _x(L),
                                               reduce="mean"), [
        "reduce argument must be either add or multiply"]),
    "index_select_out_of_range": (lambda L: L.index_select(_x(L), 0, L.tensor([7])), ["7"]),
    "index_select_matrix_index": (lambda L: L.index_select(_x(L), 0, L.tensor([[0]])), [
        "Index is supposed to be a vector"]),
    "index_add_count": (lambda L: L.index_add(_x(L), 1, L.tensor([0, 0]), L.ones(2, 3)), [
        "Number of indices (2) should be equal to source.size(dim): (3), for dim: 1"]),
    "index_add_negative": (lambda L: L.index_add(_x(L), 1, L.tensor([-1]), L.ones(2, 1)), [
        "index -1 is out of bounds for dimension 1 with size 3"]),
    "masked_fill_float_mask": (lambda L: _x(L).masked_fill(L.ones(3), 1.0), [
        "masked_fill_ only supports boolean masks, but got mask with dtype float"]),
    "masked_fill_value_dim": (lambda L: _x(L).masked_fill(L.ones(3, dtype=L.bool),
                                                          L.ones(1)), [
        "only supports a 0-dimensional value tensor, but got tensor with 1 dimension(s)"]),
    "masked_fill_inplace_broadcast": (lambda L: L.ones(3).masked_fill_(L.ones(2, 3,
                                                                              dtype=L.bool),
                                                                       1.0), ["[2, 3]"]),
    "narrow_start": (lambda L: _x(L).narrow(1, 4, 0), ["start out of range"]),
    "narrow_length": (lambda L: _x(L).narrow(1, 2, 2), ["start (2) + length (2) exceeds "
                                                        "dimension size (3)"]),
    "select_out_of_range": (lambda L: _x(L).select(1, 3), [
        "select(): index 3 out of range for tensor of size [2, 3] at dimension 1"]),
    "flatten_order": (lambda L: _x(L).flatten(1, 0), ["start_dim cannot come after end_dim"]),
    "unflatten_product": (lambda L: _x(L).unflatten(1, (2, 2)), [
        "Provided sizes [2, 2] don't multiply up to the size of dim 1 (3)"]),
    "squeeze_repeated": (lambda L: _x(L).squeeze((0, 0)), ["appears multiple times"]),
    "split_sizes": (lambda L: _x(L).split([1, 1], 1), [
        "split_with_sizes expects split_sizes to sum exactly to 3"]),
    "split_zero": (lambda L: _x(L).split(0), ["split_size can only be 0"]),
    "chunk_zero": (lambda L: _x(L).chunk(0), ["chunk expects `chunks` to be greater than 0"]),
    "tensor_split_zero": (lambda L: _x(L).tensor_split(0), ["number of sections must be "
                                                            "larger than 0"]),
    "unbind_zero_dim": (lambda L: L.tensor(1.0).unbind(), ["no dimensions"]),
    "movedim_counts": (lambda L: _x(L).movedim((0, 1), (1,)), ["movedim"]),
    "movedim_repeated": (lambda L: _x(L).movedim((0, 0), (1, 0)), ["repeated dim"]),
    "diagonal_same_dims": (lambda L: _x(L).diagonal(0, 1, 1), [
        "diagonal dimensions cannot be identical"]),
    "cat_zero_dim": (lambda L: L.cat([_x(L), L.tensor(1.0)]), [
        "zero-dimensional tensor (at position 1) cannot be concatenated"]),
    "cat_ndim": (lambda L: L.cat([_x(L), L.ones(3)], dim=1), [
        "Tensors must have same number of dimensions: got 2 and 1"]),
    "cat_sizes": (lambda L: L.cat([_x(L), L.ones(2, 4)]), [
        "Sizes of tensors must match except in dimension 0. Expected size 3 but got size 4 "
        "for tensor number 1 in the list."]),
    "stack_sizes": (lambda L: L.stack([_x(L), L.ones(3, 2)]), [
        "stack expects each tensor to be equal size, but got [2, 3] at entry 0 and [3, 2] at "
        "entry 1"]),
    "flip_repeated": (lambda L: L.flip(_x(L), (0, 0)), ["appears multiple times"]),
    "roll_mismatch": (lambda L: L.roll(_x(L), (1, 2), (0,)), [
        "shifts and dimensions must align. shifts: 2, dims:1"]),
    "tril_1d": (lambda L: L.tril(L.ones(3)), ["tril: input tensor must have at least 2 "
                                              "dimensions"]),
    "repeat_too_few": (lambda L: _x(L).repeat(2), ["Number of dimensions of repeat dims"]),
    "pad_odd": (lambda L: _F(L).pad(_x(L), (1,)), [
        "Padding length must be divisible by 2"]),
    "pad_reflect_too_big": (lambda L: _F(L).pad(
        L.ones(2, 3, 4), (4, 0), mode="reflect"), ["Padding size should be less than the "
                                                   "corresponding input dimension"]),
    "pad_reflect_rank": (lambda L: _F(L).pad(
        L.ones(2, 3, 4, 5), (1, 1), mode="reflect"), ["Padding size 2 is not supported for 4D "
                                                      "input tensor"]),
    "pad_mode": (lambda L: _F(L).pad(
        _x(L), (1, 1), mode="foo"), ["Unrecognised padding mode foo"]),
    "pad_value_with_reflect": (lambda L: _F(L).pad(
        L.ones(2, 3, 4), (1, 1), mode="reflect", value=2.0), ["doesn't take in value"]),
    "pad_circular_wraps": (lambda L: _F(L).pad(
        L.ones(1, 2, 3), (4, 0), mode="circular"), ["wrapping around more than once"]),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_match_torch(name):
    program, words = ERRORS[name]
    with pytest.raises(Exception) as theirs:
        program(torch)
    with pytest.raises(Exception) as ours:
        program(flow)
    assert type(ours.value) is type(theirs.value), (
        f"torch raised {type(theirs.value).__name__}: {theirs.value}\n"
        f"we raised {type(ours.value).__name__}: {ours.value}")
    for w in words:
        assert w in str(ours.value), f"{str(ours.value)!r} lacks {w!r}"


def test_failed_setitem_leaves_tensor_and_version_untouched():
    f = flow.zeros(2, 3)
    with pytest.raises(IndexError):
        f[[0, 7]] = 1.0
    with pytest.raises(RuntimeError):
        f[0] = flow.ones(4)
    assert f.tolist() == [[0.0] * 3] * 2 and f._version == 0


def test_chain_of_writes_matches_torch_values_grads_and_versions():
    """Advanced and basic writes, overlapping reads, masks and in-place ops on views, mixed;
    the index grad must not need the (since overwritten) source."""
    a = _data((4, 3), seed=50)
    results = []
    for lib in (flow, torch):
        x = lib.tensor(a, requires_grad=True)
        v = lib.tensor(a[:2] * 2, requires_grad=True)
        y = x * 1
        y[[0, 2]] += v
        y[1:, 0] = y[:-1, 1]
        mask = y > 0
        y[mask] = y[mask] * 3
        z = y.narrow(0, 1, 2).flatten().unflatten(0, (3, 2)).t()
        z.diagonal().mul_(5)
        ((y ** 2).sum() + z.sum()).backward()
        results.append((y.detach(), x.grad, v.grad, y._version))
    (yf, xgf, vgf, verf), (yt, xgt, vgt, vert) = results
    _same(yf, yt, "values")
    _same(xgf, xgt, "grad of x")
    _same(vgf, vgt, "grad of v")
    assert verf == vert
