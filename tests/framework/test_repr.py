"""repr(tensor) must print exactly as torch prints, with "torch." spelled "sbpflow."."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.framework import tensor_str

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


def to_flow(t: torch.Tensor):
    """The same values as an sbpflow tensor (bfloat16 travels as ml_dtypes.bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        a = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        a = t.numpy()
    return flow.tensor(a.copy())


def torch_repr(t: torch.Tensor) -> str:
    return repr(t).replace("torch.", "sbpflow.")


def _random(shape, dtype, scale, generator, whole=False):
    x = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
    if whole:
        x = x.round()
    return x.to(dtype)


def _table():
    """A deterministic table of (id, torch tensor) covering the formatting rules."""
    g = torch.Generator().manual_seed(1234)
    cases = []
    shapes = [(), (1,), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2), (30,), (40, 30), (1001,),
              (3, 400), (11, 11, 11), (2, 2, 2, 2, 300)]
    for shape in shapes:
        for dtype in FLOAT_DTYPES:
            for scale in (1.0, 1e3, 1e-5, 1e9):
                cases.append((f"{dtype}-{shape}-x{scale:g}", _random(shape, dtype, scale, g)))
            cases.append((f"{dtype}-{shape}-whole", _random(shape, dtype, 20.0, g, whole=True)))
        for dtype in INT_DTYPES:
            lo = 0 if dtype == torch.uint8 else -100
            cases.append((f"{dtype}-{shape}", torch.randint(lo, 100, shape, generator=g,
                                                             dtype=dtype)))
        cases.append((f"bool-{shape}", torch.randn(shape, generator=g) > 0))
    nan, inf = math.nan, math.inf
    cases += [
        ("nan-inf-whole", torch.tensor([nan, 1.0, inf])),
        ("nan-inf-frac", torch.tensor([nan, -inf, 0.25, 3.0])),
        ("nan-inf-sci", torch.tensor([nan, inf, 1e-7, 3.0])),
        ("only-nan", torch.tensor([nan])),
        ("only-nonfinite", torch.tensor([nan, -inf, inf])),
        ("signed-zeros", torch.tensor([-0.0, 0.0])),
        ("zeros-2d", torch.zeros(2, 3)),
        ("max-1e8", torch.tensor([1e8, 1.0])),
        ("above-1e8", torch.tensor([1.0001e8, 1.0])),
        ("ratio-1000", torch.tensor([1.0, 1000.0])),
        ("ratio-1001", torch.tensor([1.0, 1001.0])),
        ("min-1e-4", torch.tensor([1e-4, 0.5])),
        ("below-1e-4", torch.tensor([0.5, 9.9e-5])),
        ("huge-f64", torch.tensor([5e300, 1e-300], dtype=torch.float64)),
        ("scalar-nan", torch.tensor(nan)),
        ("scalar-neg-whole", torch.tensor(-3.0)),
        ("scalar-frac-f64", torch.tensor(2.5, dtype=torch.float64)),
        ("scalar-big", torch.tensor(3e10)),
        ("scalar-int8", torch.tensor(7, dtype=torch.int8)),
        ("scalar-bool", torch.tensor(True)),
        ("arange-75", torch.arange(75.0).reshape(3, 25)),
        ("arange-int-2d", torch.arange(-50, 50).reshape(10, 10)),
        ("arange-2000", torch.arange(2000).reshape(2, 1000)),
        ("arange-sci-3d", torch.arange(3000.0).reshape(10, 10, 30)),
        ("int64-extremes", torch.tensor([-(2**63), 2**63 - 1])),
        ("fp16-extremes", torch.tensor([65504.0, -6.1e-5], dtype=torch.float16)),
        ("bf16-wide", torch.tensor([3e38, 1.0], dtype=torch.bfloat16)),
    ]
    for dims in [(0,), (0, 3), (3, 0, 2), (2, 0)]:
        for dtype in (torch.float32, torch.float64, torch.int64, torch.bool, torch.int32):
            cases.append((f"empty-{dims}-{dtype}", torch.zeros(dims, dtype=dtype)))
    return cases


TABLE = _table()

OPTIONS = [
    {},
    {"precision": 2},
    {"precision": 7},
    {"sci_mode": True},
    {"sci_mode": False},
    {"linewidth": 40},
    {"linewidth": 120},
    {"threshold": 5, "edgeitems": 2},
    {"threshold": 10, "edgeitems": 1},
    {"threshold": 5, "edgeitems": 0},
    {"threshold": 0, "linewidth": 30},
    {"profile": "short"},
    {"profile": "full"},
]


@pytest.fixture
def print_options(request):
    opts = request.param
    torch.set_printoptions(**opts)
    tensor_str.set_printoptions(**opts)
    yield opts
    torch.set_printoptions(profile="default")
    tensor_str.set_printoptions(profile="default")


@pytest.mark.parametrize("name,t", TABLE, ids=[c[0] for c in TABLE])
def test_repr_matches_torch(name, t):
    assert repr(to_flow(t)) == torch_repr(t)


@pytest.mark.parametrize("print_options", OPTIONS, indirect=True, ids=str)
def test_repr_matches_torch_under_print_options(print_options):
    mismatches = [
        (name, torch_repr(t), repr(to_flow(t)))
        for name, t in TABLE
        if repr(to_flow(t)) != torch_repr(t)
    ]
    assert not mismatches, mismatches[:3]


def test_str_equals_repr():
    t = to_flow(torch.arange(12.0).reshape(3, 4) / 3)
    assert str(t) == repr(t)


def test_set_printoptions_semantics():
    try:
        tensor_str.set_printoptions(precision=2, sci_mode=True)
        assert tensor_str.get_printoptions()["precision"] == 2
        # Like torch, sci_mode is always assigned: omitting it restores the automatic choice.
        tensor_str.set_printoptions(linewidth=60)
        opts = tensor_str.get_printoptions()
        assert opts["sci_mode"] is None and opts["precision"] == 2 and opts["linewidth"] == 60
        with pytest.raises(ValueError, match="profile"):
            tensor_str.set_printoptions(profile="nonsense")
    finally:
        tensor_str.set_printoptions(profile="default")
    assert tensor_str.get_printoptions() == {
        "precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80, "sci_mode": None,
    }


def test_printoptions_context_restores():
    t = torch.tensor([1.0 / 3.0, 2.0])
    with tensor_str.printoptions(precision=1):
        torch.set_printoptions(precision=1)
        try:
            assert repr(to_flow(t)) == torch_repr(t)
        finally:
            torch.set_printoptions(profile="default")
    assert repr(to_flow(t)) == torch_repr(t)


def test_set_printoptions_is_exported():
    assert flow.set_printoptions is tensor_str.set_printoptions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_default_dtype_decides_the_implicit_dtype(dtype):
    data = [[1.5, -2.0], [0.25, 4.0]]
    try:
        torch.set_default_dtype(torch.float64)
        flow.set_default_dtype(flow.float64)
        t = torch.tensor(data, dtype=dtype)
        assert repr(to_flow(t)) == torch_repr(t)
        empty = torch.zeros(0, 2, dtype=dtype)
        assert repr(to_flow(empty)) == torch_repr(empty)
    finally:
        torch.set_default_dtype(torch.float32)
        flow.set_default_dtype(flow.float32)


# -- autograd suffixes -------------------------------------------------------------------------
def _leaf_pair(shape, dtype=torch.float32, seed=0):
    # Multiples of 1/8: sums and products are exact, so no rounding difference between the
    # two libraries can show in the printed digits.
    g = torch.Generator().manual_seed(seed)
    tx = (torch.randn(shape, generator=g) * 8).round().div(8).to(dtype).requires_grad_()
    ty = (torch.randn(shape, generator=g) * 8).round().div(8).to(dtype).requires_grad_()
    fx, fy = to_flow(tx).requires_grad_(), to_flow(ty).requires_grad_()
    return (tx, ty), (fx, fy)


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (4, 20), (2, 3, 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_requires_grad_suffix(shape, dtype):
    (tx, _), (fx, _) = _leaf_pair(shape, dtype)
    assert repr(fx) == torch_repr(tx)


GRAD_FN_PROGRAMS = ["mul", "add", "sub", "neg", "exp", "mul_scalar", "add_scalar", "square",
                    "sum"]
# float32 exp may differ from torch's by an ulp, which can show at 4 decimals: float64 only.
GRAD_FN_CASES = [(fn, dtype) for fn in GRAD_FN_PROGRAMS for dtype in (torch.float32,
                                                                      torch.float64)
                 if not (fn == "exp" and dtype == torch.float32)]


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (4, 20), (1, 19)])
@pytest.mark.parametrize("fn,dtype", GRAD_FN_CASES)
def test_grad_fn_suffix(shape, dtype, fn):
    (tx, ty), (fx, fy) = _leaf_pair(shape, dtype)
    programs = {
        "mul": lambda x, y: x * y,
        "add": lambda x, y: x + y,
        "sub": lambda x, y: x - y,
        "neg": lambda x, y: -x,
        "exp": lambda x, y: x.exp(),
        "mul_scalar": lambda x, y: x * 2,  # a scalar op, still named MulBackward0
        "add_scalar": lambda x, y: x + 1.5,
        "square": lambda x, y: x**2,
        "sum": lambda x, y: x.sum(),
    }
    assert repr(programs[fn](fx, fy)) == torch_repr(programs[fn](tx, ty))


def test_write_through_view_makes_copy_slices():
    (tx, ty), (fx, fy) = _leaf_pair((3, 4))
    tb, fb = tx.clone(), fx.clone()
    tb[1:].mul_(2)
    fb[1:].mul_(2)
    assert repr(fb) == torch_repr(tb)
    # torch's C++ node reports "torch::autograd::CopySlices"; its repr shows the last part.
    assert fb.grad_fn.name() == tb.grad_fn.name().rsplit("::", 1)[-1] == "CopySlices"


def _strip_grad_fn(text: str) -> str:
    head, sep, _ = text.rpartition("grad_fn=<")
    return head.rstrip(" ,\n") if sep else text


def test_grad_fn_suffix_wraps_like_torch_for_other_names():
    # Where our node name differs from torch's (matmul -> MmBackward0), the data part and the
    # placement of the suffix must still agree.
    (tx, ty), (fx, fy) = _leaf_pair((4, 4), seed=3)
    ours, theirs = repr(fx @ fy), torch_repr(tx @ ty)
    assert _strip_grad_fn(ours) == _strip_grad_fn(theirs)
    assert ("\n       grad_fn=" in ours) == ("\n       grad_fn=" in theirs)


def test_custom_function_grad_fn_name():
    class Square(flow.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    class TorchSquare(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    tx = torch.tensor([1.5, -2.0], requires_grad=True)
    fx = to_flow(tx).requires_grad_()
    ours = repr(Square.apply(fx))
    theirs = torch_repr(TorchSquare.apply(tx)).replace("TorchSquare", "Square")
    assert ours == theirs


def test_detached_and_no_grad_results_have_no_suffix():
    (tx, ty), (fx, fy) = _leaf_pair((2, 2))
    assert repr((fx * fy).detach()) == torch_repr((tx * ty).detach())
    with flow.no_grad(), torch.no_grad():
        assert repr(fx * fy) == torch_repr(tx * ty)


def test_repr_of_noncontiguous_view():
    t = torch.arange(24.0).reshape(2, 3, 4) / 7
    f = to_flow(t)
    assert repr(f.transpose(0, 2)) == torch_repr(t.transpose(0, 2))
    assert repr(f.permute(1, 2, 0)) == torch_repr(t.permute(1, 2, 0))


def test_repr_does_not_change_values_or_dtype():
    a = np.array([1.0, 2.5], dtype=ml_dtypes.bfloat16)
    f = flow.tensor(a)
    repr(f)
    assert f.dtype is flow.bfloat16
    np.testing.assert_array_equal(f.numpy().astype(np.float32), a.astype(np.float32))


def test_device_suffix_comes_first():
    # torch prints a non-default device before dtype and autograd suffixes.
    t = flow.ones(2, 3, device="mock", dtype=flow.float64, requires_grad=True)
    assert repr(t) == (
        "tensor([[1., 1., 1.],\n"
        "        [1., 1., 1.]], device='mock', dtype=sbpflow.float64, requires_grad=True)"
    )


@pytest.mark.parametrize("spec", ["", ".3f", ">10", "e"])
def test_format_of_a_0d_tensor_is_its_number_as_in_torch(spec):
    """f"{loss}" prints the number for a 0-d tensor (requiring grad or not), as torch does;
    other tensors format as their repr, and only with an empty spec."""
    for ours, theirs in ((flow.tensor(1.5), torch.tensor(1.5)),
                         (flow.tensor(2.5, requires_grad=True) * 2,
                          torch.tensor(2.5, requires_grad=True) * 2),
                         (flow.tensor(7), torch.tensor(7))):
        if spec == "e" and theirs.dtype == torch.int64:
            continue
        assert format(ours, spec) == format(theirs, spec)
    assert format(flow.tensor([1.0, 2.0]), "") == format(torch.tensor([1.0, 2.0]), "")
    if spec:
        with pytest.raises(TypeError, match="unsupported format string"):
            format(torch.tensor([1.0, 2.0]), spec)
        with pytest.raises(TypeError, match="unsupported format string"):
            format(flow.tensor([1.0, 2.0]), spec)
