"""The lazy interpreter: while `nn.Graph.build()` runs, every op call is recorded into a Job.

`Trace.active()` installs `Trace.apply` as the interpreter's lazy hook (and `Trace.assign` for
in-place writes).  An op call then binds attrs and infers output metas with the same OpDef as
eager mode (so a shape error raises at once, naming the user's line), appends an `OpNode`, and
returns `LazyTensor`s: Tensors with the logical meta, no data, and the name of their Job tensor.

Rules (OneFlow's):
- an eager tensor met as an op input becomes a `variable` op: parameters and buffers are named
  by module path (`model.0.weight`), other captured tensors `captured-<n>` (non-trainable);
  one variable per eager tensor, whose `Variable.tensor` is the eager tensor itself, so the
  graph reads and writes the module's own memory;
- in-place writes are SSA: the new value is a fresh Job tensor and the Python tensor is
  rebound to it; a write into a variable also records `assign(var, value)`, which the runtime
  applies at the end of the step;
- `loss.backward()` records no autograd nodes: it appends the loss to `job.loss`, and the
  autograd pass builds the backward ops from the OpDefs' grad rules;
- reading a traced value on the host (`.item()`, `.numpy()`, `bool(t)`, `if t:`) raises at
  once: it has no value until the graph runs.
"""

from __future__ import annotations

import contextlib
from threading import get_ident

from .._core.errors import op_error
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.node import _FREED
from ..comm import get_rank
from ..framework import global_tensor, interpreter
from ..framework import tensor as _tensor_mod
from ..framework.tensor import Tensor, _contiguous_strides
from ..sbp import B, infer, layout
from ..sbp.placement import Placement
from ..vm import Blob
from ..vm.machine import _user_site
from .ir import Job, Variable, boxing_attrs


class LazyTensorError(RuntimeError):
    """A traced value was read on the host inside `nn.Graph.build()`."""


class LazyTensor(Tensor):
    """A value inside `nn.Graph.build()`: logical meta, no data.

    `__dict__` holds `_lazy` (the Job tensor it currently names; an in-place op rebinds it),
    `_lazy_rg` (whether it depends on a trainable variable), `_lazy_trace`, and for a view
    `_lazy_view` = (base tensor, base version when the view was taken)."""

    @property
    def requires_grad(self) -> bool:
        return self.__dict__.get("_lazy_rg", False)

    @requires_grad.setter
    def requires_grad(self, value):
        if value and not self.__dict__.get("_lazy_rg", False):
            raise NotImplementedError(
                f"requires_grad_() on a lazy tensor ({self._lazy}) at {_site()}: inside "
                "nn.Graph.build() only module parameters (trainable variables) get gradients")
        self.__dict__["_lazy_rg"] = bool(value)

    def detach(self) -> LazyTensor:
        d = self.__dict__
        t = d["_lazy_trace"].lazy(d["_lazy"])
        _set_layout(t, self._strides, self._offset)
        if "_lazy_view" in d:
            t.__dict__["_lazy_view"] = d["_lazy_view"]
        return t

    def detach_(self) -> LazyTensor:
        self.__dict__["_lazy_rg"] = False
        return self

    @property
    def is_lazy(self) -> bool:
        return True

    # -- host reads: impossible while tracing -------------------------------------------
    def _host(self):
        raise LazyTensorError(_host_message(self, "reading the values of"))

    @property
    def _data(self):
        raise LazyTensorError(_host_message(self, "reading the values of"))

    def numpy(self):
        raise LazyTensorError(_host_message(self, ".numpy() of"))

    def item(self):
        raise LazyTensorError(_host_message(self, ".item() of"))

    def tolist(self):
        raise LazyTensorError(_host_message(self, ".tolist() of"))

    def __array__(self, dtype=None, copy=None):
        raise LazyTensorError(_host_message(self, "np.asarray() of"))

    def __bool__(self):
        raise LazyTensorError(_host_message(self, "bool() (Python control flow such as `if` "
                                                  "or `while`) on"))

    def __float__(self):
        raise LazyTensorError(_host_message(self, "float() of"))

    def __int__(self):
        raise LazyTensorError(_host_message(self, "int() of"))

    def __index__(self):
        raise LazyTensorError(_host_message(self, "using as an index"))

    def __format__(self, spec):
        return repr(self)

    def __repr__(self):
        return (f"tensor({self._lazy}, shape={tuple(self._meta.shape)}, "
                f"dtype=sbpflow.{self._meta.dtype.name}, is_lazy=True)")

    __str__ = __repr__

    def __deepcopy__(self, memo):
        raise LazyTensorError(_host_message(self, "deepcopy of"))

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        retain = create_graph if retain_graph is None else retain_graph
        self.__dict__["_lazy_trace"].backward(self, gradient, inputs, retain)


def _host_message(t: LazyTensor, what: str) -> str:
    f, line = _user_site()
    return (f"{what} a lazy tensor ({t._lazy}, shape {list(t._meta.shape)}) at {f}:{line}: "
            "inside nn.Graph.build() tensors are traced, not computed, so they have no value "
            "yet and Python code cannot branch on them. Return the tensor from build() and "
            "read the graph's output instead, or use tensor ops (e.g. flow.where) for "
            "data-dependent choices.")


class Trace:
    """Records op calls into `job`.  `names` maps id(eager tensor) -> variable name for the
    parameters and buffers of the graph's modules (module paths)."""

    def __init__(self, job: Job, names: dict[int, str] | None = None):
        self.job = job
        self.names = dict(names or {})
        # Local tensors: on several ranks a graph of local tensors is each rank's own program
        # (SPMD, as the same eager code would be; one-embedding ops exchange rows inside their
        # kernels).  Global tensors keep their placement and SBP (`is_global` Job tensors).
        self.rank = get_rank()
        self.placement = Placement("cpu", [self.rank])
        self.sbp = (B,)
        self._var_of: dict[int, str] = {}  # id(eager) -> variable name
        self._current: dict[int, str] = {}  # id(eager) -> Job tensor now holding its value
        self._eager_version: dict[int, int] = {}  # id(eager) -> in-place writes in build
        self._assign_of: dict[str, object] = {}  # variable name -> its assign OpNode
        self._n_captured = 0
        # The autograd graph as eager mode would build it, for backward()'s checks: Job
        # tensor -> (index of its node, the rg tensors the node reads); a node's saved
        # tensors are freed by a backward through it without retain_graph, as in eager.
        self._node_of: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._node_saves: list[bool] = []
        self._freed: set[int] = set()
        self.scopes: list[str] = []
        self.loc: tuple[str, int] | None = None  # set by passes: the loc of the ops they add
        self._thread = get_ident()

    # -- installing -----------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        """Route op calls and in-place writes to this trace while the block runs."""
        prev = (interpreter._apply_lazy, interpreter._assign_lazy, _tensor_mod._host_check,
                interpreter._convert_lazy)
        interpreter.set_lazy_apply(self.apply)
        interpreter.set_lazy_assign(self.assign)
        interpreter.set_lazy_convert(self.convert)
        _tensor_mod._host_check = self._check_host
        try:
            yield self
        finally:
            interpreter.set_lazy_apply(prev[0])
            interpreter.set_lazy_assign(prev[1])
            interpreter.set_lazy_convert(prev[3])
            _tensor_mod._host_check = prev[2]

    def _check_host(self, t: Tensor) -> None:
        """A host read of an eager tensor during tracing: fine, unless build() wrote it."""
        if self._eager_version.get(id(t)) and get_ident() == self._thread:
            raise LazyTensorError(
                f"reading the values of an eager tensor ({self._var_of.get(id(t))}) at "
                f"{_site()} after build() wrote it in place: its new value exists only when "
                "the graph runs, so Python code cannot use it inside build()")

    @contextlib.contextmanager
    def scope(self, path: str):
        self.scopes.append(path)
        try:
            yield
        finally:
            self.scopes.pop()

    def hook_modules(self, named_modules):
        """Forward pre/post hooks that keep the scope stack (module paths) while tracing.
        Returns the hook handles (remove them after tracing)."""
        handles = []
        for path, m in named_modules:
            handles.append(m.register_forward_pre_hook(
                lambda mod, args, _p=path: self.scopes.append(_p)))
            handles.append(m.register_forward_hook(
                lambda mod, args, out, _p=path: self._pop_scope(_p)))
        return handles

    def _pop_scope(self, path):
        if self.scopes and self.scopes[-1] == path:
            self.scopes.pop()

    # -- tensors ------------------------------------------------------------------------------
    def lazy(self, name: str, rg: bool = False) -> LazyTensor:
        """A LazyTensor naming Job tensor `name`."""
        lt = self.job.tensors[name]
        t = LazyTensor._make(Blob(), lt.meta, interpreter._CPU)
        if lt.is_global:  # is_global, sbp and placement answer as in eager
            t._gl = global_tensor.GlobalInfo(
                lt.placement, lt.sbp,
                global_tensor._local_meta(lt.meta, lt.placement, lt.sbp, self.rank))
        d = t.__dict__
        d["_lazy"] = name
        d["_lazy_rg"] = rg
        d["_lazy_trace"] = self
        return t

    def _where(self, t: Tensor):
        """(placement, sbp, is_global) of a tensor entering the Job."""
        if t._gl is not None:
            return t._gl.placement, tuple(t._gl.sbp), True
        return self.placement, self.sbp, False

    def add_tensor(self, meta, placement, sbp, is_global: bool) -> str:
        if not is_global:
            placement, sbp = self.placement, self.sbp
        return self.job.add_tensor(meta, placement, sbp, is_global=is_global).name

    def variable_of(self, t: Tensor) -> str:
        """The variable of eager tensor t (created on first use)."""
        key = id(t)
        name = self._var_of.get(key)
        if name is not None:
            return name
        name = self.names.get(key)
        trainable = False
        if name is None:
            name = f"captured-{self._n_captured}"
            while name in self.job.variables or name in self.job.tensors:
                self._n_captured += 1  # another trace (a pass) captured into this Job
                name = f"captured-{self._n_captured}"
            self._n_captured += 1
        else:
            trainable = bool(t._requires_grad) and t.dtype.is_floating_point
        placement, sbp, is_global = self._where(t)
        self.job.variables[name] = Variable(name, t._meta, trainable, tensor=t)
        self.job.add_tensor(t._meta, placement, sbp, name=name, is_global=is_global)
        self.job.add_op("variable", (), (name,), {"var": name}, scope=self._scope(),
                        loc=_user_site())
        self._var_of[key] = name
        self._current[key] = name
        return name

    def name_of(self, t: Tensor) -> str:
        """The Job tensor holding t's current value."""
        d = t.__dict__
        name = d.get("_lazy")
        if name is not None:
            if d.get("_lazy_trace") is not self:
                raise RuntimeError(f"lazy tensor {name} belongs to another nn.Graph trace; "
                                   "tensors traced in one graph's build() cannot be used in "
                                   "another's (return them and pass the outputs instead)")
            view = d.get("_lazy_view")
            if view is not None and self._version(view[0]) != view[1]:
                raise NotImplementedError(
                    f"inside nn.Graph.build(), a view ({name}) was read after its base was "
                    f"written in place (at {_site()}); the view would not see the write. "
                    "Take the view again after the in-place op, or write out of place.")
            return name
        cur = self._current.get(id(t))
        return cur if cur is not None else self.variable_of(t)

    def _rg(self, t: Tensor) -> bool:
        d = t.__dict__
        if "_lazy" in d:
            return d["_lazy_rg"]
        return bool(t._requires_grad)

    def _version(self, t: Tensor) -> int:
        d = t.__dict__
        if "_lazy" in d:
            return d.get("_lazy_version", 0)
        return self._eager_version.get(id(t), 0)

    def _scope(self) -> str:
        return self.scopes[-1] if self.scopes else ""

    # -- the lazy interpreter ----------------------------------------------------------------
    def apply(self, opdef, inputs, attrs, device=None, generator=None):
        """interpreter.apply in lazy mode: record one op, return lazy outputs."""
        loc = self.loc or _user_site()
        attrs = opdef.bind_attrs(attrs)
        if len(inputs) != len(opdef.inputs):
            raise op_error(
                opdef.name,
                f"expected {len(opdef.inputs)} tensor inputs {opdef.inputs}, got {len(inputs)}",
                TypeError,
            )
        tensors = list(inputs[0]) if opdef.variadic else list(inputs)
        for t in tensors:
            if not isinstance(t, Tensor):
                interpreter._check_tensors(opdef, tensors)
        creation = isinstance(device, global_tensor.GlobalDevice)
        if creation or any(t._gl is not None for t in tensors):
            return self._apply_global(opdef, tensors, attrs, device, loc)
        names = [self.name_of(t) for t in tensors]
        in_metas = tuple(t._meta for t in tensors)
        try:
            out_metas = opdef.meta(in_metas, attrs)
        except Exception as e:  # noqa: BLE001 - re-raised with the user's line
            raise _at_line(e, loc) from e
        out_names = [self.add_tensor(m, None, None, False) for m in out_metas]
        return self._record(opdef, tensors, names, attrs, out_names, out_metas, loc)

    def _apply_global(self, opdef, tensors, attrs, device, loc):
        """An op on global tensors (or a factory given a placement): the SBP signature comes
        from `sbp.infer.choose_signature`, as in eager; inputs whose SBP differs from the one
        chosen get a boxing node, and a factory asked for an SBP it cannot make directly
        makes B and boxes, as eager does."""
        if tensors:
            # The same placement rules and errors as eager (a local tensor among global ones
            # raises; 0-d tensors on another placement are moved as B).
            placement, tensors = global_tensor._common_placement(opdef, tensors)
            creation_sbp = None
        else:
            placement, creation_sbp = device.placement, device.sbp
        names = [self.name_of(t) for t in tensors]
        in_metas = tuple(t._meta for t in tensors)
        in_sbps = tuple(tuple(t._gl.sbp) for t in tensors)
        try:
            out_metas = opdef.meta(in_metas, attrs, local=False)
            want, out_sbps = infer.choose_signature(opdef, in_metas, in_sbps, out_metas,
                                                    placement, attrs, creation_sbp)
        except Exception as e:  # noqa: BLE001 - re-raised with the user's line
            raise _at_line(e, loc) from e
        names = [n if have == w else self._box(n, placement, w, loc)
                 for n, have, w in zip(names, in_sbps, want)]
        out_names = [self.add_tensor(m, placement, sb, True)
                     for m, sb in zip(out_metas, out_sbps)]
        out = self._record(opdef, tensors, names, attrs, out_names, out_metas, loc)
        if not tensors and creation_sbp is not None and tuple(creation_sbp) != out_sbps[0]:
            outs = out if isinstance(out, tuple) else (out,)
            boxed = [self.convert("to_global", o, placement, creation_sbp) for o in outs]
            out = boxed[0] if len(boxed) == 1 else tuple(boxed)
        return out

    def _box(self, name: str, placement, sbp, loc=None) -> str:
        """A boxing node: Job tensor `name` moved to (placement, sbp); returns the new tensor.
        Not differentiated by itself: the autograd pass boxes gradients back (the dual SBP)."""
        src = self.job.tensors[name]
        sbp = tuple(sbp)
        if src.placement == placement and src.sbp == sbp:
            return name
        out = self.add_tensor(src.meta, placement, sbp, True)
        self.job.add_op("boxing", (name,), (out,), boxing_attrs(src, placement, sbp),
                        scope=self._scope(), loc=loc or self.loc or _user_site())
        return out

    def convert(self, kind: str, t: Tensor, placement=None, sbp=None, grad_sbp=None):
        """`to_global`/`to_local` inside build(): explicit nodes in the Job, with eager's
        argument rules and errors.  global -> global is a boxing node; local -> global makes
        this rank's tensor its piece (`local_to_global`, the logical shape from the pieces'
        shapes); to_local reads this rank's piece (`global_to_local`)."""
        loc = self.loc or _user_site()
        if grad_sbp is not None:
            raise NotImplementedError(
                f"to_global(grad_sbp=...) inside nn.Graph.build() at {_site()} is not "
                "supported; gradients take the dual SBP (B <-> P, S stays)")
        if kind == "to_local":
            if t._gl is None:
                raise RuntimeError("to_local(): expected a global tensor, but got a local "
                                   "tensor; only global tensors have a local piece")
            name = self.name_of(t)
            out = self.add_tensor(t._gl.local_meta, None, None, False)
            return self._record_structural("global_to_local", t, name, out)
        placement, sbp = global_tensor._normalize("to_global", placement, sbp, t._gl)
        layout.check_split_axes(sbp, len(t._meta.shape))
        name = self.name_of(t)
        if t._gl is not None:
            out = self._box(name, placement, sbp, loc)
            if out == name:
                return t
            return self._relabel(t, out)
        meta = global_tensor._logical_meta(t, placement, sbp, True)
        out = self.add_tensor(meta, placement, sbp, True)
        return self._record_structural("local_to_global", t, name, out)

    def piece_to_global(self, t: Tensor, placement, sbp, meta) -> LazyTensor:
        """Local tensor t taken as this rank's piece of a global tensor of `meta` on
        (placement, sbp), as it is (no broadcast): the gradient of `to_local`."""
        name = self.name_of(t)
        out = self.add_tensor(meta, placement, tuple(sbp), True)
        self.job.add_op("local_to_global", (name,), (out,),
                        boxing_attrs(self.job.tensors[name], placement, tuple(sbp), False),
                        scope=self._scope(), loc=self.loc or _user_site())
        return self._relabel(t, out)

    def _record_structural(self, op_type, t, name, out):
        """A conversion node: one input, one output; the output requires grad as its input."""
        src = self.job.tensors[name]
        dst = self.job.tensors[out]
        self.job.add_op(op_type, (name,), (out,),
                        boxing_attrs(src, dst.placement, dst.sbp, dst_is_local=not dst.is_global),
                        scope=self._scope(), loc=self.loc or _user_site())
        return self._relabel(t, out)

    def _relabel(self, t, out):
        """A lazy tensor for Job tensor `out`, requiring grad as t does; for backward's
        bookkeeping the new tensor comes from t's node."""
        rg = is_grad_enabled() and self._rg(t)
        lt = self.lazy(out, rg)
        if rg:
            node = self._node_of.get(self.name_of(t))
            if node is not None:
                self._node_of[out] = node
        return lt

    def _record(self, opdef, tensors, names, attrs, out_names, out_metas, loc):
        """Append the op node and return lazy outputs (autograd and view bookkeeping)."""
        rg = is_grad_enabled() and opdef.grad is not None and any(
            self._rg(t) for t in tensors)
        self.job.add_op(opdef.name, names, out_names, attrs, scope=self._scope(), loc=loc)
        outs = [self.lazy(n, rg and opdef.differentiable(i, m))
                for i, (n, m) in enumerate(zip(out_names, out_metas))]
        if rg:
            needs = tuple(self._rg(t) for t in tensors)
            node = (len(self._node_saves), tuple(n for n, r in zip(names, needs) if r))
            self._node_saves.append(bool(opdef.saved_for("input", len(tensors), needs)
                                         or opdef.saved_for("output", len(outs), needs)))
            for n in out_names:
                self._node_of[n] = node
        if opdef.view:
            src = tensors[0]
            # The eager layout (strides, offset) of the view: contiguous() and reshape decide
            # between a view and a copy by it, as they do in eager mode.
            if src._gl is not None and not src.is_lazy:
                # an eager global tensor: its logical layout, not its piece's (pieces differ
                # between ranks), as eager global views take it
                src = global_tensor._LogicalLayout(
                    src._meta, src._gl.strides or _contiguous_strides(src._meta.shape), 0)
            _set_layout(outs[0], *interpreter._view_layout(opdef, src, out_metas[0], attrs))
            src = tensors[0]
            view = src.__dict__.get("_lazy_view")
            base = src if view is None else view[0]
            outs[0].__dict__["_lazy_view"] = (base, self._version(base))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def assign(self, t: Tensor, value: Tensor, op: str = "copy_") -> Tensor:
        """An in-place write `t <- value` in lazy mode: rebind t to value's Job tensor; a
        variable also gets an `assign` op, applied at the end of the step."""
        if value._meta != t._meta:
            raise op_error(op, f"internal: value meta {value._meta} != target meta {t._meta}")
        value_name = self.name_of(value)
        d = t.__dict__
        if "_lazy" in d:
            view = d.get("_lazy_view")
            if view is not None:
                raise NotImplementedError(
                    f"{op}: in-place write through a view ({d['_lazy']}) inside "
                    f"nn.Graph.build() at {_site()} is not supported; compute the new value "
                    "out of place (e.g. torch.where or torch.cat) and assign it to the base")
            d["_lazy"] = value_name
            d["_lazy_rg"] = self._rg(value)
            _set_layout(t, value._strides, value._offset)
            d["_lazy_version"] = d.get("_lazy_version", 0) + 1
            return t
        if t._base is not None:
            raise NotImplementedError(
                f"{op}: in-place write into a view of an eager tensor inside nn.Graph.build() "
                f"at {_site()} is not supported; write into the whole tensor")
        var = self.variable_of(t) if id(t) not in self._var_of else self._var_of[id(t)]
        self._current[id(t)] = value_name
        self._eager_version[id(t)] = self._eager_version.get(id(t), 0) + 1
        old = self._assign_of.pop(var, None)
        if old is not None:  # only the last write of a step reaches the variable
            self.job.ops.remove(old)
        self._assign_of[var] = self.job.add_op("assign", (var, value_name), (),
                                               scope=self._scope(), loc=_user_site())
        return t

    # -- graph boundaries ---------------------------------------------------------------------
    def input(self, t: Tensor, index: int) -> LazyTensor:
        """An `input` op for the graph call's argument `index`."""
        placement, sbp, is_global = self._where(t)
        name = self.job.add_tensor(t._meta, placement, sbp, name=f"input-{index}",
                                   is_global=is_global).name
        self.job.add_op("input", (), (name,), {"index": index}, name=f"input_{index}")
        return self.lazy(name)

    def output(self, t: Tensor, index: int) -> None:
        """An `output` op for the result of build() at flat position `index`."""
        name = self.name_of(t)
        self.job.add_op("output", (name,), (), {"index": index}, name=f"output_{index}")

    def backward(self, t: LazyTensor, gradient=None, inputs=None, retain_graph=False) -> None:
        """`loss.backward()` inside build(): remember the loss; the autograd pass differentiates.
        A second backward through nodes whose saved tensors the first one freed raises
        eager's error (the autograd pass would otherwise silently add both gradients)."""
        if inputs is not None or gradient is not None:
            raise NotImplementedError(
                f"backward(gradient=..., inputs=...) inside nn.Graph.build() at {_site()} is "
                "not supported; call backward() on a scalar loss")
        if not self._rg(t):
            raise RuntimeError(
                "element 0 of tensors does not require grad and does not have a grad_fn")
        if t._meta.numel != 1:
            raise RuntimeError("grad can be implicitly created only for scalar outputs")
        name = self.name_of(t)
        nodes, todo = set(), [name]
        while todo:
            node = self._node_of.get(todo.pop())
            if node is not None and node[0] not in nodes:
                nodes.add(node[0])
                todo.extend(node[1])
        if any(self._node_saves[n] for n in nodes & self._freed):
            raise RuntimeError(f"{_FREED} (in nn.Graph.build() at {_site()})")
        if not retain_graph:
            self._freed |= nodes
        self.job.loss.append(name)


def _set_layout(t: Tensor, strides, offset: int) -> None:
    """A lazy tensor's eager layout; a global one's GlobalInfo says it too (stride() and
    is_contiguous() of a global tensor read the logical strides there)."""
    t._strides, t._offset = strides, offset
    if t._gl is not None:
        logical = None if strides == _contiguous_strides(t._meta.shape) else tuple(strides)
        if t._gl.strides != logical:
            t._gl = t._gl._replace(strides=logical)


def _site() -> str:
    f, line = _user_site()
    return f"{f}:{line}"


def _at_line(e: BaseException, loc) -> BaseException:
    """e with ' (in nn.Graph.build() at <file>:<line>)' appended, same type when possible."""
    msg = f"{e} (in nn.Graph.build() at {loc[0]}:{loc[1]})"
    try:
        new = type(e)(msg)
    except Exception:  # noqa: BLE001 - exception types with other constructors
        e.add_note(f"in nn.Graph.build() at {loc[0]}:{loc[1]}")
        return e
    return new


def is_lazy(t) -> bool:
    return isinstance(t, Tensor) and "_lazy" in t.__dict__


# -- tracing a build() call ---------------------------------------------------------------------
def flatten(obj, leaves: list):
    """Tensors of a nested tuple/list/dict structure, in order, and a spec to rebuild it."""
    if isinstance(obj, Tensor):
        leaves.append(obj)
        return ("T", len(leaves) - 1)
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple([flatten(x, leaves) for x in obj]))
    if isinstance(obj, dict):
        return (dict, tuple([(k, flatten(v, leaves)) for k, v in obj.items()]))
    return ("C", obj)  # a Python constant, baked into the trace


def unflatten(spec, leaves):
    kind, body = spec
    if kind == "T":
        return leaves[body]
    if kind == "C":
        return body
    if kind is dict:
        return {k: unflatten(v, leaves) for k, v in body}
    items = [unflatten(x, leaves) for x in body]
    return tuple(items) if kind is tuple else (
        kind(*items) if hasattr(kind, "_fields") else kind(items))


def module_names(modules) -> tuple[dict[int, str], list]:
    """(id(tensor) -> 'attr.path.name' for every parameter and buffer, [(path, module)])
    of the graph's attribute modules {attr: module}."""
    names: dict[int, str] = {}
    named = []
    for attr, m in modules.items():
        for path, sub in m.named_modules(prefix=attr):
            named.append((path, sub))
        for n, p in m.named_parameters(prefix=attr):
            names.setdefault(id(p), n)
        for n, b in m.named_buffers(prefix=attr):
            if b is not None:
                names.setdefault(id(b), n)
    return names, named


def trace_build(job: Job, build, args: tuple, kwargs: dict, modules,
                extra_names: dict[int, str] | None = None) -> object:
    """Run `build(*args, **kwargs)` under a Trace recording into `job`: tensor arguments
    become `input` ops (flat order of the nested arguments), the returned tensors `output`
    ops.  `modules`: {attr: module} whose parameters and buffers are named by module path;
    `extra_names`: more id(tensor) -> variable name (e.g. optimized tensors outside the
    modules).  Returns the output spec (for `unflatten` of the graph's results)."""
    names, named = module_names(modules)
    for k, v in (extra_names or {}).items():
        names.setdefault(k, v)
    trace = Trace(job, names)
    handles = trace.hook_modules(named)
    leaves: list = []
    in_spec = flatten((args, kwargs), leaves)
    try:
        with trace.active():
            lazy_in = [trace.input(t, i) for i, t in enumerate(leaves)]
            a, k = unflatten(in_spec, lazy_in)
            out = build(*a, **k)
            out_leaves: list = []
            out_spec = flatten(out, out_leaves)
            for i, t in enumerate(out_leaves):
                trace.output(t, i)
            # An input build() wrote in place: its last value is one more output, marked
            # with the input's index, that the caller copies back (the write is not lost).
            k = len(out_leaves)
            for i, t in enumerate(lazy_in):
                name = trace.name_of(t)
                if name != f"input-{i}":
                    trace.job.add_op("output", (name,), (), {"index": k, "writeback": i},
                                     name=f"output_{k}")
                    k += 1
    finally:
        for h in handles:
            h.remove()
    return out_spec
