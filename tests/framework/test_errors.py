"""Bad input raises torch's exception type, with a message naming the op, never from NumPy."""

from __future__ import annotations

import traceback

import pytest
import torch

import sbpflow as flow


def _x(lib):
    return lib.ones(2, 3)


def _i(lib):
    return lib.ones(2, 3, dtype=lib.int64)


def _F(lib):
    return lib.nn.functional


# (id, program(lib), words our message must contain (case-insensitive))
CASES = [
    # shape mismatches
    ("add_shape", lambda L: L.add(_x(L), L.ones(4)), ["add", "3", "4"]),
    ("sub_shape", lambda L: _x(L) - L.ones(4), ["sub", "3", "4"]),
    ("mul_shape", lambda L: _x(L) * L.ones(2, 4), ["mul", "3", "4"]),
    ("div_shape", lambda L: _x(L) / L.ones(7), ["div", "7"]),
    ("maximum_shape", lambda L: L.maximum(_x(L), L.ones(5)), ["maximum", "5"]),
    ("where_shape", lambda L: L.where(_x(L) > 0, _x(L), L.ones(4)), ["where", "4"]),
    ("matmul_shape", lambda L: _x(L) @ L.ones(4, 5), ["matmul", "3", "4"]),
    ("matmul_0d", lambda L: L.matmul(L.tensor(1.0), _x(L)), ["matmul", "1D"]),
    ("matmul_dtype", lambda L: _x(L) @ L.ones(3, 2, dtype=L.float64), ["matmul", "dtype"]),
    # torch reports linear's shape error as its matmul's ("mat1 and mat2 ..."), as we may.
    ("linear_shape", lambda L: _F(L).linear(_x(L), L.ones(4, 5)), ["mat", "2x3", "5x4"]),
    ("reshape_bad", lambda L: _x(L).reshape(5), ["reshape", "5", "6"]),
    ("view_two_infer", lambda L: _x(L).view(-1, -1), ["view", "inferred"]),
    ("view_noncontig", lambda L: _x(L).t().view(6), ["view"]),
    ("permute_len", lambda L: _x(L).permute(0, 1, 2), ["permute"]),
    ("permute_dup", lambda L: _x(L).permute(0, 0), ["permute"]),
    ("expand_bad", lambda L: L.ones(2).expand(3), ["expand", "3", "2"]),
    ("cat_shape", lambda L: L.cat([_x(L), L.ones(2, 4)], dim=0), ["cat", "3", "4"]),
    ("cat_empty", lambda L: L.cat([]), ["cat"]),
    ("stack_shape", lambda L: L.stack([_x(L), L.ones(3, 2)]), ["stack"]),
    ("layer_norm_shape", lambda L: _F(L).layer_norm(_x(L), (4,)), ["layer_norm", "4"]),
    ("roll_mismatch", lambda L: L.roll(_x(L), (1, 2), (0,)), ["roll"]),
    ("narrow_oob", lambda L: _x(L).narrow(1, 2, 5), ["narrow"]),
    ("ones_negative", lambda L: L.ones(-1), ["-1"]),
    ("arange_step0", lambda L: L.arange(0, 5, 0), ["arange", "step"]),
    ("conv2d_dims", lambda L: _F(L).conv2d(_x(L), L.ones(1, 1, 3, 3)), ["conv2d"]),
    ("cross_entropy_batch", lambda L: _F(L).cross_entropy(_x(L), L.tensor([0, 1, 2])),
     ["batch"]),
    # dims out of range / duplicated
    ("sum_dim", lambda L: _x(L).sum(dim=2), ["sum", "dim", "2"]),
    ("sum_dim_neg", lambda L: L.sum(_x(L), -3), ["sum", "-3"]),
    ("sum_dup_dims", lambda L: _x(L).sum((0, 0)), ["sum", "multiple times"]),
    ("mean_dim", lambda L: _x(L).mean(dim=3), ["mean", "3"]),
    ("softmax_dim", lambda L: L.softmax(_x(L), dim=5), ["softmax", "5"]),
    ("log_softmax_dim", lambda L: L.log_softmax(_x(L), dim=-3), ["log_softmax", "-3"]),
    ("transpose_dim", lambda L: _x(L).transpose(0, 2), ["transpose", "2"]),
    ("cumsum_dim", lambda L: _x(L).cumsum(3), ["cumsum", "3"]),
    ("argmax_dim", lambda L: _x(L).argmax(dim=2), ["argmax", "2"]),
    ("max_dim", lambda L: _x(L).max(dim=2), ["max", "2"]),
    ("var_dim", lambda L: _x(L).var(dim=4), ["var", "4"]),
    ("cat_dim", lambda L: L.cat([_x(L), _x(L)], dim=2), ["cat", "2"]),
    ("squeeze_dim", lambda L: _x(L).squeeze(3), ["squeeze", "3"]),
    ("unsqueeze_dim", lambda L: _x(L).unsqueeze(4), ["unsqueeze", "4"]),
    ("flip_dup", lambda L: _x(L).flip(0, 0), ["flip", "multiple times"]),
    ("split_dim", lambda L: _x(L).split(1, dim=3), ["split", "3"]),
    ("size_dim", lambda L: _x(L).size(2), ["size", "2"]),
    ("max_empty", lambda L: L.ones(0).max(), ["max"]),
    # dtypes
    ("mean_int", lambda L: _i(L).mean(), ["mean", "Long"]),
    ("zeros_bad_dtype", lambda L: L.zeros(2, dtype="foo"), ["dtype"]),
    ("to_bad_dtype", lambda L: _x(L).to(dtype=5), ["dtype"]),
    ("sum_bad_dtype", lambda L: _x(L).sum(dtype="float"), ["sum", "dtype"]),
    ("where_cond_dtype", lambda L: L.where(_x(L), _x(L), _x(L)), ["where", "bool"]),
    ("gather_float_index", lambda L: L.gather(_x(L), 1, L.tensor([[0.0]])), ["gather", "index"]),
    ("int_requires_grad", lambda L: L.ones(2, dtype=L.int64, requires_grad=True),
     ["floating point"]),
    # indices
    ("index_oob", lambda L: _x(L)[5], ["index", "5", "size 2"]),
    ("index_oob_neg", lambda L: _x(L)[:, -4], ["index", "-4", "size 3"]),
    ("index_too_many", lambda L: _x(L)[0, 0, 0], ["too many indices"]),
    ("gather_oob", lambda L: L.gather(_x(L), 1, L.tensor([[5]])), ["gather", "5"]),
    ("index_select_oob", lambda L: L.index_select(_x(L), 0, L.tensor([7])),
     ["index_select", "7"]),
    ("embedding_oob", lambda L: _F(L).embedding(L.tensor([9]), L.ones(3, 2)), ["embedding"]),
    ("topk_k", lambda L: _x(L).topk(5), ["topk"]),
    # argument types
    ("add_str", lambda L: L.add(_x(L), "a"), ["add", "str"]),
    ("mul_list", lambda L: L.mul(_x(L), [1, 2]), ["mul", "list"]),
    ("matmul_int_arg", lambda L: L.matmul(_x(L), 3), ["matmul", "int"]),
    ("exp_str", lambda L: L.exp("a"), ["exp", "str"]),
    ("relu_str", lambda L: L.relu("x"), ["relu", "str"]),
    ("sum_dim_str", lambda L: L.sum(_x(L), dim="a"), ["sum", "dim"]),
    ("view_str", lambda L: _x(L).view("a"), ["view"]),
    ("full_bad_size", lambda L: L.full("a", 1.0), ["full", "size"]),
    ("cat_not_list", lambda L: L.cat(_x(L)), ["cat"]),
    ("tensor_ragged", lambda L: L.tensor([[1, 2], [3]]), ["length"]),
]


def _numpy_frames(exc: BaseException) -> list[str]:
    """Traceback frames inside NumPy, over the exception and everything chained to it."""
    frames = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for frame in traceback.extract_tb(exc.__traceback__):
            if "/numpy/" in frame.filename or "/ml_dtypes/" in frame.filename:
                frames.append(f"{frame.filename}:{frame.lineno}")
        if type(exc).__module__.split(".")[0] == "numpy":
            frames.append(f"exception type {type(exc).__module__}.{type(exc).__name__}")
        exc = exc.__cause__ or exc.__context__
    return frames


@pytest.mark.parametrize("name,program,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_torch_exception_type(name, program, words):
    with pytest.raises(Exception) as theirs:
        program(torch)
    with pytest.raises(Exception) as ours:
        program(flow)
    ours_type = type(ours.value)
    if issubclass(ours_type, flow.vm.KernelError):
        # Raised by a kernel (a data-dependent check) and re-raised by the VM: its class
        # derives from the kernel's exception type and KernelError.
        ours_type = ours_type.__bases__[0]
    assert ours_type is type(theirs.value), (
        f"torch raised {type(theirs.value).__name__}: {theirs.value}\n"
        f"we raised {type(ours.value).__name__}: {ours.value}"
    )
    assert not _numpy_frames(ours.value), (str(ours.value), _numpy_frames(ours.value))
    message = str(ours.value).lower()
    missing = [w for w in words if w.lower() not in message]
    assert not missing, f"message {str(ours.value)!r} lacks {missing}"


def test_errors_are_raised_before_any_kernel_runs():
    # Validation belongs to infer_meta: a failing call leaves its operands untouched.
    x = flow.ones(2, 3)
    with pytest.raises(RuntimeError):
        x.add_(flow.ones(4))
    assert x.tolist() == [[1.0] * 3] * 2 and x._version == 0


def test_in_place_broadcast_of_target_raises_like_torch():
    with pytest.raises(RuntimeError) as theirs:
        torch.ones(3).add_(torch.ones(2, 3))
    with pytest.raises(RuntimeError) as ours:
        flow.ones(3).add_(flow.ones(2, 3))
    assert "doesn't match the broadcast shape" in str(theirs.value)
    assert "doesn't match the broadcast shape" in str(ours.value)
    assert "add_" in str(ours.value)


def test_in_place_category_lowering_raises_like_torch():
    with pytest.raises(RuntimeError) as theirs:
        torch.ones(2, dtype=torch.int64).mul_(1.5)
    with pytest.raises(RuntimeError) as ours:
        flow.ones(2, dtype=flow.int64).mul_(1.5)
    assert "can't be cast to the desired output type Long" in str(theirs.value)
    assert "can't be cast to the desired output type Long" in str(ours.value)


def test_device_mismatch_names_devices():
    a = flow.ones(2)
    b = flow.ones(2, device="mock")
    with pytest.raises(RuntimeError, match="same device"):
        flow.add(a, b)
