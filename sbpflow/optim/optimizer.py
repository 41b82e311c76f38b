"""The Optimizer base: parameter groups, per-parameter state, state dicts, step hooks.

Follows torch.optim.Optimizer.  Subclasses implement `step`; the base wraps every subclass's
`step` so it runs under `no_grad`, calls the step hooks, and tells a learning-rate scheduler
that the optimizer has stepped (the scheduler warns when the order is wrong).

Updates are written with in-place tensor ops (`p.add_`, `mul_`, `addcmul_`, ...), never NumPy on
parameters, so the same code runs on any device and inside graphs.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections import OrderedDict, defaultdict
from itertools import chain
from threading import get_ident
from typing import Any

import numpy as _np

from .._core import dtype as dt
from .._core.meta import TensorMeta
from ..autograd import grad_mode
from ..framework import interpreter as _interp
from ..framework.functional.creation import tensor as _tensor
from ..framework.tensor import Tensor
from ..ops import registry as _registry
from ..ops.registry import KernelContext


class _RequiredParameter:
    """The default of an option that every param group must set (e.g. SGD's lr in old torch)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


class _HookHandle:
    """Removes a hook from the ordered dict it was registered in."""

    _next_id = 0

    def __init__(self, hooks: OrderedDict):
        self._hooks = hooks
        self.id = _HookHandle._next_id
        _HookHandle._next_id += 1

    def remove(self) -> None:
        self._hooks.pop(self.id, None)


_global_step_pre_hooks: OrderedDict = OrderedDict()
_global_step_post_hooks: OrderedDict = OrderedDict()


def register_optimizer_step_pre_hook(hook) -> _HookHandle:
    """torch's: hook(optimizer, args, kwargs) before every optimizer's step."""
    handle = _HookHandle(_global_step_pre_hooks)
    _global_step_pre_hooks[handle.id] = hook
    return handle


def register_optimizer_step_post_hook(hook) -> _HookHandle:
    """torch's: hook(optimizer, args, kwargs) after every optimizer's step."""
    handle = _HookHandle(_global_step_post_hooks)
    _global_step_post_hooks[handle.id] = hook
    return handle


def _wrap_step(step):
    """Run `step` without recording autograd, between the pre- and post-step hooks."""

    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        if self.__dict__.get("_in_step"):
            # A subclass's step calling super().step(): hooks and counters run once.
            return step(self, *args, **kwargs)
        pre = [*_global_step_pre_hooks.values(), *self._optimizer_step_pre_hooks.values()]
        for hook in pre:
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(
                        f"{hook} must return None or a tuple of (new_args, new_kwargs), but got "
                        f"{result}."
                    )
                args, kwargs = result
        differentiable = self.defaults.get("differentiable", False)
        self._in_step = True
        try:
            with grad_mode.set_grad_enabled(bool(differentiable)):
                out = step(self, *args, **kwargs)
        finally:
            self._in_step = False
        self._opt_called = True  # lets a scheduler check it is stepped after the optimizer
        for hook in [*self._optimizer_step_post_hooks.values(), *_global_step_post_hooks.values()]:
            hook(self, args, kwargs)
        return out

    wrapper._sbpflow_wrapped_step = True
    return wrapper


class Optimizer:
    """Base class of all optimizers.

    params: an iterable of Tensors, of (name, Tensor) pairs, or of dicts that define
    parameter groups (each with a "params" entry and optional per-group options).
    defaults: the options every group gets unless it sets its own.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "_sbpflow_wrapped_step", False):
            cls.step = _wrap_step(step)

    def __init__(self, params, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
        self._opt_called = False
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {_typename(params)}"
            )
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        param_groups = list(params)
        if len(param_groups) == 0:
            # torch refuses an empty list; OneFlow takes it (one empty group, steps do
            # nothing), and OneFlow programs build optimizers over modules that may have none
            param_groups = [{"params": []}]
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    # -- groups -------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters (with its own options) to optimize."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead."
            )
        else:
            params = list(params)
        tensors, names = [], []
        for p in params:
            if isinstance(p, tuple):
                names.append(p[0])
                tensors.append(p[1])
            else:
                tensors.append(p)
        param_group["params"] = tensors
        if names:
            if len(names) != len(tensors):
                raise ValueError(
                    "all optimizer params should be with/without names. Some param names are "
                    "missing"
                )
            param_group["param_names"] = names
        for p in tensors:
            if not isinstance(p, Tensor):
                raise TypeError(
                    "optimizer can only optimize Tensors, but one of the params is "
                    f"{_typename(p)}"
                )
            if not self.defaults.get("differentiable", False) and not (
                p.is_leaf or p.retains_grad
            ):
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(
                    "parameter group didn't specify a value of required optimization parameter "
                    f"{name}"
                )
            param_group.setdefault(name, default)
        # Tensors hash by identity, and == is elementwise: compare ids, never the tensors.
        ids = [id(p) for p in tensors]
        if len(ids) != len(set(ids)):
            warnings.warn(
                "optimizer contains a parameter group with duplicate parameters; in future, this "
                "will cause an error; see github.com/pytorch/pytorch/issues/40967 for more "
                "information",
                stacklevel=3,
            )
        seen: set[int] = set()
        for group in self.param_groups:
            seen.update(id(p) for p in group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                which = "with names" if "param_names" in param_group else "without names"
                raise ValueError(
                    "all optimizer param groups should be with/without names. cannot add param "
                    f"group {which} to the optimizer"
                )
        if not seen.isdisjoint(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    # -- gradients ------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all optimized tensors (to None by default, as torch does).

        With set_to_none=False the gradients of a group are zeroed by one multi-tensor fill
        per device (unless the group sets foreach=False), as torch's foreach zeroing does."""
        for group in self.param_groups:
            grads = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                    continue
                g = p.grad
                if g.grad_fn is not None:
                    g.detach_()
                else:
                    g.requires_grad_(False)
                grads.append(g)
            if grads and not (group.get("foreach") is not False and _foreach_zero(grads)):
                for g in grads:
                    g.zero_()

    def step(self, closure=None):
        """Perform one optimization step; `closure` re-evaluates the model and returns the loss."""
        raise NotImplementedError

    def _step_groups(self, closure):
        """The step of the optimizers with a multi-tensor path: per param group, the
        parameters with a gradient go to `_foreach_group` (one fused op per bucket; False when
        it doesn't apply) or else to `_single_group` (torch's per-parameter formulas)."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if group["foreach"] is not False and self._foreach_group(group, params):
                continue
            self._single_group(group, params)
        return loss

    @staticmethod
    def _closure_loss(closure):
        """Evaluate the closure with grad enabled (step itself runs under no_grad)."""
        if closure is None:
            return None
        with grad_mode.enable_grad():
            return closure()

    # -- hooks ----------------------------------------------------------------------------------
    def register_step_pre_hook(self, hook) -> _HookHandle:
        """hook(optimizer, args, kwargs) -> None or (new_args, new_kwargs), before each step."""
        handle = _HookHandle(self._optimizer_step_pre_hooks)
        self._optimizer_step_pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook) -> _HookHandle:
        """hook(optimizer, args, kwargs) -> None, after each step."""
        handle = _HookHandle(self._optimizer_step_post_hooks)
        self._optimizer_step_post_hooks[handle.id] = hook
        return handle

    # -- state dicts ----------------------------------------------------------------------------
    def __getstate__(self):
        # Host caches of step counts are keyed by id(param): meaningless in another process,
        # and not something a checkpoint should carry.  Pickled as their names only.
        state = self.__dict__.copy()
        caches = [k for k, v in state.items() if isinstance(v, _HostScalars)]
        for k in caches:
            del state[k]
        state["_host_caches"] = caches
        return state

    def __setstate__(self, state):
        state = dict(state)
        caches = state.pop("_host_caches", [])
        self.__dict__.update(state)
        for k in caches:
            setattr(self, k, _HostScalars())

    def state_dict(self) -> dict[str, Any]:
        """torch's format: {'state': {index: {...}}, 'param_groups': [{..., 'params': [index]}]}.

        Parameters are numbered in the order they appear across groups; the tensors in 'state'
        are the optimizer's own (not copies), as in torch.
        """
        index_of: dict[int, int] = {}
        packed_groups = []
        start = 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                index_of.setdefault(id(p), i)
            packed["params"] = [index_of[id(p)] for p in group["params"]]
            start += len(packed["params"])
            packed_groups.append(packed)
        packed_state = {
            (index_of[id(k)] if isinstance(k, Tensor) else k): v for k, v in self.state.items()
        }
        return {"state": packed_state, "param_groups": packed_groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict from `state_dict()` (ours or a converted torch one)."""
        groups = self.param_groups
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for g, s in zip(groups, saved_groups, strict=True):
            if len(g["params"]) != len(s["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size of "
                    "optimizer's group"
                )
        param_of = dict(
            zip(
                chain.from_iterable(g["params"] for g in saved_groups),
                chain.from_iterable(g["params"] for g in groups), strict=True,
            )
        )
        state: defaultdict = defaultdict(dict)
        for key, value in state_dict["state"].items():
            # Keys may come back as strings from a JSON-like round trip; accept "3" for 3.
            index = _as_index(key)
            if index in param_of:
                p = param_of[index]
                state[p] = {k: _cast_state(p, v, k) for k, v in value.items()}
            else:
                state[key] = value
        new_groups = []
        for group, saved in zip(groups, saved_groups, strict=True):
            saved["params"] = group["params"]
            if "param_names" in group and "param_names" not in saved:
                saved["param_names"] = group["param_names"]
            new_groups.append(saved)
        self.state = state
        self.param_groups = new_groups
        self._fix_loaded_groups()

    def _fix_loaded_groups(self) -> None:
        """Subclasses restore invariants of loaded groups (defaults for new options)."""
        for group in self.param_groups:
            for name, default in self.defaults.items():
                if default is not required:
                    group.setdefault(name, default)
            if isinstance(group.get("betas"), list):  # a list after a JSON round trip
                group["betas"] = tuple(group["betas"])
        for state in self.state.values():
            # An old checkpoint may hold the step as a number; we keep it as a tensor.
            if isinstance(state, dict) and isinstance(state.get("step"), (int, float)):
                state["step"] = _step_counter(state["step"])

    def __repr__(self) -> str:
        out = self.__class__.__name__ + " ("
        for i, group in enumerate(self.param_groups):
            out += f"\nParameter Group {i}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    out += f"    {key}: {group[key]}\n"
        return out + ")"


def _typename(obj) -> str:
    if isinstance(obj, Tensor):
        return "sbpflow.Tensor"
    return type(obj).__module__ + "." + type(obj).__qualname__


def _as_index(key):
    if isinstance(key, str) and key.isdigit():
        return int(key)
    return key


def _cast_state(param: Tensor, value, key):
    """A copy of a loaded state value in the parameter's dtype (torch's policy).

    The step counter keeps its own dtype; other floating tensors follow the parameter, so a
    float64 checkpoint loads into float32 parameters and vice versa.
    """
    if isinstance(value, Tensor):
        if key != "step" and param.dtype.is_floating_point and value.dtype.is_floating_point:
            value = value.to(param.dtype)
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _cast_state(param, v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_state(param, v, None) for v in value)
    return value


def _scalar(value) -> float:
    """A Python number from a float or a one-element tensor (lr, betas may be tensors)."""
    return value.item() if isinstance(value, Tensor) else value


def _step_counter(value: float = 0.0) -> Tensor:
    """The step count of a parameter's state.

    torch keeps it as a float32 0-dim tensor (so state dicts carry the same entry); so do we.
    """
    return _tensor(float(value), dtype=dt.float32)


def _check_unsupported(name: str, **flags) -> None:
    """torch options whose special paths we don't have: accept False/None, reject True."""
    for flag, value in flags.items():
        if value:
            raise NotImplementedError(f"{name}: {flag}=True is not supported by sbpflow yet")


def _round_like(value: float, t: Tensor) -> float:
    """`value` rounded to `t`'s dtype, as storing it in `t` would round it."""
    if t.dtype is dt.float32:
        return float(_np.float32(value))
    if t.dtype is dt.float16:
        return float(_np.float16(value))
    return float(value)


class _HostScalars:
    """Host copies of 0-d state tensors (step counts, NAdam's mu_product, ASGD's eta and mu).

    torch keeps these as 0-d tensors in the state (so state dicts carry them) and reads them
    back with `.item()` on every step.  Here an optimizer remembers the value it last wrote into
    each such tensor, so a step reads the host copy instead of waiting on the device; a tensor
    it did not write itself (a loaded state dict, a user's replacement) is read once, and so is
    one written since by someone else (nn.Graph's update, a fused step, a user's `fill_`): the
    copy is keyed on the tensor and its storage version.
    """

    def __init__(self) -> None:
        self._known: dict[tuple[int, str], tuple[Tensor, int, float]] = {}

    def get(self, p: Tensor, state: dict, key: str) -> float:
        t = state[key]
        if not isinstance(t, Tensor):
            return float(t)
        known = self._known.get((id(p), key))
        if known is not None and known[0] is t and known[1] == t._storage.version:
            return known[2]
        value = float(t.item())
        self._known[(id(p), key)] = (t, t._storage.version, value)
        return value

    def remember(self, p: Tensor, state: dict, key: str, value: float) -> None:
        """state[key] was just made holding `value` (no need to read it back)."""
        t = state[key]
        if isinstance(t, Tensor):
            self._known[(id(p), key)] = (t, t._storage.version, _round_like(value, t))

    def set(self, p: Tensor, state: dict, key: str, value: float) -> float:
        """Write `value` into state[key] (in place, asynchronously); return it as stored."""
        t = state[key]
        if not isinstance(t, Tensor):
            state[key] = value
            return value
        t.fill_(value)
        value = _round_like(value, t)
        self._known[(id(p), key)] = (t, t._storage.version, value)
        return value

    def advance(self, p: Tensor, state: dict, key: str = "step") -> float:
        """state[key] += 1; the new count as a Python number."""
        return self.set(p, state, key, self.get(p, state, key) + 1)


def _check_lr(lr) -> None:
    """torch's checks of a learning rate: a float, or a one-element tensor, not negative."""
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= _scalar(lr):
        raise ValueError(f"Invalid learning rate: {lr}")


def _check_betas(betas) -> tuple:
    betas = tuple(_scalar(b) for b in betas)
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    return betas


# -- multi-tensor (foreach) updates ------------------------------------------------------------
_HOST_SCALAR = TensorMeta((), dt.float64)


def _foreach_ok(tensors) -> bool:
    """Whether `tensors` can go through one fused in-place instruction: local tensors on one
    device, outside nn.Graph tracing (a traced step records ops one by one, as before)."""
    if _interp._apply_lazy is not None and get_ident() == _interp._lazy_thread:
        return False
    dev = tensors[0]._device
    for t in tensors:
        if t._gl is not None or (t._device is not dev and t._device != dev):
            return False
    return True


def _fused_inplace(name: str, tensors, scalars, attrs: dict, targets) -> None:
    """Run the multi-tensor op `name` as ONE instruction that writes its outputs into the
    memory of `targets` (the parameters and their states), as torch's foreach updates do.

    `tensors` are the op's tensor inputs, `scalars` the host numbers appended after them (the
    learning rate, SGD's `first`), fed as float64 0-d arrays, so nothing is read back from the
    device.  The op's meta check runs here, at the call; the targets' storage versions are
    bumped at issue, as eager in-place writes do."""
    opdef = _registry.get(name)
    attrs = opdef.bind_attrs(attrs)
    dev = tensors[0]._device
    in_metas = tuple([t._meta for t in tensors]) + (_HOST_SCALAR,) * len(scalars)
    out_metas = opdef.meta(in_metas, attrs)
    for t, m in zip(targets, out_metas, strict=True):
        if t._meta != m:
            raise RuntimeError(f"{name}: internal: target {t._meta} != output {m}")
    prims = dev.prims
    ctx = KernelContext(prims, name, in_metas, out_metas)
    kernel = opdef.kernel
    in_blobs = [t._blob for t in tensors]
    out_blobs = [t._blob for t in targets]
    f64 = dt.float64

    def run():
        arrays = [b.array for b in in_blobs]
        arrays.extend([prims.full((), f64, s) for s in scalars])
        outs = tuple([b.array for b in out_blobs])
        res = kernel(ctx, arrays, out=outs, **attrs)
        for o, r in zip(outs, res if isinstance(res, tuple) else (res,), strict=True):
            if r is not o:
                prims.copy(o, r)

    writes = [t._storage for t in targets]
    _interp._builder.call(name, run, ins=in_blobs, outs=out_blobs,
                          reads=[t._storage for t in tensors], writes=writes,
                          # "small" by its largest tensor: the kernel is one NumPy call per
                          # tensor, so a worker could not overlap more than that with Python.
                          stream=dev.type, numel=max(m.numel for m in out_metas))
    for st in writes:
        st.version += 1


def _buckets(items, key):
    """Items grouped by key(item), in first-seen order."""
    out: dict = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out.values()


def _foreach_zero(grads) -> bool:
    """Zero `grads` with one fill instruction per (device, dtype); False if they can't be."""
    if not _foreach_ok(grads):
        return False
    for g in grads:
        if g._base is not None or not g.is_contiguous():
            return False  # a view (of a shared buffer): the plain zero_ keeps its semantics
    for bucket in _buckets(grads, lambda g: (g._device, g._meta.dtype)):
        dev = bucket[0]._device
        prims = dev.prims
        blobs = [g._blob for g in bucket]
        d = bucket[0]._meta.dtype

        def run(blobs=blobs, d=d, prims=prims):
            zero = prims.full((), d, 0)
            for b in blobs:
                prims.copy(b.array, zero)

        writes = [g._storage for g in bucket]
        _interp._builder.call("zero_", run, ins=blobs, outs=blobs, writes=writes,
                              stream=dev.type, numel=sum(g._meta.numel for g in bucket))
        for st in writes:
            st.version += 1
    return True


def _foreach_update(name: str, params, state_of, keys, scalar_keys, attrs: dict,
                    scalars) -> bool:
    """One multi-tensor op `name` per (device, dtype) bucket of `params` (those with a
    gradient), writing params, their states `keys` and 0-d state scalars `scalar_keys` in
    place; the op takes per parameter (param, grad, *states, *scalars), then `scalars` (host
    numbers, such as lr).  `state_of(p)` makes or returns p's state.  False, with nothing
    written, where the fused path does not apply (global tensors, graph tracing, mismatched
    or missing states): the per-parameter path then runs, and raises torch's errors."""
    grads = [p.grad for p in params]
    if not _foreach_ok(params + grads):
        return False
    blocks = []
    for p, g in zip(params, grads, strict=True):
        if g._meta != p._meta or not p._meta.dtype.is_floating_point or g.is_sparse:
            return False
        state = state_of(p)
        states = [state.get(k) for k in keys]
        counters = [state.get(k) for k in scalar_keys]
        if not (all(isinstance(s, Tensor) and s._meta == p._meta for s in states)
                and all(isinstance(c, Tensor) and c._meta.shape == () for c in counters)
                and _foreach_ok([p, *states, *counters])):
            return False
        blocks.append((p, g, states, counters))
    for bucket in _buckets(blocks, lambda b: (b[0]._device, b[0]._meta.dtype)):
        tensors = [t for p, g, states, counters in bucket for t in (p, g, *states, *counters)]
        targets = [t for p, _, states, counters in bucket for t in (p, *states, *counters)]
        _fused_inplace(name, tensors, scalars, {**attrs, "n": len(bucket)}, targets)
    return True
