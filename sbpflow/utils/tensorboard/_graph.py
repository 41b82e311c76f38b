"""`SummaryWriter.add_graph`: a module traced into a Job, written as a TensorBoard GraphDef.

torch traces the model with `torch.jit.trace`; sbpflow uses its own tracer, the lazy
interpreter that `nn.Graph` compiles from (`graph.trace.trace_build`).  The model's forward
runs once on the example inputs with every op recorded into a Job and nothing computed; no
pass runs, so the graph is the model as written (no fusion, no autograd ops).  As in torch,
the modules are in eval mode while tracing and get their modes back afterwards.

Each Job op becomes one `NodeDef`:
- name: the op's module scope as a '/' path, then the op's own name (`Net/fc1/linear-3`);
  parameters and buffers are named by their path (`Net/fc1/weight`); the graph's inputs and
  outputs are `input_<i>` and `output_<i>`.  The root is the model's class name, as in torch.
- op: the op type (`linear`, `relu`, `variable`, `input`, `output`, ...);
- input: the names of the nodes producing its inputs (`name:k` for output k > 0);
- attr: `_output_shapes` and `_output_types` of its outputs, and each op attr as a string.
"""

from __future__ import annotations

import contextlib

from tensorboard.compat.proto import types_pb2
from tensorboard.compat.proto.attr_value_pb2 import AttrValue
from tensorboard.compat.proto.graph_pb2 import GraphDef
from tensorboard.compat.proto.node_def_pb2 import NodeDef
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

from ..._core.codec import attr_text
from ...framework.tensor import Tensor
from ...graph.ir import Job, OpNode
from ...graph.trace import trace_build

__all__ = ["graph_def", "node_names", "trace_module"]

# sbpflow dtype name -> TensorFlow DataType (the enum TensorBoard shows).
_TF_TYPES = {
    "bool": types_pb2.DT_BOOL, "uint8": types_pb2.DT_UINT8, "int8": types_pb2.DT_INT8,
    "int16": types_pb2.DT_INT16, "int32": types_pb2.DT_INT32, "int64": types_pb2.DT_INT64,
    "float16": types_pb2.DT_HALF, "bfloat16": types_pb2.DT_BFLOAT16,
    "float32": types_pb2.DT_FLOAT, "float64": types_pb2.DT_DOUBLE,
}


@contextlib.contextmanager
def _eval_mode(model):
    """Every submodule in eval mode while tracing (torch's add_graph does the same)."""
    saved = [(m, m.training) for m in model.modules()]
    for m, _ in saved:
        m.training = False
    try:
        yield
    finally:
        for m, mode in saved:
            m.training = mode


def _mutable_container(obj) -> str | None:
    """'list' or 'dict' if the output structure holds one (torch.jit.trace's strict check)."""
    if isinstance(obj, (list, dict)):
        return type(obj).__name__
    if isinstance(obj, tuple):
        for x in obj:
            found = _mutable_container(x)
            if found:
                return found
    return None


def trace_module(model, input_to_model=None, use_strict_trace: bool = True) -> Job:
    """The Job of `model(*inputs)`, traced without running it.  `input_to_model`: a tensor,
    a tuple of forward's arguments, or None for a forward without arguments.  With
    `use_strict_trace` (torch.jit.trace's strict mode) an output holding a list or a dict is
    refused, as torch refuses it."""
    if not (callable(model) and hasattr(model, "named_modules") and hasattr(model, "forward")):
        raise TypeError(f"add_graph: model must be an nn.Module, got {type(model).__name__}")
    if input_to_model is None:
        args = ()
    elif isinstance(input_to_model, (Tensor, dict)):
        args = (input_to_model,)
    else:
        args = tuple(input_to_model)
    root = type(model).__name__
    outputs = []

    def build(*a):
        out = model(*a)
        outputs.append(out)
        return out

    job = Job(f"add_graph_{root}")
    with _eval_mode(model):
        try:
            trace_build(job, build, args, {}, {root: model})
        except Exception as e:
            raise RuntimeError(
                f"add_graph: sbpflow's tracer (the one nn.Graph uses) could not trace "
                f"{root}: {type(e).__name__}: {e}") from e
    container = _mutable_container(outputs[0]) if use_strict_trace else None
    if container:
        raise RuntimeError(
            f"add_graph: {root} returned a {container}; with use_strict_trace=True (torch.jit."
            "trace's strict mode) a mutable container output is refused, because its structure "
            "may change with the inputs. Return a tuple instead, or pass "
            "use_strict_trace=False")
    return job


def _local_name(op: OpNode, root: str) -> tuple[str, str]:
    """(scope path, own name) of an op's node."""
    if op.op_type == "variable":
        var = op.attrs["var"]
        if var.startswith(root + "."):  # a parameter or buffer: named by its module path
            scope, _, own = var.rpartition(".")
            return scope.replace(".", "/"), own
        return op.scope.replace(".", "/"), var  # a captured tensor (`captured-<n>`)
    own = op.name
    if op.scope and own.startswith(op.scope + "-"):
        own = own[len(op.scope) + 1:]
    return op.scope.replace(".", "/"), own


def node_names(job: Job, root: str) -> dict[str, str]:
    """Job op name -> node name (unique: a clash keeps the Job's own op name)."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for op in job.ops:
        scope, own = _local_name(op, root)
        name = f"{scope}/{own}" if scope else own
        if name in used:
            name = f"{scope}/{op.name}" if scope else op.name
        used.add(name)
        names[op.name] = name
    return names


def graph_def(job: Job, root: str) -> GraphDef:
    """The Job's ops as a GraphDef (see the module docstring)."""
    names = node_names(job, root)
    source: dict[str, str] = {}  # tensor -> 'node' or 'node:k'
    for op in job.ops:
        for k, t in enumerate(op.outputs):
            source[t] = names[op.name] if k == 0 else f"{names[op.name]}:{k}"
    nodes = []
    for op in job.ops:
        node = NodeDef(name=names[op.name], op=op.op_type)
        node.input.extend(source[t] for t in op.inputs)
        if op.outputs:
            metas = [job.tensors[t].meta for t in op.outputs]
            node.attr["_output_shapes"].CopyFrom(AttrValue(list=AttrValue.ListValue(shape=[
                TensorShapeProto(dim=[TensorShapeProto.Dim(size=d) for d in m.shape])
                for m in metas])))
            node.attr["_output_types"].CopyFrom(AttrValue(list=AttrValue.ListValue(type=[
                _TF_TYPES.get(m.dtype.name, types_pb2.DT_INVALID) for m in metas])))
        for key, value in op.attrs.items():
            node.attr[key].CopyFrom(AttrValue(s=attr_text(value).encode("utf-8")))
        nodes.append(node)
    return GraphDef(node=nodes)
