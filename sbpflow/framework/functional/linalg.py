"""Matrix products: matmul, mm, bmm, mv, dot, outer, einsum, tensordot, addmm, baddbmm."""

from __future__ import annotations

from ..tensor import Tensor
from ._base import call


def matmul(input, other):
    return call("matmul", input, other)


def mm(input, mat2):
    return call("mm", input, mat2)


def bmm(input, mat2):
    return call("bmm", input, mat2)


def mv(input, vec):
    if input.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"mv(): vector + matrix @ vector expected, got 1, {input.ndim}, "
                           f"{vec.ndim}")
    return call("matmul", input, vec)


def dot(input, tensor):
    return call("dot", input, tensor)


def outer(input, vec2):
    return call("outer", input, vec2)


ger = outer


def _sublist_subscripts(sublist) -> str:
    """torch's sublist form: ints 0-51 name axes (0-25: A-Z, 26-51: a-z), Ellipsis is '...'."""
    out = []
    for s in sublist:
        if s is Ellipsis:
            out.append("...")
        elif isinstance(s, int) and 0 <= s < 52:
            out.append(chr(ord("A") + s) if s < 26 else chr(ord("a") + s - 26))
        else:
            raise ValueError(f"einsum(): expected subscript to be within the range [0, 52), "
                             f"but got {s!r}")
    return "".join(out)


def einsum(*args):
    """einsum(equation, *operands), einsum(equation, [operands]) or the sublist form
    einsum(op0, sublist0, op1, sublist1, ..., [out_sublist])."""
    if not args or (isinstance(args[0], str) and len(args) < 2):
        raise ValueError("einsum(): must specify the equation string and at least one operand, "
                         "or at least one operand and its subscripts list")
    if isinstance(args[0], str):
        equation, operands = args[0], args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
    else:
        pairs = args[: len(args) // 2 * 2]
        operands = pairs[0::2]
        equation = ",".join(_sublist_subscripts(s) for s in pairs[1::2])
        if len(args) % 2:
            equation += "->" + _sublist_subscripts(args[-1])
    return call("einsum", tuple(operands), equation=equation)


def tensordot(a, b, dims=2, out=None):
    """Contract the last `dims` axes of a with the first of b, or the axes listed in
    dims=([a axes], [b axes]); an einsum over letters."""
    if out is not None:
        raise NotImplementedError("tensordot(): out= is not supported")
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot(): tensordot expects dims >= 0, but got dims={dims}")
        if dims > min(a.ndim, b.ndim):
            raise RuntimeError(f"tensordot(): tensordot expects dims < ndim_a or ndim_b, but got "
                               f"dims={dims}")
        dims_a, dims_b = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(dims_a) != len(dims_b):
        raise RuntimeError("tensordot(): both dimension lists should have same length")
    dims_a = [d % a.ndim if a.ndim else d for d in dims_a]
    dims_b = [d % b.ndim if b.ndim else d for d in dims_b]
    if a.ndim + b.ndim - len(dims_a) > 52:
        raise RuntimeError("tensordot(): too many dimensions")
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    sa = [next(letters) for _ in range(a.ndim)]
    sb = [next(letters) for _ in range(b.ndim)]
    for da, db in zip(dims_a, dims_b, strict=True):
        if a.shape[da] != b.shape[db]:
            raise RuntimeError(f"tensordot(): contracted dimensions need to match, but first has "
                               f"size {a.shape[da]} in dim {da} and second has size "
                               f"{b.shape[db]} in dim {db}")
        sb[db] = sa[da]
    out_s = [s for i, s in enumerate(sa) if i not in dims_a] + [
        s for i, s in enumerate(sb) if i not in dims_b]
    return einsum("".join(sa) + "," + "".join(sb) + "->" + "".join(out_s), a, b)


def _scaled_sum(name, input, product, beta, alpha):
    """beta * input + alpha * product; with beta == 0 input is ignored (nan and inf too), as
    in torch, but must still broadcast to the product."""
    from ..._core.errors import broadcast_shapes
    from .elementwise import add, mul

    shape = broadcast_shapes(name, tuple(input.shape), tuple(product.shape))
    if shape != tuple(product.shape):
        raise RuntimeError(f"{name}(): the input of shape {list(input.shape)} does not "
                           f"broadcast to the product's shape {list(product.shape)}")
    if alpha != 1:
        product = mul(product, alpha)
    if beta == 0:
        return product
    return add(mul(input, beta) if beta != 1 else input, product)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    return _scaled_sum("addmm", input, mm(mat1, mat2), beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum("baddbmm", input, bmm(batch1, batch2), beta, alpha)


def addmv(input, mat, vec, *, beta=1, alpha=1):
    return _scaled_sum("addmv", input, mv(mat, vec), beta, alpha)


METHODS = {
    "matmul": matmul, "__matmul__": matmul,
    "__rmatmul__": lambda self, other: matmul(other, self),
    "mm": mm, "bmm": bmm, "mv": mv, "dot": dot, "outer": outer, "ger": ger,
    "addmm": addmm, "baddbmm": baddbmm, "addmv": addmv,
}

__all__ = ["addmm", "addmv", "baddbmm", "bmm", "dot", "einsum", "ger", "matmul", "mm", "mv",
           "outer", "tensordot"]
