"""`nn.Graph`: OneFlow's static-graph front end.

Subclass it, assign modules in `__init__`, write `build()`; `add_optimizer` makes it a
training graph (forward, `loss.backward()` and the update in one step).  The first call with
a given input signature traces `build()` into a Job (graph/trace.py), runs the passes
(graph/passes), compiles a Plan and starts a runtime; later calls with that signature only
run it.  A new input shape, dtype or module mode traces and compiles again (cached per
signature; OneFlow refuses new shapes unless asked).

The graph's variables are the eager modules' own parameters and buffers, and the optimizer
states are the eager optimizer's `state[p]` tensors, so training can switch between graph
and eager mode at any step and give the same result as one mode only.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import numbers
import time
import warnings
from collections import OrderedDict
from threading import get_ident

import numpy as np

from .. import comm
from .._core.dtype import float64 as _float64
from ..autograd import no_grad
from ..framework import global_tensor as _global
from ..framework import interpreter as _interpreter
from ..framework.tensor import Tensor
from ..graph import agreement as _agreement
from ..graph import passes as _passes
from ..graph.ir import Job, Variable
from ..graph.trace import flatten, module_names, trace_build, unflatten
from ..sbp import B as _B
from ..sbp import layout as _layout
from .modules.module import Module

TRAIN_STEP = "System-Train-TrainStep"
# torch state key -> suffix of the graph variable (OneFlow's names: <param>-momentum, -m, -v)
STATE_SUFFIX = {"momentum_buffer": "momentum", "exp_avg": "m", "exp_avg_sq": "v",
                "max_exp_avg_sq": "max_v", "step": "step"}
_graph_ids = itertools.count()
# Plans a graph keeps without `with_dynamic_input_shape` (least recently used dropped, with a
# warning the first time): every new constant or shape compiles, so an unbounded cache grows
# without end when a caller varies one per call.
DEFAULT_PLAN_CACHE_SIZE = 10


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic GC off while a plan compiles.  Tracing, the passes and the chain's
    code generation make tens of objects per op that all stay alive until the compile ends,
    and each full collection rescans all of them: at 5,000 ops that was a fifth to a quarter
    of the first call, and the part that grew faster than the op count.  Cycles made meanwhile
    are collected by the next collection after.  (The switch is process-wide, as CPython's GC
    is; the state from before is restored.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class GraphConfig:
    """`graph.config`: flags the passes read (stored into `job.config`)."""

    def __init__(self):
        self._flags: dict = {}

    def allow_fuse_add_to_output(self, mode: bool = True) -> None:
        self._flags["allow_fuse_add_to_output"] = bool(mode)

    def allow_fuse_model_update_ops(self, mode: bool = True) -> None:
        self._flags["allow_fuse_model_update_ops"] = bool(mode)

    def allow_fuse_cast_scale(self, mode: bool = True) -> None:
        self._flags["allow_fuse_cast_scale"] = bool(mode)

    def enable_amp(self, mode: bool = True, *, dtype=None) -> None:
        if mode:
            raise NotImplementedError("nn.Graph: AMP is not supported yet")

    def set_gradient_accumulation_steps(self, value: int) -> None:
        """Each call's tensor arguments are a mini-batch of `value` micro-batches (split along
        axis 0); the gradients of the micro-batches are accumulated and the optimizer steps
        once per call.  Outputs are packed as OneFlow packs them: concatenated along axis 0
        over the micro-batches, a scalar (the loss) becoming shape (value,).  A global
        argument's micro-batches are slices of each rank's piece (data parallelism: no row
        moves).  See graph/passes/grad_accumulation.py.  Changing it recompiles."""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"set_gradient_accumulation_steps: the number of micro-batches "
                            f"must be an int, got {type(value).__name__} ({value!r})")
        if value < 1:
            raise ValueError(f"set_gradient_accumulation_steps: the number of micro-batches "
                             f"must be at least 1, got {value}")
        if value == 1:
            self._flags.pop("gradient_accumulation_steps", None)
        else:
            self._flags["gradient_accumulation_steps"] = int(value)

    def enable_zero(self, mode: bool = True, **kwargs) -> None:
        if mode:
            raise NotImplementedError("nn.Graph: ZeRO needs the multi-rank Plan (a later issue)")

    def __repr__(self):
        flags = ", ".join(f"{k}={v}" for k, v in sorted(self._flags.items()))
        return f"GraphConfig({flags})"


class GraphModule:
    """OneFlow's per-module graph settings, from `graph.<module>.to(GraphModule)`: the
    pipeline stage and placement, and activation checkpointing (stored as scope attrs in
    `job.config["module_attrs"]`; the passes that act on them come with the multi-rank Plan)."""

    def __init__(self, path: str):
        self.name = path
        self.stage_id: int | None = None
        self.stage_placement = None
        self.activation_checkpointing = False

    def set_stage(self, stage_id: int, placement=None) -> None:
        self.stage_id = int(stage_id)
        self.stage_placement = placement

    def attrs(self) -> dict:
        out = {}
        if self.stage_id is not None:
            out["stage_id"] = self.stage_id
        if self.stage_placement is not None:
            out["placement"] = repr(self.stage_placement)
        if self.activation_checkpointing:
            out["activation_checkpointing"] = True
        return out

    def __repr__(self):
        return f"GraphModule({self.name}, {self.attrs()})"


class ProxyModule:
    """What `graph.<module>` returns (OneFlow's ProxyModule): calls and attributes go to the
    eager module; submodules come back as proxies; `.to(GraphModule)` gives the settings."""

    def __init__(self, module: Module, path: str):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_settings", GraphModule(path))
        object.__setattr__(self, "_proxies", {})

    def __call__(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def to(self, kind=None, *args, **kwargs):
        if kind is GraphModule:
            return self._settings
        if isinstance(kind, type) and issubclass(kind, Module):
            return self._module
        return self._module.to(kind, *args, **kwargs)

    @property
    def origin(self) -> Module:
        return self._module

    def __getattr__(self, name):
        return self._sub(name, getattr(self._module, name))

    def __setattr__(self, name, value):
        setattr(self._module, name, value)

    def _sub(self, key: str, m):
        """The cached proxy of submodule m (settings made on it persist)."""
        if not isinstance(m, Module):
            return m
        proxies = self._proxies
        if key not in proxies or proxies[key]._module is not m:
            proxies[key] = ProxyModule(m, f"{self._path}.{key}")
        return proxies[key]

    def __iter__(self):
        for name, m in self._module._modules.items():
            yield self._sub(name, m)

    def __getitem__(self, i):
        m = self._module[i]
        if isinstance(i, int):
            name = list(self._module._modules)[i]
            return self._sub(name, m)
        return m

    def __len__(self):
        return len(self._module)

    def __repr__(self):
        return "\n".join(_module_lines(self._module, self._path, 0))


def _collect_settings(proxy: ProxyModule, out: dict) -> None:
    """{module path: GraphModule attrs} of a proxy and the sub-proxies made from it."""
    attrs = proxy._settings.attrs()
    if attrs:
        out[proxy._path] = attrs
    for sub in proxy._proxies.values():
        _collect_settings(sub, out)


def _module_lines(m: Module, path: str, depth: int) -> list[str]:
    pad = "  " * depth
    extra = m.extra_repr() if hasattr(m, "extra_repr") else ""
    lines = [f"{pad}(MODULE:{path}:{type(m).__name__}({extra})): ("]
    for n, p in m._parameters.items():
        if p is not None:
            lines.append(f"{pad}  (PARAMETER:{path}.{n}:{_tensor_text(p)}): ()")
    for n, b in m._buffers.items():
        if b is not None:
            lines.append(f"{pad}  (BUFFER:{path}.{n}:{_tensor_text(b)}): ()")
    for n, sub in m._modules.items():
        if sub is not None:
            lines.extend(_module_lines(sub, f"{path}.{n}", depth + 1))
    lines.append(f"{pad})")
    return lines


def _tensor_text(t: Tensor) -> str:
    rg = ", requires_grad=True" if t.requires_grad else ""
    return f"tensor(..., size={tuple(t.shape)}, dtype=sbpflow.{t.dtype.name}{rg})"


class _Compiled:
    """One traced and compiled signature: the Job, its output spec, the runner, and the
    guards that say whether it is still right for the modules as they are now."""

    __slots__ = ("job", "out_spec", "runner", "pass_times", "states", "feeds", "out_sbps",
                 "slots", "tensors", "hooks", "writebacks")

    def __init__(self, job, out_spec, runner, pass_times, states, feeds):
        self.job = job
        # Guards, checked on every call (graph._stale): [(dict, key, object)] for each module
        # slot the Job depends on (a parameter, buffer, submodule or forward hook must still
        # be the object traced), and [(tensor, meta, requires_grad, blob, strides, offset)] for each
        # variable (model.double(), requires_grad_(), p.data = ... change these in place).
        self.slots: list = []
        self.tensors: list = []
        self.hooks: list = []  # [(pre-hook dict, hook dict, their lengths)] per module
        # [(input leaf index, output index)]: inputs build() wrote in place, whose new value
        # is an extra output copied back into the caller's tensor after the step (as eager).
        self.writebacks: list = []
        # Global inputs give global outputs, with the placement and SBP the Job gives them
        # (on one rank every SBP holds the whole tensor); None for a local graph.
        self.out_sbps = None
        self.out_spec = out_spec
        self.runner = runner
        self.pass_times = pass_times
        self.states = states  # [(opt, param, torch key, variable name)]
        # [(lr feed key, param group, SGD first-step flag or None, params it updates, opt)]
        self.feeds = feeds


def _default_runner(job: Job):
    """The compiled plan of `job` on the actor runtime: an object whose
    `run(inputs, feeds) -> list[Tensor]` runs one step (one VM instruction)."""
    from ..graph.compiler import build_runtime

    return build_runtime(job)


# Tests may swap in a reference evaluator; the package runs Jobs only on the runtime.
_runner_factory = _default_runner


class Graph:
    """Base class of static graphs (OneFlow's `nn.Graph`)."""

    def __init__(self):
        d = self.__dict__
        d["_name"] = f"{type(self).__name__}_{next(_graph_ids)}"
        d["_modules"] = OrderedDict()
        d["_proxies"] = {}
        d["config"] = GraphConfig()
        d["_optimizers"] = []  # [(optimizer, lr_scheduler or None)]
        d["_cache"] = OrderedDict()  # input signature -> _Compiled, least recently used first
        # None: DEFAULT_PLAN_CACHE_SIZE plans, warning when one is dropped;
        # with_dynamic_input_shape(size=n): n plans, least recently used dropped
        d["_cache_size"] = None
        d["_cache_warned"] = False
        d["_last"] = None
        d["_debug"] = -1
        d["_train_step"] = 0
        d["_aux_vars"] = {}  # state variable name -> tensor the graph holds (SGD buffers)
        d["_graph_buffers"] = set()  # ids of params whose SGD buffer the flag accounts for

    # -- attributes ----------------------------------------------------------------------------
    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
            self._proxies[name] = ProxyModule(value, name)
            self.__dict__.pop(name, None)
            self.__dict__.pop("_all_modules", None)
            return
        if isinstance(value, ProxyModule):
            self.__setattr__(name, value._module)
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        proxies = self.__dict__.get("_proxies", {})
        if name in proxies:
            return proxies[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @property
    def name(self) -> str:
        return self._name

    @property
    def training(self) -> bool:
        """A graph with an optimizer trains (OneFlow's rule)."""
        return bool(self._optimizers)

    # -- user API ------------------------------------------------------------------------------
    def build(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define build()")

    def add_optimizer(self, optim, *, lr_sch=None, is_sparse: bool = False) -> None:
        if is_sparse:
            raise NotImplementedError("nn.Graph: sparse optimizers are not supported yet")
        kind = _optimizer_kind(optim)
        if kind is None:
            raise NotImplementedError(
                f"nn.Graph: no graph update for {type(optim).__name__}; supported: SGD, Adam, "
                "AdamW, and for one-embedding tables also Adagrad and one_embedding.Ftrl")
        if lr_sch is not None and getattr(lr_sch, "optimizer", optim) is not optim:
            raise ValueError("add_optimizer: lr_sch must schedule the optimizer it is added with")
        self._optimizers.append((optim, lr_sch))
        self._cache.clear()

    def set_grad_scaler(self, grad_scaler=None) -> None:
        raise NotImplementedError("nn.Graph: loss scaling needs AMP, which is not supported yet")

    def debug(self, v_level: int = 0, *, ranks=None, max_py_stack_depth: int = 2,
              only_user_py_stack: bool = True, op_repr_with_py_stack: bool = False) -> None:
        """-1: quiet; 0: pass timings; >= 1: also the Job after tracing and after each pass."""
        self.__dict__["_debug"] = int(v_level)

    def __call__(self, *args, **kwargs):
        if _interpreter._apply_lazy is not None and _interpreter._lazy_thread == get_ident():
            raise RuntimeError(
                f"{self._name} was called inside another nn.Graph's build(): nesting graphs "
                "is not supported; call the inner graph's modules directly in build(), or "
                "call the graphs one after the other")
        leaves: list = []
        try:
            spec = _call_key((args, kwargs), leaves)
        except TypeError as e:
            raise TypeError(f"{self._name}: {e}") from None
        key = self._signature(spec, leaves)
        cache = self._cache
        compiled = cache.get(key)
        if compiled is not None and self._stale(compiled):
            del cache[key]
            compiled = None
            key = self._signature(spec, leaves)  # module modes of a replaced submodule
        if compiled is None:
            compiled = self._compile(args, kwargs)
            cache[key] = compiled
            self._bound_cache()
        else:
            cache.move_to_end(key)
        self.__dict__["_last"] = compiled
        if compiled.writebacks:
            self._check_writebacks(compiled, leaves)
        feeds = self._before_run(compiled)
        if compiled.out_sbps is None:
            outs = compiled.runner.run(leaves, feeds)
        else:  # global tensors: the plan runs on this rank's pieces
            outs = compiled.runner.run(
                [t if t._gl is None else _global._local_alias(t) for t in leaves], feeds)
            outs = [o if where is None else _global.make(o._blob, where[0], o._device, where[1],
                                                         o._storage)  # the call writes it
                    for o, where in zip(outs, compiled.out_sbps)]
        self._after_run(compiled)
        if compiled.writebacks:
            with no_grad():
                for i, k in compiled.writebacks:
                    leaves[i].copy_(outs[k])
        return unflatten(compiled.out_spec, list(outs))

    def _stale(self, compiled: _Compiled) -> bool:
        """Whether a module slot or a variable the plan reads changed since it was compiled
        (a replaced parameter, model.double(), requires_grad_(False), p.data = ...).  Such a
        plan would read the old tensor or mislabel the new data, so the call recompiles."""
        for store, key, obj in compiled.slots:
            if store.get(key) is not obj:
                return self._recompiling(f"{key!r} is no longer the object it traced")
        for pre, post, n_pre, n_post in compiled.hooks:
            if len(pre) != n_pre or len(post) != n_post:
                return self._recompiling("a module's forward hooks changed")
        for t, meta, rg, blob, strides, offset in compiled.tensors:
            if (t._blob is not blob or t._requires_grad is not rg or t._strides != strides
                    or t._offset != offset or (t._meta is not meta and t._meta != meta)):
                return self._recompiling(
                    f"a variable changed (now {t.dtype.name}{list(t.shape)}, "
                    f"requires_grad={t._requires_grad}; traced {meta.dtype.name}"
                    f"{list(meta.shape)}, requires_grad={rg})")
        return False

    def _recompiling(self, why: str) -> bool:
        self.__dict__.pop("_all_modules", None)  # a submodule may have been replaced
        if self._debug >= 0:
            print(f"{self._name}: recompiling: {why}")
        return True

    def _bound_cache(self) -> None:
        cache, size = self._cache, self._cache_size
        limit = DEFAULT_PLAN_CACHE_SIZE if size is None else size
        if len(cache) <= limit:
            return
        cache.popitem(last=False)
        if size is None and not self._cache_warned:
            self.__dict__["_cache_warned"] = True
            warnings.warn(
                f"{self._name} has compiled {limit + 1} plans (one per new input shape, dtype, "
                f"Python constant or module mode); it keeps the {limit} most recently used "
                "and recompiles the others when they come back. Pass tensors instead of "
                "changing Python constants, or decorate __init__ with "
                "nn.Graph.with_dynamic_input_shape(size=...) to choose the bound",
                RuntimeWarning, stacklevel=3)

    def _check_writebacks(self, compiled: _Compiled, leaves: list) -> None:
        """build() writes these inputs in place: refuse what eager mode would refuse, and
        what the copy-back could not reproduce (two arguments over the same memory)."""
        for i, _ in compiled.writebacks:
            t = leaves[i]
            if t.requires_grad:
                if t.grad_fn is None:
                    raise RuntimeError(
                        f"{self._name}: a leaf Variable that requires grad is being used in an "
                        f"in-place operation (build() writes input {i} in place)")
                raise NotImplementedError(
                    f"{self._name}: build() writes input {i} in place, and it requires grad; "
                    "graph calls are not differentiated through their inputs")
        storages = [t._storage for t in leaves]
        if len({id(st) for st in storages}) != len(storages):
            raise NotImplementedError(
                f"{self._name}: build() writes an input in place, and two inputs share memory; "
                "pass separate tensors (e.g. .clone() one of them)")

    @staticmethod
    def with_dynamic_input_shape(*, size: int = 10, enable_shared: bool = True):
        """OneFlow's decorator of a graph's `__init__`: keep at most `size` compiled plans
        (least recently used dropped).  sbpflow recompiles per input signature anyway; this
        only bounds the cache.  (`enable_shared` is accepted: plans share the variables.)"""
        if size < 1:
            raise ValueError(f"with_dynamic_input_shape: size must be >= 1, got {size}")

        def deco(init):
            @functools.wraps(init)
            def wrapped(self, *args, **kwargs):
                init(self, *args, **kwargs)
                self.__dict__["_cache_size"] = int(size)

            return wrapped

        return deco

    # -- compiling -----------------------------------------------------------------------------
    def _signature(self, spec, leaves) -> tuple:
        """What a compiled plan depends on: the argument structure and constants, each input
        tensor's meta (and placement/SBP), every module's train/eval mode, the optimizer
        hyperparameters baked into the update ops, and the config flags."""
        metas = tuple([
            t._meta if t._gl is None else (t._meta, t._gl.placement, tuple(t._gl.sbp))
            for t in leaves])
        mods = self.__dict__.get("_all_modules")
        if mods is None:
            mods = self.__dict__["_all_modules"] = [
                m for mod in self._modules.values() for m in mod.modules()]
        modes = tuple([m.training for m in mods])
        hyper = tuple([tuple([_const_key(g.get(k)) for k in _HYPER_KEYS])
                       for opt, _ in self._optimizers for g in opt.param_groups])
        return (spec, metas, modes, hyper, tuple(self.config._flags.items()))

    def _names(self) -> dict[int, str]:
        names, _ = module_names(self._modules)
        for i, (opt, _) in enumerate(self._optimizers):
            for g, group in enumerate(opt.param_groups):
                for j, p in enumerate(group["params"]):
                    names.setdefault(id(p), f"_optimizer{i}.group{g}.param{j}")
        return names

    def _compile(self, args, kwargs) -> _Compiled:
        with _gc_paused():
            try:
                compiled = self._compile_now(args, kwargs)
            except MemoryError as e:
                raise RuntimeError(f"{self._name}: out of memory while compiling the graph: "
                                   f"{e}") from e
        self._guard(compiled)
        return compiled

    def _guard(self, compiled: _Compiled) -> None:
        """compiled.slots and compiled.tensors: what the plan must find unchanged to be
        reused (see _Compiled)."""
        where, slots, hook_counts = {}, [], []
        for attr, module in self._modules.items():
            slots.append((self._modules, attr, module))
            for m in module.modules():
                for store in (m._parameters, m._buffers):
                    for k, t in store.items():
                        if t is not None:
                            where.setdefault(id(t), (store, k))
                slots.extend((m._modules, k, sub) for k, sub in m._modules.items())
                # forward hooks run inside build(): one added or removed changes the trace
                slots.extend((hooks, k, h) for hooks in (m._forward_pre_hooks,
                                                         m._forward_hooks)
                             for k, h in hooks.items())
                hook_counts.append((m._forward_pre_hooks, m._forward_hooks,
                                    len(m._forward_pre_hooks), len(m._forward_hooks)))
        tensors = []
        for v in compiled.job.variables.values():
            t = v.tensor
            if t is None:
                continue
            if id(t) in where:
                slots.append((*where[id(t)], t))
            tensors.append((t, t._meta, t._requires_grad, t._blob, t._strides, t._offset))
        compiled.slots, compiled.tensors, compiled.hooks = slots, tensors, hook_counts

    def _compile_now(self, args, kwargs) -> _Compiled:
        t0 = time.perf_counter()
        job = Job(self._name)
        job.config.update(self.config._flags)
        attrs = {}
        for proxy in self._proxies.values():
            _collect_settings(proxy, attrs)
        if attrs:
            job.config["module_attrs"] = attrs
        steps = self.config._flags.get("gradient_accumulation_steps", 1)
        traced_args = (args, kwargs)
        if steps > 1:
            traced_args = self._micro_batch_args(args, kwargs, steps)
        out_spec = trace_build(job, self.build, *traced_args, self._modules, self._names())
        trace_s = time.perf_counter() - t0
        if self._debug >= 1:
            print(f"{self._name}: traced build() in {trace_s * 1e3:.1f} ms\n{job}")
        if self._optimizers and not job.loss:
            raise RuntimeError(
                f"{self._name}: the graph has an optimizer (a training graph) but build() "
                "called no loss.backward(); call it on the loss inside build(), or remove "
                "the optimizer for an eval graph")
        states, feeds = self._add_optimizer_config(job) if self._optimizers else ([], [])
        dump = None
        if self._debug >= 1:
            def dump(name, j):
                print(f"{self._name}: after pass {name}\n{j}")
        times = _passes.run_passes(job, dump=dump, check=self._debug >= 0)
        if comm.is_multi_process():  # every rank traced the same Job, or all fail now
            _agreement.agree(job)
        t1 = time.perf_counter()
        runner = _runner_factory(job)
        compile_s = time.perf_counter() - t1
        if self._debug >= 0:
            parts = ", ".join(f"{n} {s * 1e3:.1f} ms" for n, s in times.items())
            print(f"{self._name}: trace {trace_s * 1e3:.1f} ms; passes: {parts}; "
                  f"compile {compile_s * 1e3:.1f} ms")
        compiled = _Compiled(job, out_spec, runner, times, states, feeds)
        compiled.writebacks = [(op.attrs["writeback"], k) for k, op in enumerate(job.outputs())
                               if "writeback" in op.attrs]
        leaves: list = []
        flatten((args, kwargs), leaves)
        outs = [job.tensors[op.inputs[0]] for op in job.outputs()]
        if any(t.is_global for t in leaves) or any(t.is_global for t in outs):
            # Global outputs carry the placement and SBP the Job gives them (those eager mode
            # gives the same program): (logical meta, GlobalInfo of this rank's piece).
            rank = comm.get_rank()
            compiled.out_sbps = [
                (t.meta, _global.GlobalInfo(t.placement, t.sbp, _global._local_meta(
                    t.meta, t.placement, t.sbp, rank))) if t.is_global else None
                for t in outs]
        return compiled

    def _micro_batch_args(self, args, kwargs, steps: int):
        """The arguments build() is traced with under gradient accumulation: each tensor
        argument's first micro-batch (a view), so build() sees micro-batch shapes as in
        OneFlow; the grad_accumulation pass then runs it on every micro-batch."""
        setting = f"config.set_gradient_accumulation_steps({steps})"
        if not self._optimizers:
            raise RuntimeError(
                f"{self._name}: {setting} needs a training graph (add_optimizer): it "
                "accumulates gradients over micro-batches for one optimizer step.  An eval "
                "graph has none (OneFlow ignores the setting there; sbpflow refuses it): "
                "leave it at 1")
        leaves: list = []
        spec = flatten((args, kwargs), leaves)
        pieces = []
        for i, t in enumerate(leaves):
            if t.dim() == 0 or t.shape[0] % steps:
                what = ("is 0-dim (no axis 0 to split)" if t.dim() == 0 else
                        f"has batch size {t.shape[0]} (shape {list(t.shape)}), which {steps} "
                        "does not divide")
                raise ValueError(
                    f"{self._name}: {setting} splits every tensor argument along axis 0 into "
                    f"{steps} micro-batches, but tensor argument {i} (counted from 0 in "
                    f"build()'s argument order) {what}; pass a batch "
                    f"whose size is a multiple of {steps}, or hold tensors that are not "
                    "batches in the modules (buffers) instead of passing them")
            with no_grad():
                if t.is_global:  # the first n-th of each rank's piece (OneFlow's unpack)
                    # every rank decides from the layout, so all raise together or none
                    for r in t.placement.rank_list:
                        rows = _layout.local_shape(tuple(t.shape), t.placement, t.sbp, r)[0]
                        if rows % steps:
                            raise ValueError(
                                f"{self._name}: {setting} cuts each rank's piece of a global "
                                f"argument along axis 0 into {steps} micro-batches, but rank "
                                f"{r}'s piece of tensor argument {i} (counted from 0 in "
                                f"build()'s argument order; shape {list(t.shape)}, sbp "
                                f"{t.sbp} on {t.placement}) has {rows} rows, which {steps} "
                                f"does not divide; pass a batch whose piece on every rank is "
                                f"a multiple of {steps}")
                    local = t.to_local()
                    piece = local.narrow(0, 0, local.shape[0] // steps).to_global(
                        t.placement, t.sbp)
                else:
                    piece = t.narrow(0, 0, t.shape[0] // steps)
            pieces.append(piece)
        return unflatten(spec, pieces)

    def _add_optimizer_config(self, job: Job) -> list:
        """job.config["optimizers"] and the state variables (the eager state tensors)."""
        specs, states, feeds = [], [], []
        names = {id(v.tensor): n for n, v in job.variables.items() if v.tensor is not None}
        for i, (opt, _) in enumerate(self._optimizers):
            kind = _optimizer_kind(opt)
            groups = []
            for g, group in enumerate(opt.param_groups):
                hyper = _hyper(kind, group)
                entry = {"params": [], "hyper": hyper, "lr": f"lr-{i}-{g}",
                         "states": {},
                         "clip_grad_max_norm": group.get("clip_grad_max_norm"),
                         "clip_grad_norm_type": float(group.get("clip_grad_norm_type", 2.0))}
                if kind == "sgd" and hyper["momentum"] != 0:
                    # 1.0 until the graph has initialised the group's momentum buffers: a
                    # variable the update op clears, so a step that fails leaves it set.
                    fname = f"_optimizer{i}.group{g}-first"
                    flag = self._aux_vars.get(fname)
                    ps = group["params"]
                    where = ps[0]._gl.placement if ps and ps[0]._gl is not None else None
                    if flag is None or (flag._gl.placement if flag._gl is not None
                                        else None) != where:
                        from ..framework import functional as F

                        flag = F.ones((), dtype=_float64)
                        if where is not None:  # the flag lives where the parameters do
                            flag = flag.to_global(where, (_B,) * where.ndim)
                        self._aux_vars[fname] = flag
                    job.variables[fname] = Variable(fname, flag._meta, False, tensor=flag)
                    entry["first"] = fname
                for p in group["params"]:
                    var = names.get(id(p))
                    if var is None or not job.variables[var].trainable:
                        continue  # not used by build(): no gradient, no update (as eager)
                    entry["params"].append(var)
                    entry["states"][var] = {}
                    for key, tensor in self._state_tensors(kind, opt, p, hyper, var):
                        sname = f"{var}-{STATE_SUFFIX[key]}"
                        job.variables[sname] = Variable(sname, tensor._meta, False, tensor=tensor)
                        entry["states"][var][key] = sname
                        states.append((opt, p, key, sname))
                groups.append(entry)
                used = [p for p in group["params"] if names.get(id(p)) in entry["states"]]
                first = job.variables[entry["first"]].tensor if "first" in entry else None
                feeds.append((entry["lr"], group, first, used, opt))
            specs.append({"kind": kind, "groups": groups})
        job.config["optimizers"] = specs
        return states, feeds

    def _state_tensors(self, kind, opt, p, hyper, var):
        """(torch state key, tensor) of p's optimizer state, created in torch's format."""
        if kind in ("adagrad", "ftrl"):
            return []  # one-embedding tables only: their state lives in the store
        if kind == "sgd":
            if hyper["momentum"] == 0:
                return []
            buf = opt.state[p].get("momentum_buffer") if p in opt.state else None
            if buf is None:
                # Not in opt.state until the graph has run a step: a following eager step
                # must see no buffer, as torch's first step does (buf = grad).
                sname = f"{var}-momentum"
                buf = self._aux_vars.get(sname)
                if buf is None or buf._meta != p._meta:
                    from ..framework import functional as F

                    buf = F.zeros_like(p).detach()
                    self._aux_vars[sname] = buf
            return [("momentum_buffer", buf)]
        state = opt._state_for(p, hyper["amsgrad"])
        keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if hyper["amsgrad"] else [])
        return [(k, state[k]) for k in keys + ["step"]]

    # -- running -------------------------------------------------------------------------------
    def _before_run(self, compiled: _Compiled) -> dict:
        """Host scalars for this call, and the eager optimizer state synced into the
        variables (a state tensor replaced in eager mode is copied into the variable)."""
        feeds = {}
        job = compiled.job
        from_eager = set()  # params whose state eager mode made or replaced
        for opt, p, key, sname in compiled.states:
            var = job.variables[sname].tensor
            state = opt.state.get(p)
            cur = state.get(key) if state is not None else None
            if cur is not None and cur is not var:
                if cur._meta != var._meta:
                    _check_state(self._name, sname, cur, var)
                with no_grad():
                    var.copy_(cur)
                opt.state[p][key] = var
                from_eager.add(p)
        for lr_key, group, first, used, opt in compiled.feeds:
            lr = group["lr"]
            feeds[lr_key] = float(lr.item() if isinstance(lr, Tensor) else lr)
            if first is not None:
                # The flag is the graph's own state; host knowledge overrides it only when
                # eager mode changed the buffers (eager steps made them, or state was reset).
                ready = []
                for p in used:
                    state = opt.state.get(p)
                    ready.append(state is not None and "momentum_buffer" in state)
                if any(ready) and not all(ready):
                    raise NotImplementedError(
                        "nn.Graph: some parameters of an SGD group have a momentum buffer "
                        "and some do not; run one eager step or reset the optimizer state")
                known = self._graph_buffers
                if not any(ready):
                    first.fill_(1.0)
                    known.difference_update(map(id, used))
                elif any(p in from_eager or id(p) not in known for p in used):
                    first.fill_(0.0)
                    known.update(map(id, used))
        return feeds

    def _after_run(self, compiled: _Compiled) -> None:
        if not self._optimizers:
            return
        for opt, p, key, sname in compiled.states:
            state = opt.state[p]
            if key not in state:  # SGD's buffer exists once the graph stepped
                state[key] = compiled.job.variables[sname].tensor
                self._graph_buffers.add(id(p))
        self.__dict__["_train_step"] += 1
        for opt, lr_sch in self._optimizers:
            opt._opt_called = True  # a scheduler checks that the optimizer stepped first
            if lr_sch is not None:
                lr_sch.step()

    # -- state ---------------------------------------------------------------------------------
    def _state_names(self) -> dict:
        """variable name -> (optimizer, param, torch state key) for every optimized param."""
        names = self._names()
        out = {}
        for opt, _ in self._optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    for key, suffix in STATE_SUFFIX.items():
                        out[f"{names[id(p)]}-{suffix}"] = (opt, p, key)
        return out

    def state_dict(self, destination=None) -> dict:
        """OneFlow's layout: one entry per module attribute (its state dict), the optimizer
        states as flat variables `<param>-momentum`, `-m`, `-v`, ..., and the train step."""
        from ..framework import functional as F

        out = OrderedDict() if destination is None else destination
        for n, m in self._modules.items():
            out[n] = m.state_dict()
        for sname, (opt, p, key) in self._state_names().items():
            t = opt.state[p].get(key) if p in opt.state else None
            if t is not None:
                out[sname] = t
        if self._optimizers:
            out[TRAIN_STEP] = F.tensor(self._train_step)
        return out

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        states = self._state_names()
        for k, v in state_dict.items():  # refuse a bad entry before anything is replaced
            if k in states:
                _check_state(f"{self._name}.load_state_dict", k, v, states[k][1], states[k][2])
            elif strict and k not in self._modules and k != TRAIN_STEP:
                raise KeyError(f"{self._name}.load_state_dict: unexpected key {k!r}")
        for n, m in self._modules.items():
            if n in state_dict:
                m.load_state_dict(state_dict[n], strict=strict)
            elif strict:
                raise KeyError(f"{self._name}.load_state_dict: missing module entry {n!r}")
        for k, v in state_dict.items():
            if k in self._modules:
                continue
            if k == TRAIN_STEP:
                self.__dict__["_train_step"] = int(v.item() if isinstance(v, Tensor) else v)
            elif k in states:
                opt, p, key = states[k]
                cur = opt.state[p].get(key) if p in opt.state else None
                with no_grad():
                    if cur is not None and cur._meta == v._meta:
                        cur.copy_(v)
                    else:
                        opt.state[p][key] = v.detach().clone()

    # -- inspection ----------------------------------------------------------------------------
    def _job(self) -> Job:
        if self._last is None:
            raise RuntimeError(f"{self._name}: the graph has not been called yet (no Job)")
        return self._last.job

    def to_dot(self) -> str:
        """Graphviz source of the last compiled Job."""
        return self._job().to_dot()

    def __repr__(self):
        lines = [f"(GRAPH:{self._name}:{type(self).__name__}): ("]
        lines.append(f"  (CONFIG:config:{self.config!r}, training={self.training})")
        job = self._last.job if self._last is not None else None
        if job is not None:
            for op in job.inputs():
                t = job.tensors[op.outputs[0]]
                lines.append(f"  (INPUT:{t.name}:tensor(..., size={tuple(t.shape)}, "
                             f"dtype=sbpflow.{t.dtype.name}, is_lazy='True'))")
        for n, m in self._modules.items():
            lines.extend("  " + s for s in _module_lines(m, n, 0))
        if job is not None:
            for op in job.outputs():
                t = job.tensors[op.inputs[0]]
                lines.append(f"  (OUTPUT:output_{op.attrs['index']}:tensor(..., "
                             f"size={tuple(t.shape)}, dtype=sbpflow.{t.dtype.name}, "
                             "is_lazy='True'))")
        lines.append(")")
        return "\n".join(lines)


def _check_state(where: str, name: str, value, like, key: str | None = None) -> None:
    """An optimizer state must have its parameter's shape and dtype (a scalar `step` only
    needs to be a number): one that would broadcast or cast raises, naming the key."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{where}: optimizer state {name!r} must be a Tensor, got "
                        f"{type(value).__name__}")
    if key == "step" or (key is None and name.endswith("-step")):
        if value.numel() != 1:
            raise RuntimeError(f"{where}: optimizer state {name!r} must hold one number, got "
                               f"shape {list(value.shape)}")
        return
    if tuple(value.shape) != tuple(like.shape) or value.dtype != like.dtype:
        raise RuntimeError(
            f"{where}: size or dtype mismatch for optimizer state {name!r}: copying a state of "
            f"shape {list(value.shape)} and dtype {value.dtype.name} from the checkpoint, its "
            f"parameter has shape {list(like.shape)} and dtype {like.dtype.name}")


def _optimizer_kind(opt) -> str | None:
    mro = {c.__name__ for c in type(opt).__mro__}
    if "SGD" in mro:
        return "sgd"
    if "Adam" in mro:  # AdamW subclasses Adam (decoupled_weight_decay)
        return "adam"
    if "Adagrad" in mro:  # these two update one-embedding tables only (passes/optimizer.py)
        return "adagrad"
    if "Ftrl" in mro:
        return "ftrl"
    return None


def _scalar(v) -> float:
    return float(v.item() if isinstance(v, Tensor) else v)


def _hyper(kind, group) -> dict:
    if kind == "sgd":
        return {"momentum": _scalar(group["momentum"]), "dampening": _scalar(group["dampening"]),
                "nesterov": bool(group["nesterov"]),
                "weight_decay": _scalar(group["weight_decay"]),
                "maximize": bool(group["maximize"])}
    if kind in ("adagrad", "ftrl"):
        keys = (("lr_decay", "initial_accumulator_value", "eps", "weight_decay", "maximize")
                if kind == "adagrad" else ("lr_power", "initial_accumulator_value", "lambda1",
                                           "lambda2", "beta", "weight_decay"))
        return {k: (bool(group[k]) if k == "maximize" else _scalar(group[k])) for k in keys}
    if not group.get("do_bias_correction", True):
        raise NotImplementedError(
            "nn.Graph optimizer pass: Adam(do_bias_correction=False) is not supported in a "
            "graph yet (its update op always corrects); it works in eager mode")
    b1, b2 = group["betas"]
    return {"beta1": _scalar(b1), "beta2": _scalar(b2), "eps": _scalar(group["eps"]),
            "weight_decay": _scalar(group["weight_decay"]),
            "decoupled_weight_decay": bool(group.get("decoupled_weight_decay", False)),
            "amsgrad": bool(group["amsgrad"]), "maximize": bool(group["maximize"])}


# Param-group entries baked into the update ops (a change recompiles; `lr` is fed instead).
_HYPER_KEYS = ("momentum", "dampening", "nesterov", "weight_decay", "maximize", "betas", "eps",
               "amsgrad", "decoupled_weight_decay", "clip_grad_max_norm",
               "clip_grad_norm_type", "lr_decay", "initial_accumulator_value", "lr_power",
               "lambda1", "lambda2", "beta", "do_bias_correction")


# -- the call key ---------------------------------------------------------------------------
_TENSOR = object()  # where a tensor argument stands in a call key (its meta is keyed apart)


def _call_key(obj, leaves: list):
    """A hashable key of a call's argument structure and Python constants, collecting the
    tensors into `leaves` in `trace.flatten`'s order.  Constants are keyed as Python tells
    them apart, not by ==: 1, 1.0 and True differ, 0.0 and -0.0 differ, and NaN equals NaN
    (a plan bakes the constant in, so a NaN must not compile a new plan on every call)."""
    if isinstance(obj, Tensor):
        leaves.append(obj)
        return _TENSOR
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple([_call_key(x, leaves) for x in obj]))
    if isinstance(obj, dict):
        return (dict, tuple([(_const_key(k), _call_key(v, leaves)) for k, v in obj.items()]))
    return _const_key(obj)


_PLAIN = frozenset({int, bool, str, bytes, type(None)})


def _const_key(c):
    t = type(c)
    if t in _PLAIN:
        return (t, c)
    if isinstance(c, float):
        return (t, c.hex() if c == c else "nan")
    if isinstance(c, complex):
        return (t, _const_key(c.real)[1], _const_key(c.imag)[1])
    if isinstance(c, (np.ndarray, np.generic)):
        # by value (a plan bakes it in), NaNs made canonical as for floats
        a = np.asarray(c)
        if a.dtype.kind in "fc":
            a = np.where(np.isnan(a), np.nan, a)
        return (t, a.dtype.str, a.shape, a.tobytes())
    if t.__module__.split(".")[0] == "torch" and t.__name__ in ("Tensor", "Parameter"):
        raise TypeError(f"expected sbpflow Tensor, got torch.Tensor (shape "
                        f"{tuple(c.shape)}); convert it with sbpflow.from_numpy(t.numpy()) "
                        "or sbpflow.tensor(t.tolist())")
    try:
        hash(c)
    except TypeError:
        return _Identity(c)
    return (t, c)


class _Identity:
    """The key of an unhashable constant: the object itself (a plan is reused only for the
    same object; the key keeps it alive, so its id is not reused)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return type(other) is _Identity and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


__all__ = ["Graph", "GraphConfig", "GraphModule", "ProxyModule"]
