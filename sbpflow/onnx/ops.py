"""Job op -> ONNX nodes: the mapping table (`OPS`) and the graph builder.

Each entry of `OPS` is `convert(b, node, ins) -> [onnx output name per node output]`, where
`b` is the `Builder`, `node` the Job `OpNode` and `ins` the ONNX names of its inputs.  Shapes
that a converter needs at run time (Reshape, Expand, ConstantOfShape, Slice bounds) come from
`b.shape_of(tensor)` / `b.ints(values)`, which compute the dimensions that depend on a dynamic
axis from the input's `Shape`; everything else is static.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._core import dtype as dt
from .export import Lin, OnnxExporterError, UnsupportedOperatorError

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

_ONNX_TYPES = {"bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "int16": "INT16",
               "int32": "INT32", "int64": "INT64", "float16": "FLOAT16",
               "bfloat16": "BFLOAT16", "float32": "FLOAT", "float64": "DOUBLE"}


def onnx_type(onnx, d: dt.DType) -> int:
    return getattr(onnx.TensorProto, _ONNX_TYPES[d.name])


def _has_lin(v) -> bool:
    if isinstance(v, Lin):
        return True
    if isinstance(v, (tuple, list)):
        return any(_has_lin(x) for x in v)
    return False


def lin_add(a, b):
    """a + b for ints and `Lin`s."""
    if not isinstance(a, Lin) and not isinstance(b, Lin):
        return a + b
    a = a if isinstance(a, Lin) else Lin(a, {})
    b = b if isinstance(b, Lin) else Lin(b, {})
    k = dict(a.k)
    for s, v in b.k.items():
        k[s] = k.get(s, 0) + v
    return Lin(a.c + b.c, k)


class Builder:
    """Collects ONNX nodes and initializers for one Job."""

    def __init__(self, onnx, job, sym_shapes, sym_attrs, opset, sym_src):
        self.onnx = onnx
        self.job = job
        self.sym_shapes = sym_shapes
        self.sym_attrs = sym_attrs
        self.opset = opset
        self.sym_src = sym_src  # symbol -> (onnx input name, axis)
        self.nodes: list = []
        self.inits: list = []
        self._ids = itertools.count()
        self._consts: dict = {}
        self._syms: dict[str, str] = {}
        self.node_now = None  # the Job op being converted (for error messages)

    # -- names and nodes ----------------------------------------------------------------------
    def fresh(self, hint: str = "v") -> str:
        return f"_onnx_{hint}_{next(self._ids)}"

    def node(self, op_type: str, inputs, n_out: int = 1, **attrs):
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(self.onnx.helper.make_node(
            op_type, list(inputs), outs, name=self.fresh("n"), **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, array) -> str:
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self.fresh("c")
            self.inits.append(self.tensor_proto(array, name))
            self._consts[key] = name
        return name

    def tensor_proto(self, array, name):
        onnx = self.onnx
        array = np.asarray(array)
        d = dt.from_numpy(array.dtype)
        if d.name == "bfloat16":
            raise OnnxExporterError("sbpflow.onnx.export: bfloat16 constants are not supported")
        return onnx.numpy_helper.from_array(np.ascontiguousarray(array), name)

    def scalar(self, value, d: dt.DType) -> str:
        return self.const(np.asarray(value, dtype=d.np))

    # -- metas and attrs ----------------------------------------------------------------------
    def dtype(self, tensor: str) -> dt.DType:
        return self.job.tensors[tensor].dtype

    def ndim(self, tensor: str) -> int:
        return len(self.job.tensors[tensor].shape)

    def attrs(self, node) -> dict:
        return self.sym_attrs[node.name]

    def static(self, node, key):
        """Attribute `key` of `node`, which must not depend on a dynamic axis."""
        v = self.sym_attrs[node.name].get(key)
        if _has_lin(v):
            raise OnnxExporterError(
                f"sbpflow.onnx.export: attribute {key!r} of op '{node.op_type}' (module "
                f"'{node.scope}', at {node.where()}) depends on a dynamic axis, which its "
                "ONNX mapping does not support")
        return v

    def static_dim(self, node, tensor: str, axis: int) -> int:
        return self.static_shape(node, tensor, axis)[0]

    def static_shape(self, node, tensor: str, axis=None) -> tuple:
        s = self.sym_shapes[tensor]
        if axis is not None:
            s = (s[axis],)
        if _has_lin(s):
            raise OnnxExporterError(
                f"sbpflow.onnx.export: op '{node.op_type}' (module '{node.scope or '<top>'}', "
                f"at {node.where()}) needs a static shape for {tensor}, which depends on a "
                "dynamic axis")
        return tuple(s)

    # -- integers at run time -----------------------------------------------------------------
    def sym(self, s: str) -> str:
        """1-element int64 tensor: the run-time size of dynamic axis `s`."""
        name = self._syms.get(s)
        if name is None:
            src, axis = self.sym_src[s]
            name = self.node("Shape", [src], start=axis, end=axis + 1)
            self._syms[s] = name
        return name

    def lin(self, v: Lin) -> str:
        acc = None
        for s, k in v.k.items():
            term = self.sym(s)
            if k != 1:
                term = self.node("Mul", [term, self.const(np.array([k], np.int64))])
            acc = term if acc is None else self.node("Add", [acc, term])
        if v.c:
            acc = self.node("Add", [acc, self.const(np.array([v.c], np.int64))])
        return acc

    def ints(self, values) -> str:
        """A 1-D int64 tensor of `values` (ints and `Lin`s)."""
        values = list(values)
        if not _has_lin(values):
            return self.const(np.array(values, dtype=np.int64).reshape(len(values)))
        parts, run = [], []
        for v in values:
            if isinstance(v, Lin):
                if run:
                    parts.append(self.const(np.array(run, np.int64)))
                    run = []
                parts.append(self.lin(v))
            else:
                run.append(int(v))
        if run:
            parts.append(self.const(np.array(run, np.int64)))
        return parts[0] if len(parts) == 1 else self.node("Concat", parts, axis=0)

    def shape_of(self, tensor: str) -> str:
        return self.ints(self.sym_shapes[tensor])

    # -- helpers ------------------------------------------------------------------------------
    def cast(self, x: str, src: dt.DType, dst: dt.DType) -> str:
        if src == dst:
            return x
        return self.node("Cast", [x], to=onnx_type(self.onnx, dst))

    def reduce(self, op_type: str, x: str, axes, keepdims: bool) -> str:
        axes = [int(a) for a in axes]
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.node(op_type, [x, self.const(np.array(axes, np.int64))],
                             keepdims=int(keepdims))
        return self.node(op_type, [x], axes=axes, keepdims=int(keepdims))

    def reshape_to(self, x: str, tensor: str) -> str:
        return self.node("Reshape", [x, self.shape_of(tensor)], allowzero=1)


# -- converters -----------------------------------------------------------------------------------
OPS: dict = {}


def _reg(*names):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return deco


def _out_dtype(b, node, i=0):
    return b.dtype(node.outputs[i])


def _in_as_out(b, node, ins):
    """The inputs cast to the output's dtype (torch's type promotion, done explicitly)."""
    out = _out_dtype(b, node)
    return [b.cast(x, b.dtype(t), out) for x, t in zip(ins, node.inputs)]


def _unary(onnx_op, **kw):
    def conv(b, node, ins):
        return [b.node(onnx_op, _in_as_out(b, node, ins), **kw)]
    return conv


for _name, _onnx_op in {
    "relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log",
    "sqrt": "Sqrt", "neg": "Neg", "abs": "Abs", "erf": "Erf", "sin": "Sin", "cos": "Cos",
    "tan": "Tan", "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh",
    "cosh": "Cosh", "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh", "floor": "Floor",
    "ceil": "Ceil", "reciprocal": "Reciprocal", "sign": "Sign", "clone": "Identity",
    "hardswish": "HardSwish",
}.items():
    OPS[_name] = _unary(_onnx_op)
OPS["hardsigmoid"] = _unary("HardSigmoid", alpha=1.0 / 6, beta=0.5)


@_reg("logical_not")
def _not(b, node, ins):
    return [b.node("Not", [b.cast(ins[0], b.dtype(node.inputs[0]), dt.bool_)])]


@_reg("bitwise_not")
def _bitwise_not(b, node, ins):
    d = b.dtype(node.inputs[0])
    if d == dt.bool_:
        return [b.node("Not", ins)]
    if d.is_floating_point or b.opset < 18:
        raise OnnxExporterError(f"sbpflow.onnx.export: bitwise_not on {d.name} has no ONNX "
                                f"mapping at opset {b.opset}")
    return [b.node("BitwiseNot", ins)]


@_reg("isnan")
def _isnan(b, node, ins):
    return [b.node("IsNaN", ins)]


@_reg("isinf")
def _isinf(b, node, ins):
    return [b.node("IsInf", ins)]


@_reg("rsqrt")
def _rsqrt(b, node, ins):
    (x,) = _in_as_out(b, node, ins)
    return [b.node("Reciprocal", [b.node("Sqrt", [x])])]


@_reg("square")
def _square(b, node, ins):
    (x,) = _in_as_out(b, node, ins)
    return [b.node("Mul", [x, x])]


@_reg("silu")
def _silu(b, node, ins):
    (x,) = _in_as_out(b, node, ins)
    return [b.node("Mul", [x, b.node("Sigmoid", [x])])]


@_reg("mish")
def _mish(b, node, ins):
    (x,) = _in_as_out(b, node, ins)
    return [b.node("Mul", [x, b.node("Tanh", [b.node("Softplus", [x])])])]


@_reg("softplus")
def _softplus(b, node, ins):
    a = b.attrs(node)
    (x,) = _in_as_out(b, node, ins)
    d = _out_dtype(b, node)
    bx = b.node("Mul", [x, b.scalar(a["beta"], d)])
    soft = b.node("Div", [b.node("Softplus", [bx]), b.scalar(a["beta"], d)])
    big = b.node("Greater", [bx, b.scalar(a["threshold"], d)])
    return [b.node("Where", [big, x, soft])]


@_reg("gelu")
def _gelu(b, node, ins):
    approx = b.static(node, "approximate")
    (x,) = _in_as_out(b, node, ins)
    if b.opset >= 20:
        return [b.node("Gelu", [x], approximate=approx)]
    d = _out_dtype(b, node)
    half = b.node("Mul", [x, b.scalar(0.5, d)])
    if approx == "tanh":
        cube = b.node("Mul", [b.node("Mul", [x, x]), x])
        inner = b.node("Add", [x, b.node("Mul", [cube, b.scalar(0.044715, d)])])
        t = b.node("Tanh", [b.node("Mul", [inner, b.scalar(math.sqrt(2 / math.pi), d)])])
    else:
        t = b.node("Erf", [b.node("Mul", [x, b.scalar(1 / math.sqrt(2), d)])])
    return [b.node("Mul", [half, b.node("Add", [t, b.scalar(1.0, d)])])]


@_reg("leaky_relu")
def _leaky(b, node, ins):
    return [b.node("LeakyRelu", _in_as_out(b, node, ins),
                   alpha=float(b.static(node, "negative_slope")))]


@_reg("elu")
def _elu(b, node, ins):
    a = b.attrs(node)
    (x,) = _in_as_out(b, node, ins)
    d = _out_dtype(b, node)
    neg = b.node("Mul", [b.scalar(a["alpha"], d), b.node("Sub", [
        b.node("Exp", [b.node("Mul", [x, b.scalar(a["input_scale"], d)])]), b.scalar(1.0, d)])])
    pos = b.node("Greater", [x, b.scalar(0, d)])
    return [b.node("Mul", [b.node("Where", [pos, x, neg]), b.scalar(a["scale"], d)])]


def _clip(b, node, x, lo, hi):
    d = _out_dtype(b, node)
    ins = [x, b.scalar(lo, d) if lo is not None else "", b.scalar(hi, d) if hi is not None else ""]
    while ins[-1] == "":
        ins.pop()
    return b.node("Clip", ins)


@_reg("hardtanh")
def _hardtanh(b, node, ins):
    (x,) = _in_as_out(b, node, ins)
    return [_clip(b, node, x, b.static(node, "min_val"), b.static(node, "max_val"))]


@_reg("clamp")
def _clamp(b, node, ins):
    (x,) = _in_as_out(b, node, ins)
    return [_clip(b, node, x, b.static(node, "min"), b.static(node, "max"))]


@_reg("clamp_min", "clamp_max", "maximum", "minimum")
def _minmax(b, node, ins):
    op = "Max" if node.op_type in ("clamp_min", "maximum") else "Min"
    return [b.node(op, _in_as_out(b, node, ins))]


@_reg("round")
def _round(b, node, ins):
    if b.static(node, "decimals"):
        raise OnnxExporterError("sbpflow.onnx.export: round(decimals != 0) has no ONNX mapping")
    return [b.node("Round", _in_as_out(b, node, ins))]


# binary arithmetic and comparisons
for _name, _onnx_op in {"add": "Add", "sub": "Sub", "mul": "Mul", "pow": "Pow"}.items():
    OPS[_name] = _unary(_onnx_op)


@_reg("div")
def _div(b, node, ins):
    if b.static(node, "rounding_mode") is not None or not _out_dtype(b, node).is_floating_point:
        raise OnnxExporterError("sbpflow.onnx.export: div with a rounding_mode has no ONNX "
                                "mapping in sbpflow")
    return [b.node("Div", _in_as_out(b, node, ins))]


_CMP = {"eq": "Equal", "ne": "Equal", "lt": "Less", "gt": "Greater", "le": "LessOrEqual",
        "ge": "GreaterOrEqual"}


def _compare(b, op, x, y):
    out = b.node(_CMP[op], [x, y])
    return b.node("Not", [out]) if op == "ne" else out


def _cmp_conv(op):
    def conv(b, node, ins):
        d = dt.promote_types(b.dtype(node.inputs[0]), b.dtype(node.inputs[1]))
        x, y = (b.cast(v, b.dtype(t), d) for v, t in zip(ins, node.inputs))
        return [_compare(b, op, x, y)]
    return conv


for _name in _CMP:
    OPS[_name] = _cmp_conv(_name)


def _logic(op):
    def conv(b, node, ins):
        xs = [b.cast(v, b.dtype(t), dt.bool_) for v, t in zip(ins, node.inputs)]
        return [b.node(op, xs)]
    return conv


OPS["logical_and"] = _logic("And")
OPS["logical_or"] = _logic("Or")
OPS["logical_xor"] = _logic("Xor")


def _scalar_arith(op):
    def conv(b, node, ins):
        a = b.attrs(node)
        if a.get("rounding_mode") is not None:
            raise OnnxExporterError("sbpflow.onnx.export: div with a rounding_mode has no "
                                    "ONNX mapping in sbpflow")
        d = _out_dtype(b, node)
        (x,) = _in_as_out(b, node, ins)
        c = b.scalar(a["other"], d)
        return [b.node(op, [c, x] if a["reverse"] else [x, c])]
    return conv


for _name, _onnx_op in {"add_scalar": "Add", "sub_scalar": "Sub", "mul_scalar": "Mul",
                        "div_scalar": "Div", "pow_scalar": "Pow"}.items():
    OPS[_name] = _scalar_arith(_onnx_op)


def _scalar_cmp(op):
    def conv(b, node, ins):
        a = b.attrs(node)
        src = b.dtype(node.inputs[0])
        v = a["other"]
        d = src if (src.is_floating_point or not isinstance(v, float)) else dt.float32
        x = b.cast(ins[0], src, d)
        c = b.scalar(v, d)
        return [_compare(b, op, c, x) if a["reverse"] else _compare(b, op, x, c)]
    return conv


for _name in _CMP:
    OPS[f"{_name}_scalar"] = _scalar_cmp(_name)


@_reg("where")
def _where(b, node, ins):
    d = _out_dtype(b, node)
    cond = b.cast(ins[0], b.dtype(node.inputs[0]), dt.bool_)
    x = b.cast(ins[1], b.dtype(node.inputs[1]), d)
    y = b.cast(ins[2], b.dtype(node.inputs[2]), d)
    return [b.node("Where", [cond, x, y])]


@_reg("masked_fill")
def _masked_fill(b, node, ins):
    d = _out_dtype(b, node)
    x = b.cast(ins[0], b.dtype(node.inputs[0]), d)
    mask = b.cast(ins[1], b.dtype(node.inputs[1]), dt.bool_)
    return [b.node("Where", [mask, b.scalar(b.static(node, "value"), d), x])]


# -- linear algebra and NN ops --------------------------------------------------------------------
@_reg("matmul", "mm", "bmm")
def _matmul(b, node, ins):
    return [b.node("MatMul", _in_as_out(b, node, ins))]


@_reg("linear")
def _linear(b, node, ins):
    ins = _in_as_out(b, node, ins)
    w = ins[1]
    if b.ndim(node.inputs[1]) == 2:
        w = b.node("Transpose", [w], perm=[1, 0])
    y = b.node("MatMul", [ins[0], w])
    if len(ins) > 2:
        y = b.node("Add", [y, ins[2]])
    return [y]


@_reg("embedding")
def _embedding(b, node, ins):
    return [b.node("Gather", [ins[1], ins[0]], axis=0)]


@_reg("layer_norm")
def _layer_norm(b, node, ins):
    ns = b.static(node, "normalized_shape")
    d = _out_dtype(b, node)
    ins = _in_as_out(b, node, ins)
    if len(ins) < 2:
        ins.append(b.const(np.ones(ns, d.np)))
    return [b.node("LayerNormalization", ins, axis=-len(ns), epsilon=float(b.static(node, "eps")))]


def _softmax(op):
    def conv(b, node, ins):
        (x,) = _in_as_out(b, node, ins)
        return [b.node(op, [x], axis=int(b.static(node, "dim")))]
    return conv


OPS["softmax"] = _softmax("Softmax")
OPS["log_softmax"] = _softmax("LogSoftmax")


def _tup(v, n, default=None):
    if v is None or (isinstance(v, (tuple, list)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


@_reg("conv1d", "conv2d", "conv3d")
def _conv(b, node, ins):
    n = b.ndim(node.inputs[1]) - 2
    pad = b.static(node, "padding")
    kw = {}
    dil = _tup(b.static(node, "dilation"), n, 1)
    if isinstance(pad, str):
        if pad == "same":  # torch: the odd padding element goes at the end
            k = [b.static_dim(node, node.inputs[1], 2 + a) for a in range(n)]
            total = [d * (kk - 1) for d, kk in zip(dil, k)]
            kw["pads"] = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            kw["pads"] = [0] * (2 * n)
    else:
        p = _tup(pad, n)
        kw["pads"] = p + p
    ins = _in_as_out(b, node, ins)
    return [b.node("Conv", ins, strides=_tup(b.static(node, "stride"), n, 1),
                   dilations=dil, group=int(b.static(node, "groups")), **kw)]


def _used(b, tensor: str) -> bool:
    return any(tensor in op.inputs for op in b.job.ops)


@_reg("max_pool1d", "max_pool2d", "max_pool3d")
def _max_pool(b, node, ins):
    n = b.ndim(node.inputs[0]) - 2
    k = _tup(b.static(node, "kernel_size"), n)
    p = _tup(b.static(node, "padding"), n, 0)
    if len(node.outputs) > 1 and _used(b, node.outputs[1]):
        raise UnsupportedOperatorError(
            f"sbpflow.onnx.export: op '{node.op_type}' with return_indices=True (module "
            f"'{node.scope}', at {node.where()}) has no ONNX mapping (ONNX's MaxPool indices "
            "count over the whole tensor, torch's per channel)")
    y = b.node("MaxPool", ins, kernel_shape=k, strides=_tup(b.static(node, "stride"), n, k),
               pads=p + p, dilations=_tup(b.static(node, "dilation"), n, 1),
               ceil_mode=int(bool(b.static(node, "ceil_mode"))))
    return [y] + [None] * (len(node.outputs) - 1)


@_reg("avg_pool1d", "avg_pool2d", "avg_pool3d")
def _avg_pool(b, node, ins):
    n = b.ndim(node.inputs[0]) - 2
    if b.static(node, "divisor_override") is not None:
        raise OnnxExporterError(f"sbpflow.onnx.export: {node.op_type}(divisor_override=...) "
                                "has no ONNX mapping")
    k = _tup(b.static(node, "kernel_size"), n)
    p = _tup(b.static(node, "padding"), n, 0)
    return [b.node("AveragePool", ins, kernel_shape=k,
                   strides=_tup(b.static(node, "stride"), n, k), pads=p + p,
                   ceil_mode=int(bool(b.static(node, "ceil_mode"))),
                   count_include_pad=int(bool(b.static(node, "count_include_pad"))))]


@_reg("adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d")
def _adaptive_avg(b, node, ins):
    n = b.ndim(node.inputs[0]) - 2
    src = [b.static_dim(node, node.inputs[0], a) for a in range(2, n + 2)]
    out = [b.static_dim(node, node.outputs[0], a) for a in range(2, n + 2)]
    if all(o == 1 for o in out):
        return [b.node("GlobalAveragePool", ins)]
    if any(s % o for s, o in zip(src, out)):
        raise OnnxExporterError(
            f"sbpflow.onnx.export: {node.op_type} from {tuple(src)} to {tuple(out)} (module "
            f"'{node.scope}', at {node.where()}): only output sizes that divide the input map "
            "to ONNX")
    k = [s // o for s, o in zip(src, out)]
    return [b.node("AveragePool", ins, kernel_shape=k, strides=k, pads=[0] * (2 * n))]


@_reg("lstm_cell")
def _lstm_cell(b, node, ins):
    gates, c_prev = _in_as_out(b, node, ins)
    h = b.static_dim(node, node.inputs[1], 1)
    i, f, g, o = b.node("Split", [gates, b.const(np.array([h] * 4, np.int64))], n_out=4, axis=1)
    i, f, o = (b.node("Sigmoid", [v]) for v in (i, f, o))
    g = b.node("Tanh", [g])
    c = b.node("Add", [b.node("Mul", [f, c_prev]), b.node("Mul", [i, g])])
    hy = b.node("Mul", [o, b.node("Tanh", [c])])
    return [hy, c]


def _recurrent_layer(b, node, ins, workspace: int, blocks):
    """What ONNX's LSTM and GRU nodes share, for a `*_layer` op over the projected sequence
    `proj` (ins[0]): X is proj, so W is the permutation matrix taking torch's gate blocks to
    ONNX's order (`blocks`: torch's block index for each ONNX block); the caller reorders
    w_hh's rows by the returned `order` for R.  The backward workspace (output `workspace`)
    has no ONNX form: nothing in inference reads it.  Returns (the inputs cast to the output
    dtype, hidden size, order, W, the int64 constant 0)."""
    if _used(b, node.outputs[workspace]):
        raise UnsupportedOperatorError(
            f"sbpflow.onnx.export: {node.op_type}'s backward workspace (module "
            f"'{node.scope or '<top>'}', at {node.where()}) has no ONNX mapping")
    ins = _in_as_out(b, node, ins)
    d = _out_dtype(b, node)
    hs = b.static_dim(node, node.outputs[0], 2)
    order = np.concatenate([np.arange(k * hs, (k + 1) * hs) for k in blocks])
    w = b.const(np.eye(len(blocks) * hs, dtype=d.np)[order][None])
    return ins, hs, order, w, b.const(np.zeros(1, np.int64))


def _direction(b, node):
    return "reverse" if b.static(node, "reverse") else "forward"


@_reg("lstm_layer")
def _lstm_layer(b, node, ins):
    """ONNX's LSTM (gate order i, o, f, c) with B = 0: both biases are already in proj."""
    (proj, h0, c0, w_hh), hs, order, w, zero = _recurrent_layer(b, node, ins, 2, (0, 3, 1, 2))
    r = b.node("Unsqueeze", [b.node("Gather", [w_hh, b.const(order)], axis=0), zero])
    bias = b.const(np.zeros((1, 8 * hs), _out_dtype(b, node).np))
    h0, c0 = (b.node("Unsqueeze", [x, zero]) for x in (h0, c0))
    y, _, c_n = b.node("LSTM", [proj, w, r, bias, "", h0, c0], n_out=3, hidden_size=hs,
                       direction=_direction(b, node))
    one = b.const(np.ones(1, np.int64))
    return [b.node("Squeeze", [y, one]), b.node("Squeeze", [c_n, zero]), None]


@_reg("gru_layer")
def _gru_layer(b, node, ins):
    """ONNX's GRU (gate order z, r, h) with linear_before_reset, torch's form: B is
    (0, b_hh reordered), the input bias being already in proj."""
    (proj, h0, w_hh, b_hh), hs, order, w, zero = _recurrent_layer(b, node, ins, 1, (1, 0, 2))
    gather = b.const(order)
    r = b.node("Unsqueeze", [b.node("Gather", [w_hh, gather], axis=0), zero])
    bias = b.node("Concat", [b.const(np.zeros(3 * hs, _out_dtype(b, node).np)),
                             b.node("Gather", [b_hh, gather], axis=0)], axis=0)
    y, _ = b.node("GRU", [proj, w, r, b.node("Unsqueeze", [bias, zero]), "",
                          b.node("Unsqueeze", [h0, zero])], n_out=2, hidden_size=hs,
                  linear_before_reset=1, direction=_direction(b, node))
    return [b.node("Squeeze", [y, b.const(np.ones(1, np.int64))]), None]


@_reg("gru_cell")
def _gru_cell(b, node, ins):
    gi, gh, h_prev = _in_as_out(b, node, ins)
    h = b.static_dim(node, node.inputs[2], 1)
    sizes = b.const(np.array([h] * 3, np.int64))
    ir, iz, in_ = b.node("Split", [gi, sizes], n_out=3, axis=1)
    hr, hz, hn = b.node("Split", [gh, sizes], n_out=3, axis=1)
    r = b.node("Sigmoid", [b.node("Add", [ir, hr])])
    z = b.node("Sigmoid", [b.node("Add", [iz, hz])])
    n = b.node("Tanh", [b.node("Add", [in_, b.node("Mul", [r, hn])])])
    return [b.node("Add", [n, b.node("Mul", [z, b.node("Sub", [h_prev, n])])])]


@_reg("nll_loss")
def _nll_loss(b, node, ins):
    a = b.attrs(node)
    if b.ndim(node.inputs[0]) < 2:
        raise OnnxExporterError(
            f"sbpflow.onnx.export: nll_loss on an unbatched input (module "
            f"'{node.scope or '<top>'}', at {node.where()}) has no ONNX mapping")
    d = _out_dtype(b, node)
    x = b.cast(ins[0], b.dtype(node.inputs[0]), d)
    w = b.cast(ins[2], b.dtype(node.inputs[2]), d)
    target = b.cast(ins[1], b.dtype(node.inputs[1]), dt.int64)
    ignore = int(b.static(node, "ignore_index"))
    loss = b.node("NegativeLogLikelihoodLoss", [x, target, w], reduction=a["reduction"],
                  ignore_index=ignore)
    total = None
    if len(node.outputs) > 1 and _used(b, node.outputs[1]):
        valid = b.node("Not", [b.node("Equal", [target, b.scalar(ignore, dt.int64)])])
        safe = b.node("Where", [valid, target, b.scalar(0, dt.int64)])
        wt = b.node("Mul", [b.node("Gather", [w, safe], axis=0),
                            b.node("Cast", [valid], to=onnx_type(b.onnx, d))])
        total = b.node("ReduceSum", [wt], keepdims=0)
    return [loss, total]


# -- reductions -----------------------------------------------------------------------------------
def _axes_of(b, node, dim):
    nd = b.ndim(node.inputs[0])
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return list(range(nd))
    if isinstance(dim, int):
        dim = (dim,)
    return [int(d) % max(nd, 1) for d in dim]


def _reduction(op):
    def conv(b, node, ins):
        a = b.attrs(node)
        axes = _axes_of(b, node, b.static(node, "dim") if "dim" in a else None)
        (x,) = _in_as_out(b, node, ins)
        if not axes:
            return [x]
        return [b.node("Identity", [b.reduce(op, x, axes, bool(a.get("keepdim", False)))])]
    return conv


OPS["sum"] = _reduction("ReduceSum")
OPS["mean"] = _reduction("ReduceMean")
OPS["amax"] = _reduction("ReduceMax")
OPS["amin"] = _reduction("ReduceMin")
OPS["max"] = _reduction("ReduceMax")
OPS["min"] = _reduction("ReduceMin")
OPS["prod"] = _reduction("ReduceProd")
OPS["logsumexp"] = _reduction("ReduceLogSumExp")


def _boolean_reduction(op):
    def conv(b, node, ins):
        a = b.attrs(node)
        axes = _axes_of(b, node, b.static(node, "dim"))
        x = b.node("Cast", [ins[0]], to=onnx_type(b.onnx, dt.bool_))
        x = b.node("Cast", [x], to=onnx_type(b.onnx, dt.int32))
        y = b.reduce(op, x, axes, bool(a.get("keepdim", False))) if axes else x
        return [b.node("Cast", [y], to=onnx_type(b.onnx, dt.bool_))]
    return conv


OPS["all"] = _boolean_reduction("ReduceMin")
OPS["any"] = _boolean_reduction("ReduceMax")


def _arg(op):
    def conv(b, node, ins):
        dim = b.static(node, "dim")
        keep = bool(b.static(node, "keepdim"))
        x = ins[0]
        if dim is None:
            x = b.node("Reshape", [x, b.const(np.array([-1], np.int64))])
            return [b.reshape_to(b.node(op, [x], axis=0, keepdims=0), node.outputs[0])]
        return [b.node(op, [x], axis=int(dim), keepdims=int(keep))]
    return conv


OPS["argmax"] = _arg("ArgMax")
OPS["argmin"] = _arg("ArgMin")


@_reg("cumsum")
def _cumsum(b, node, ins):
    (x,) = _in_as_out(b, node, ins)
    return [b.node("CumSum", [x, b.const(np.array(int(b.static(node, "dim")), np.int64))])]


# -- shapes and indexing --------------------------------------------------------------------------
@_reg("view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze")
def _reshape(b, node, ins):
    return [b.reshape_to(ins[0], node.outputs[0])]


@_reg("expand")
def _expand(b, node, ins):
    return [b.node("Expand", [ins[0], b.shape_of(node.outputs[0])])]


@_reg("transpose")
def _transpose(b, node, ins):
    nd = b.ndim(node.inputs[0])
    perm = list(range(nd))
    d0, d1 = (int(b.static(node, k)) % max(nd, 1) for k in ("dim0", "dim1"))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return [b.node("Transpose", ins, perm=perm)]


@_reg("permute")
def _permute(b, node, ins):
    nd = b.ndim(node.inputs[0])
    return [b.node("Transpose", ins, perm=[int(d) % nd for d in b.static(node, "dims")])]


@_reg("to_dtype")
def _to_dtype(b, node, ins):
    return [b.node("Identity", [b.cast(ins[0], b.dtype(node.inputs[0]), _out_dtype(b, node))])]


def _slice(b, x, starts, ends, axes, steps):
    return b.node("Slice", [x, b.ints(starts), b.ints(ends),
                            b.const(np.array(axes, np.int64)), b.ints(steps)])


@_reg("narrow")
def _narrow(b, node, ins):
    a = b.attrs(node)
    dim = int(b.static(node, "dim")) % b.ndim(node.inputs[0])
    start = a["start"]
    if isinstance(start, int) and start < 0:
        start = lin_add(start, b.sym_shapes[node.inputs[0]][dim])
    end = lin_add(start, a["length"])
    return [_slice(b, ins[0], [start], [end], [dim], [1])]


@_reg("select")
def _select(b, node, ins):
    dim = int(b.static(node, "dim")) % b.ndim(node.inputs[0])
    idx = b.ints([b.attrs(node)["index"]])
    return [b.reshape_to(b.node("Gather", [ins[0], idx], axis=dim), node.outputs[0])]


@_reg("slice")
def _basic_slice(b, node, ins):
    key = b.attrs(node)["key"]
    nd = b.ndim(node.inputs[0])
    n_dims = sum(1 for e in key if e[0] in ("slice", "int"))
    starts, ends, axes, steps = [], [], [], []
    d = 0
    for e in key:
        kind = e[0]
        if kind == "ellipsis":
            d += nd - n_dims
        elif kind == "slice":
            _, s, t, st = e
            st = 1 if st is None else st
            if not (s is None and t is None and st == 1):
                starts.append(0 if s is None else s)
                ends.append(INT64_MAX if t is None else t)
                axes.append(d)
                steps.append(st)
            d += 1
        elif kind == "int":
            i = e[1]
            starts.append(i)
            ends.append(INT64_MAX if (isinstance(i, int) and i == -1) else lin_add(i, 1))
            axes.append(d)
            steps.append(1)
            d += 1
    x = ins[0]
    if axes:
        x = _slice(b, x, starts, ends, axes, steps)
    return [b.reshape_to(x, node.outputs[0])]


@_reg("cat")
def _cat(b, node, ins):
    nd = b.ndim(node.outputs[0])
    return [b.node("Concat", _in_as_out(b, node, ins), axis=int(b.static(node, "dim")) % nd)]


@_reg("stack")
def _stack(b, node, ins):
    nd = b.ndim(node.outputs[0])
    axis = int(b.static(node, "dim")) % nd
    ax = b.const(np.array([axis], np.int64))
    parts = [b.node("Unsqueeze", [x, ax]) for x in _in_as_out(b, node, ins)]
    return [b.node("Concat", parts, axis=axis)]


@_reg("flip")
def _flip(b, node, ins):
    nd = b.ndim(node.inputs[0])
    dims = [int(d) % nd for d in b.static(node, "dims")]
    return [_slice(b, ins[0], [-1] * len(dims), [INT64_MIN] * len(dims), dims,
                   [-1] * len(dims))]


@_reg("repeat")
def _repeat(b, node, ins):
    reps = list(b.attrs(node)["repeats"])
    nd = b.ndim(node.inputs[0])
    x = ins[0]
    if len(reps) > nd:
        lead = [1] * (len(reps) - nd)
        x = b.node("Reshape", [x, b.ints(lead + list(b.sym_shapes[node.inputs[0]]))])
    return [b.node("Tile", [x, b.ints(reps)])]


@_reg("triu", "tril")
def _trilu(b, node, ins):
    k = b.const(np.array(int(b.static(node, "diagonal")), np.int64))
    return [b.node("Trilu", [ins[0], k], upper=int(node.op_type == "triu"))]


@_reg("gather")
def _gather(b, node, ins):
    axis = int(b.static(node, "dim")) % max(b.ndim(node.inputs[0]), 1)
    return [b.node("GatherElements", ins, axis=axis)]


@_reg("index_select")
def _index_select(b, node, ins):
    axis = int(b.static(node, "dim")) % max(b.ndim(node.inputs[0]), 1)
    return [b.node("Gather", ins, axis=axis)]


@_reg("pad")
def _pad(b, node, ins):
    a = b.attrs(node)
    pad = list(b.static(node, "pad"))
    nd = b.ndim(node.inputs[0])
    begins, ends = [0] * nd, [0] * nd
    for j in range(len(pad) // 2):
        begins[nd - 1 - j] = pad[2 * j]
        ends[nd - 1 - j] = pad[2 * j + 1]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
            "circular": "wrap"}.get(a["mode"])
    if mode is None or (mode == "wrap" and b.opset < 19):
        raise OnnxExporterError(f"sbpflow.onnx.export: pad mode {a['mode']!r} has no ONNX "
                                f"mapping at opset {b.opset}")
    inputs = [ins[0], b.const(np.array(begins + ends, np.int64))]
    if mode == "constant":
        inputs.append(b.scalar(a["value"] or 0, b.dtype(node.inputs[0])))
    return [b.node("Pad", inputs, mode=mode)]


@_reg("topk")
def _topk(b, node, ins):
    a = b.attrs(node)
    k = b.ints([a["k"]])
    dim = int(b.static(node, "dim")) % b.ndim(node.inputs[0])
    vals, idx = b.node("TopK", [ins[0], k], n_out=2, axis=dim,
                       largest=int(bool(a["largest"])), sorted=1)
    return [vals, idx]


# -- factories ------------------------------------------------------------------------------------
@_reg("full")
def _full(b, node, ins):
    d = _out_dtype(b, node)
    value = b.tensor_proto(np.array([b.static(node, "fill_value")], d.np), "value")
    return [b.node("ConstantOfShape", [b.shape_of(node.outputs[0])], value=value)]


@_reg("arange")
def _arange(b, node, ins):
    a = b.attrs(node)
    d = _out_dtype(b, node)
    if not _has_lin([a["start"], a["end"], a["step"]]):
        n = b.job.tensors[node.outputs[0]].shape[0]
        values = a["start"] + a["step"] * np.arange(n, dtype=np.float64)
        return [b.node("Identity", [b.const(values.astype(d.np))])]
    scal = [b.node("Reshape", [b.ints([v]), b.const(np.zeros(0, np.int64))])
            for v in (a["start"], a["end"], a["step"])]
    return [b.cast(b.node("Range", scal), dt.int64, d)]


@_reg("dropout")
def _dropout(b, node, ins):
    if b.static(node, "p") == 0:
        return [b.node("Identity", ins)]
    raise UnsupportedOperatorError(
        f"sbpflow.onnx.export: op 'dropout' (training mode; module '{node.scope}', at "
        f"{node.where()}) has no ONNX mapping: export the model in eval mode")


# -- the graph ------------------------------------------------------------------------------------
def supported_ops() -> list[str]:
    """The Job op types that map to ONNX."""
    return sorted(OPS)


def build_graph(onnx, job, in_names, out_names, in_axes, out_axes, sym_shapes, sym_attrs,
                opset):
    helper = onnx.helper
    inputs = job.inputs()
    sym_src = {}
    for op, axes in zip(inputs, in_axes):
        for a, s in axes.items():
            sym_src.setdefault(s, (in_names[op.attrs["index"]], a))
    b = Builder(onnx, job, sym_shapes, sym_attrs, opset, sym_src)
    names: dict[str, str] = {}  # Job tensor -> ONNX name
    graph_inputs = []
    for op in inputs:
        i = op.attrs["index"]
        t = job.tensors[op.outputs[0]]
        names[t.name] = in_names[i]
        dims = [in_axes[i].get(a, n) for a, n in enumerate(t.shape)]
        graph_inputs.append(helper.make_tensor_value_info(
            in_names[i], onnx_type(onnx, t.dtype), dims))
    outputs = job.outputs()
    used = {i for op in job.ops for i in op.inputs}
    for op in job.ops:
        if op.op_type in ("input", "output", "assign"):
            continue  # assign: a buffer write; not part of the exported function
        if op.op_type == "variable":
            var = job.variables[op.attrs["var"]]
            if op.outputs[0] in used:
                arr = var.tensor.detach().numpy()
                b.inits.append(b.tensor_proto(arr, op.outputs[0]))
                names[op.outputs[0]] = op.outputs[0]
            continue
        if op.op_type == "constant":
            names[op.outputs[0]] = b.const(op.attrs["value"])
            continue
        conv = OPS.get(op.op_type)
        if conv is None:
            raise UnsupportedOperatorError(
                f"sbpflow.onnx.export: op '{op.op_type}' (module "
                f"'{op.scope or '<top>'}', at {op.where()}) has no ONNX mapping in sbpflow; "
                "sbpflow.onnx.supported_ops() lists the ops that export")
        b.node_now = op
        outs = conv(b, op, [names[i] for i in op.inputs])
        for t, o in zip(op.outputs, outs):
            if o is not None:
                names[t] = o
    graph_outputs = []
    for op, name, axes in zip(outputs, out_names, out_axes):
        src = op.inputs[0]
        b.nodes.append(helper.make_node("Identity", [names[src]], [name], name=b.fresh("n")))
        dims = []
        for a, n in enumerate(sym_shapes[src]):
            if a in axes:
                dims.append(axes[a])
            elif isinstance(n, Lin):
                only = n.c == 0 and len(n.k) == 1 and next(iter(n.k.values())) == 1
                dims.append(next(iter(n.k)) if only else f"{name}_dim_{a}")
            else:
                dims.append(int(n))
        graph_outputs.append(helper.make_tensor_value_info(
            name, onnx_type(onnx, job.tensors[src].dtype), dims))
    return helper.make_graph(b.nodes, job.name, graph_inputs, graph_outputs,
                             initializer=b.inits)
