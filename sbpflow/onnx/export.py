"""`sbpflow.onnx.export`: a model traced into a Job (the nn.Graph IR), written as ONNX.

How it works:
1. The eager module's `forward` (or an `nn.Graph`'s `build`) is traced by the same lazy
   interpreter that `nn.Graph` uses (`graph.trace.trace_build`) into a forward-only Job; no
   pass runs (the autograd/optimizer passes would add training, the others only optimise).
2. With `dynamic_axes`, every input dimension named there is a symbol.  The model is traced
   once more per symbol with that dimension changed; every Job tensor's shape and every
   integer attribute that changed is then a linear function of the symbols (`Lin`), which
   the ONNX graph computes at run time from the input's `Shape`.  A trace whose ops change
   with the size cannot be exported with that axis dynamic, and says so.
3. Each op node becomes ONNX nodes through the table in `ops.py`; variables (parameters,
   buffers, captured tensors) become initializers.  An op with no mapping raises
   `UnsupportedOperatorError` naming the op, its module scope and the user's line.
4. `onnx.checker.check_model` checks the model before it is written.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings

import numpy as np

from ..framework.tensor import Tensor
from ..graph.ir import Job
from ..graph.trace import flatten, trace_build, unflatten

DEFAULT_OPSET = 20  # torch.onnx's default
MIN_OPSET = 17  # LayerNormalization


class OnnxExporterError(RuntimeError):
    """torch.onnx's error type."""


class UnsupportedOperatorError(OnnxExporterError):
    """An op of the traced model has no ONNX mapping (torch.onnx.errors' name)."""


_EXPORTING = [False]


def is_in_onnx_export() -> bool:
    return _EXPORTING[0]


def _onnx():
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "sbpflow.onnx.export needs the 'onnx' package: pip install 'sbpflow[onnx]'") from e
    return onnx


# -- linear expressions of the dynamic axes ------------------------------------------------------
class Lin:
    """c + sum(k[s] * s): an integer that depends on the dynamic dimensions `s`."""

    __slots__ = ("c", "k")

    def __init__(self, c: int, k: dict[str, int]):
        self.c = int(c)
        self.k = {s: int(v) for s, v in k.items() if v}

    def __repr__(self):
        terms = " + ".join(f"{v}*{s}" for s, v in self.k.items())
        return f"Lin({terms} + {self.c})"


def _diff(base, others: dict[str, tuple], sizes: dict[str, int], where: str):
    """Compare an attribute (nested tuples of scalars) of the base trace with its value in
    each perturbed trace (symbol -> (value, delta)); ints that changed become `Lin`."""
    if isinstance(base, (tuple, list)):
        for v, _ in others.values():
            if not isinstance(v, (tuple, list)) or len(v) != len(base):
                raise OnnxExporterError(f"{where} changes structure with a dynamic axis")
        return type(base)(_diff(b, {s: (v[i], d) for s, (v, d) in others.items()}, sizes,
                                f"{where}[{i}]") for i, b in enumerate(base))
    k = {}
    for s, (v, d) in others.items():
        if isinstance(base, np.ndarray) or isinstance(v, np.ndarray):
            if not np.array_equal(base, v):
                raise OnnxExporterError(f"{where} depends on dynamic axis {s!r}")
            continue
        if v == base or (v != v and base != base):  # equal, or both NaN
            continue
        if (isinstance(base, bool) or not isinstance(base, (int, np.integer))
                or not isinstance(v, (int, np.integer))):
            raise OnnxExporterError(f"{where} depends on dynamic axis {s!r} ({base!r} vs {v!r})")
        step = int(v) - int(base)
        if step % d:
            raise OnnxExporterError(
                f"{where} is not a linear function of dynamic axis {s!r} ({base} vs {v})")
        k[s] = step // d
    if not k:
        return base
    return Lin(int(base) - sum(kv * sizes[s] for s, kv in k.items()), k)


# -- the export ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _eval_mode(modules, training):
    """torch.onnx's TrainingMode.EVAL default: modules in eval mode while tracing."""
    saved = [(m, m.training) for mod in modules for m in mod.modules()]
    if training in (None, False) or getattr(training, "name", None) == "EVAL":
        for m, _ in saved:
            m.training = False
    elif training is True or getattr(training, "name", None) == "TRAINING":
        for m, _ in saved:
            m.training = True
    try:
        yield
    finally:
        for m, mode in saved:
            m.training = mode


def _target(model):
    """(build function, {attr: module}, default input names) of a module or an nn.Graph."""
    from ..nn.graph import Graph
    from ..nn.modules.module import Module

    if isinstance(model, Graph):
        return model.build, dict(model._modules), _param_names(model.build)
    if isinstance(model, Module):
        return model.forward, {"": model}, _param_names(model.forward)
    raise TypeError(f"sbpflow.onnx.export: model must be an nn.Module or an nn.Graph, got "
                    f"{type(model).__name__}")


def _param_names(fn) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _trace(build, modules, args, kwargs) -> tuple[Job, object]:
    job = Job("onnx_export")
    out_spec = trace_build(job, build, args, kwargs, modules)
    if any("writeback" in op.attrs for op in job.outputs()):
        raise NotImplementedError(
            "onnx.export: the model writes one of its inputs in place; an ONNX graph has no "
            "in-place inputs, so compute the new value out of place and return it")
    return job, out_spec


def _resized(leaves, axes_of: list[dict[int, str]], sym: str, new: int):
    """The input tensors with every dimension named `sym` set to `new` (zeros: a trace reads
    only shapes)."""
    from .. import zeros

    out = []
    for t, axes in zip(leaves, axes_of):
        shape = [new if axes.get(a) == sym else n for a, n in enumerate(t.shape)]
        if shape == list(t.shape):
            out.append(t)
        else:
            out.append(zeros(*shape, dtype=t.dtype))
    return out


def _axes(spec, n_dims: int, name: str) -> dict[int, str]:
    if isinstance(spec, dict):
        items = spec.items()
    else:
        items = [(a, f"{name}_dynamic_axes_{i + 1}") for i, a in enumerate(spec)]
    out = {}
    for a, s in items:
        if not isinstance(a, int) or not -n_dims <= a < n_dims:
            raise ValueError(f"sbpflow.onnx.export: dynamic_axes[{name!r}]: axis {a!r} is out "
                             f"of range for a tensor of {n_dims} dimensions")
        out[a % n_dims] = str(s)
    return out


def export(model, args=(), f=None, *, kwargs=None, verbose=None, input_names=None,
           output_names=None, opset_version=None, dynamo=True, export_params=True,
           keep_initializers_as_inputs=False, dynamic_axes=None, training=None,
           do_constant_folding=True, dynamic_shapes=None, **unsupported):
    """Export `model` (an `nn.Module` or an `nn.Graph`) run on `args` to ONNX at `f` (a path
    or a binary file object).  Returns the `onnx.ModelProto` when `f` is None, else None.

    `dynamo` and `do_constant_folding` are accepted for torch's signature: sbpflow has one
    exporter (the Job trace), and the model is written as traced."""
    onnx = _onnx()
    if unsupported:
        raise NotImplementedError(
            f"sbpflow.onnx.export: argument(s) {', '.join(sorted(unsupported))} are not "
            "supported")
    if dynamic_shapes is not None:
        raise NotImplementedError(
            "sbpflow.onnx.export: dynamic_shapes is not supported; use dynamic_axes")
    if not export_params:
        raise NotImplementedError("sbpflow.onnx.export: export_params=False is not supported")
    if keep_initializers_as_inputs:
        raise NotImplementedError(
            "sbpflow.onnx.export: keep_initializers_as_inputs=True is not supported")
    opset = DEFAULT_OPSET if opset_version is None else int(opset_version)
    max_opset = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= max_opset:
        raise ValueError(f"sbpflow.onnx.export: opset_version must be in [{MIN_OPSET}, "
                         f"{max_opset}] (the installed onnx's range from LayerNormalization "
                         f"on), got {opset}")
    if isinstance(args, Tensor):
        args = (args,)
    args = tuple(args)
    kwargs = dict(kwargs or {})
    if args and isinstance(args[-1], dict) and not kwargs:
        args, kwargs = args[:-1], dict(args[-1])  # torch's trailing-dict form

    build, modules, param_names = _target(model)
    leaves: list = []
    flatten((args, kwargs), leaves)
    if any(t.is_global for t in leaves):
        raise NotImplementedError("sbpflow.onnx.export: global tensors are not supported; "
                                  "export with local tensors")
    # Input names: the user's, then forward's parameter names (one tensor each), else input_i.
    names = list(input_names or [])
    if len(names) > len(leaves):
        raise ValueError(f"sbpflow.onnx.export: {len(names)} input_names for {len(leaves)} "
                         "tensor inputs")
    plain = not kwargs and all(isinstance(a, Tensor) for a in args)
    for i in range(len(names), len(leaves)):
        use = plain and i < len(param_names)
        names.append(param_names[i] if use else f"input_{i}")

    _EXPORTING[0] = True
    try:
        with _eval_mode(modules.values(), training):
            job, out_spec = _trace(build, modules, args, kwargs)
            n_out = len(job.outputs())
            out_names = list(output_names or [])
            if len(out_names) > n_out:
                raise ValueError(f"sbpflow.onnx.export: {len(out_names)} output_names for "
                                 f"{n_out} tensor outputs")
            out_names += [f"output_{i}" if n_out > 1 or i else "output"
                          for i in range(len(out_names), n_out)]
            in_axes, out_axes = _dynamic(dynamic_axes, names, out_names, leaves, job)
            sizes = {}
            for t, axes in zip(leaves, in_axes):
                for a, s in axes.items():
                    if sizes.setdefault(s, t.shape[a]) != t.shape[a]:
                        raise ValueError(
                            f"sbpflow.onnx.export: dynamic axis {s!r} has sizes "
                            f"{sizes[s]} and {t.shape[a]} in the example inputs")
            spec = flatten((args, kwargs), [])

            def retrace(sym, size):
                a2, k2 = unflatten(spec, _resized(leaves, in_axes, sym, size))
                try:
                    return _trace(build, modules, a2, k2)[0]
                except Exception as e:
                    raise OnnxExporterError(
                        f"sbpflow.onnx.export: tracing with dynamic axis {sym!r} = {size} "
                        f"(instead of {sizes[sym]}) failed: {e}") from e

            perturbed, checks = {}, {}
            for s, n in sizes.items():
                delta = -1 if n >= 3 else 1
                perturbed[s] = (retrace(s, n + delta), delta)
                # a third size checks that what changed is linear in the size
                other = n + 2 * delta if n + 2 * delta >= 2 else n - delta
                checks[s] = (retrace(s, other), other - n)
    finally:
        _EXPORTING[0] = False

    sym_shapes, sym_attrs = _symbolic(job, perturbed, sizes)
    for s, (job3, step) in checks.items():
        _check_linear(job, job3, s, sizes[s] + step, sizes, sym_shapes, sym_attrs)
    from .ops import build_graph

    graph = build_graph(onnx, job, names, out_names, in_axes, out_axes, sym_shapes,
                        sym_attrs, opset)
    model_proto = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
        producer_name="sbpflow")
    model_proto.ir_version = min(model_proto.ir_version, _max_ir(onnx, opset))
    onnx.checker.check_model(model_proto)
    if verbose:
        print(onnx.helper.printable_graph(model_proto.graph))
    if f is None:
        return model_proto
    data = model_proto.SerializeToString()
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            fh.write(data)
    else:
        f.write(data)
    return None


def _max_ir(onnx, opset: int) -> int:
    """The IR version that goes with `opset` (so older runtimes load the model)."""
    table = getattr(onnx.helper, "VERSION_TABLE", ())
    best = None
    for row in table:
        if row[2] == opset:
            best = row[1] if best is None else min(best, row[1])
    return best if best is not None else onnx.IR_VERSION


def _dynamic(dynamic_axes, in_names, out_names, leaves, job):
    in_axes = [{} for _ in in_names]
    out_axes = [{} for _ in out_names]
    for key, spec in (dynamic_axes or {}).items():
        if key in in_names:
            i = in_names.index(key)
            in_axes[i] = _axes(spec, leaves[i].dim(), key)
        elif key in out_names:
            i = out_names.index(key)
            t = job.tensors[job.outputs()[i].inputs[0]]
            out_axes[i] = _axes(spec, len(t.shape), key)
        else:
            warnings.warn(f"Provided key {key} for dynamic axes is not a valid input/output "
                          "name", stacklevel=3)
    return in_axes, out_axes


def _symbolic(job: Job, perturbed: dict, sizes: dict):
    """Per Job tensor its shape, per op its attrs, with `Lin` where they vary with a
    dynamic axis (compared with the perturbed traces)."""
    sym_shapes = {n: tuple(t.shape) for n, t in job.tensors.items()}
    sym_attrs = {op.name: dict(op.attrs) for op in job.ops}
    if not perturbed:
        return sym_shapes, sym_attrs
    for s, (job2, _) in perturbed.items():
        ok = (len(job2.ops) == len(job.ops)
              and all(a.op_type == b.op_type and a.inputs == b.inputs and a.outputs == b.outputs
                      for a, b in zip(job.ops, job2.ops)))
        if not ok:
            first = next((a for a, b in zip(job.ops, job2.ops)
                          if (a.op_type, a.inputs) != (b.op_type, b.inputs)), None)
            at = (f" (first difference: op {first.op_type} in module '{first.scope}' at "
                  f"{first.where()})") if first is not None else ""
            raise OnnxExporterError(
                f"sbpflow.onnx.export: the traced ops change when dynamic axis {s!r} changes "
                f"size{at}; the model's control flow depends on that size, so it cannot be "
                "exported with that axis dynamic")
    for name, var in job.variables.items():
        if var.tensor is None:
            continue
        for s, (j2, _) in perturbed.items():
            v2 = j2.variables.get(name)
            if v2 is not None and v2.tensor is var.tensor:
                continue  # a parameter or buffer: the same tensor
            if v2 is None or v2.tensor is None or not np.array_equal(
                    v2.tensor.detach().numpy(), var.tensor.detach().numpy()):
                raise OnnxExporterError(
                    f"sbpflow.onnx.export: the tensor {name} that forward() builds from data "
                    f"changes with dynamic axis {s!r}; build it with tensor ops (e.g. "
                    "flow.arange, flow.full) so its size can follow the axis")
    for n, t in job.tensors.items():
        others = {s: (tuple(j2.tensors[n].shape), d) for s, (j2, d) in perturbed.items()}
        sym_shapes[n] = _diff(tuple(t.shape), others, sizes, f"the shape of tensor {n}")
    for i, op in enumerate(job.ops):
        attrs = {}
        for k, v in op.attrs.items():
            others = {s: (j2.ops[i].attrs.get(k), d) for s, (j2, d) in perturbed.items()}
            attrs[k] = _diff(v, others, sizes,
                             f"attribute {k!r} of op {op.op_type} (module '{op.scope}', at "
                             f"{op.where()})")
        sym_attrs[op.name] = attrs
    return sym_shapes, sym_attrs


def _eval_lin(v, sym: str, size: int, sizes: dict):
    """v (attrs/shape with `Lin`s) with symbol `sym` at `size`, the others as traced."""
    if isinstance(v, Lin):
        return v.c + sum(k * (size if s == sym else sizes[s]) for s, k in v.k.items())
    if isinstance(v, (tuple, list)):
        return type(v)(_eval_lin(x, sym, size, sizes) for x in v)
    return v


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def _check_linear(job, job3, sym, size, sizes, sym_shapes, sym_attrs):
    """The Job traced with `sym` = `size` must equal the symbolic Job evaluated there."""
    bad = None
    if len(job3.ops) != len(job.ops) or any(
            (a.op_type, a.inputs, a.outputs) != (b.op_type, b.inputs, b.outputs)
            for a, b in zip(job.ops, job3.ops)):
        bad = "the traced ops change"
    else:
        for n, t in job3.tensors.items():
            if n not in sym_shapes or not _same(
                    _eval_lin(sym_shapes[n], sym, size, sizes), tuple(t.shape)):
                bad = f"the shape of tensor {n} is not linear in it"
                break
        for op, op3 in zip(job.ops, job3.ops):
            if bad:
                break
            for k, v in op3.attrs.items():
                if not _same(_eval_lin(sym_attrs[op.name].get(k), sym, size, sizes), v):
                    bad = (f"attribute {k!r} of op {op.op_type} (module '{op.scope}', at "
                           f"{op.where()}) is not linear in it")
                    break
    if bad:
        raise OnnxExporterError(
            f"sbpflow.onnx.export: with dynamic axis {sym!r} = {size}, {bad}; the model "
            "cannot be exported with that axis dynamic")
