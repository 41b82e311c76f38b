"""Autograd graph nodes.

A node maps the gradients of its outputs to the gradients of its inputs.  `next_functions`
holds one edge (node, output_nr) per input, or None where no gradient is needed.  Tensors
saved for backward remember their version, so an in-place change after saving raises torch's
error instead of giving a wrong gradient.
"""

from __future__ import annotations

import itertools

_seq = itertools.count()

_FREED = (
    "Trying to backward through the graph a second time (or directly access saved tensors after "
    "they have already been freed). Saved intermediate values of the graph are freed when you "
    "call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward "
    "through the graph a second time or if you need to access saved tensors after calling "
    "backward."
)


class SavedTensor:
    """A tensor saved for backward, with the version it had when saved."""

    __slots__ = ("tensor", "version", "node_name", "output_nr")

    def __init__(self, tensor, node_name: str, output_nr: int = 0):
        self.tensor = tensor
        self.version = tensor._version
        self.node_name = node_name
        self.output_nr = output_nr

    def unpack(self):
        t = self.tensor
        if t is None:
            raise RuntimeError(_FREED)
        if t._version != self.version:
            # Like torch, name the tensor's current producer (the in-place op that changed it).
            raise version_error(t, t.grad_fn, t._output_nr, self.version)
        return t


def version_error(t, producer, output_nr: int, expected: int) -> RuntimeError:
    """torch's error for a saved tensor modified in place after it was saved."""
    where = ""
    if producer is not None:
        where = f", which is output {output_nr} of {_forward_name(producer.name())},"
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an "
        f"inplace operation: [{t._type_name()} {list(t.shape)}]{where} is at version "
        f"{t._version}; expected version {expected} instead. Hint: the backtrace further "
        "above can point to the operation that failed to compute its gradient."
    )


def _forward_name(node_name: str) -> str:
    """torch names the forward op in version errors: ExpBackward0 -> Exp."""
    head, sep, tail = node_name.rpartition("Backward")
    if sep and (not tail or tail.isdigit()):
        return head
    return node_name


class Node:
    __slots__ = ("next_functions", "pre_hooks", "seq", "__weakref__")

    def __init__(self, next_functions=()):
        self.next_functions = tuple(next_functions)
        self.pre_hooks = None  # {output_nr: [hook]}: hooks of non-leaf tensors
        self.seq = next(_seq)

    def name(self) -> str:
        return type(self).__name__

    def apply(self, grads: list):
        raise NotImplementedError

    def release(self) -> None:
        """Drop saved tensors after a backward without retain_graph."""

    @property
    def materialize_grads(self) -> bool:
        """Whether outputs that got no gradient receive zeros (else None)."""
        return True

    def register_prehook(self, output_nr: int, hook) -> None:
        if self.pre_hooks is None:
            self.pre_hooks = {}
        self.pre_hooks.setdefault(output_nr, []).append(hook)

    def __repr__(self):
        return f"<{self.name()} object at {id(self):#x}>"


class AccumulateGrad(Node):
    """The sink for a leaf tensor: adds the incoming gradient into `leaf.grad`."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        super().__init__(())
        self.variable = variable

    def apply(self, grads):
        raise AssertionError("AccumulateGrad is handled by the engine")


class OpNode(Node):
    """The backward of one op call: runs `opdef.grad` with the saved inputs and outputs."""

    __slots__ = ("opdef", "attrs", "saved_inputs", "saved_outputs", "in_metas", "out_metas",
                 "needs_input_grad", "_make_output", "_name", "device")

    def __init__(self, opdef, attrs, inputs, outputs, in_metas, out_metas, next_functions,
                 make_output, device=None):
        super().__init__(next_functions)
        self.device = device
        self.opdef = opdef
        self.attrs = attrs
        name = _NODE_NAMES.get(opdef.name)
        if name is None:
            if opdef.node_name is not None:  # torch's name depends on the call
                name = opdef.node_name(*in_metas, **attrs)
            else:
                name = _NODE_NAMES[opdef.name] = _camel(opdef.name) + "Backward0"
        self._name = name
        # Only what the grad rule reads (OpDef.saves) stays alive; the rest is None, so a
        # chain like `h = h + 1` keeps no intermediate storage (as torch's AddBackward).
        self.needs_input_grad = needs = tuple(e is not None for e in next_functions)
        saved_in = [None] * len(inputs)
        for i in opdef.saved_for("input", len(inputs), needs):
            saved_in[i] = SavedTensor(inputs[i], name)
        self.saved_inputs = saved_in
        # Outputs are saved as bare storage; `make_output` rebuilds a tensor whose grad_fn is
        # this node, so saving them makes no reference cycle.
        saved_out = [None] * len(outputs)
        for i in opdef.saved_for("output", len(outputs), needs):
            o = outputs[i]
            saved_out[i] = (o._data_ref(), o._version)
        self.saved_outputs = saved_out
        self._make_output = make_output
        self.in_metas = in_metas
        self.out_metas = out_metas

    def name(self) -> str:
        return self._name

    def apply(self, grads):
        # A released node still runs if its rule needs no saved tensor (as torch's do);
        # GradContext raises when a rule asks for one that was freed.
        ctx = GradContext(self)
        result = self.opdef.grad(ctx, *grads)
        if not isinstance(result, (tuple, list)):
            result = (result,)
        return list(result)

    def release(self):
        self.saved_inputs = None
        self.saved_outputs = None


class GradContext:
    """What a grad rule sees: saved inputs/outputs (version-checked), attrs, metas."""

    __slots__ = ("_node",)

    def __init__(self, node: OpNode):
        self._node = node

    @property
    def inputs(self):
        return tuple(self.input(i) for i in range(len(self._node.in_metas)))

    def input(self, i: int):
        node = self._node
        saved = node.saved_inputs
        if saved is None:
            _check_declared(node, "input", i, len(node.in_metas))
            raise RuntimeError(_FREED)
        entry = saved[i]
        if entry is None:
            _check_declared(node, "input", i, len(saved))
            raise AssertionError(f"internal error: input {i} of {node.opdef.name!r} not saved")
        return entry.unpack()

    @property
    def outputs(self):
        return tuple(self.output(i) for i in range(len(self._node.out_metas)))

    def output(self, i: int):
        node = self._node
        saved = node.saved_outputs
        if saved is None:
            _check_declared(node, "output", i, len(node.out_metas))
            raise RuntimeError(_FREED)
        entry = saved[i]
        if entry is None:
            _check_declared(node, "output", i, len(saved))
            raise AssertionError(f"internal error: output {i} of {node.opdef.name!r} not saved")
        ref, version = entry
        t = node._make_output(ref, node.out_metas[i], node, i)
        if t._version != version:
            raise version_error(t, node, i, version)
        return t

    @property
    def attrs(self):
        return self._node.attrs

    @property
    def in_metas(self):
        return self._node.in_metas

    @property
    def out_metas(self):
        return self._node.out_metas

    @property
    def needs_input_grad(self):
        return self._node.needs_input_grad


def _check_declared(node: OpNode, kind: str, i: int, n: int) -> None:
    """A grad rule read a tensor its OpDef does not declare in `saves`: a bug in the
    declaration, reported loudly rather than silently keeping memory alive."""
    opdef = node.opdef
    keep = opdef.saved_input_indices(n) if kind == "input" else opdef.saved_output_indices(n)
    if not -n <= i < n:
        raise IndexError(f"grad rule of {opdef.name!r} read {kind} {i} of {n}")
    i %= n
    if i not in keep:
        raise AssertionError(
            f"internal error: grad rule of {opdef.name!r} read {kind} {i}, which its OpDef "
            f"does not save (saves={opdef.saves!r})")
    users = opdef.saved_when(kind, i)
    if users is not None and not any(node.needs_input_grad[u] for u in users):
        raise AssertionError(
            f"internal error: grad rule of {opdef.name!r} read {kind} {i}, which its OpDef "
            f"saves only for the gradients of inputs {users} (saves={opdef.saves!r}); this "
            f"call needs {node.needs_input_grad}")


_NODE_NAMES: dict = {}  # op name -> its nodes' name (AddBackward0), computed once


def _camel(name: str) -> str:
    # A Python-number operand is an attr of a separate `<op>_scalar` op; torch names both
    # forms' nodes after the op (x * 2 has grad_fn MulBackward0).
    if name.endswith("_scalar"):
        name = name[: -len("_scalar")]
    return "".join(p[:1].upper() + p[1:] for p in name.strip("_").split("_"))


