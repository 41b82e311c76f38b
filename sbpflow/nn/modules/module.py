"""nn.Module with PyTorch's surface: registration, traversal, state dicts, modes, hooks."""

from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple

import numpy as np

from ...autograd import no_grad
from ...framework.parameter import Parameter
from ...framework.tensor import Tensor

__all__ = ["Module"]

_IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class _IncompatibleKeysRepr(_IncompatibleKeys):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()


class _RemovableHandle:
    _ids = itertools.count()

    def __init__(self, hooks: dict):
        self.hooks = hooks
        self.id = next(self._ids)

    def remove(self):
        self.hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class Module:
    training: bool
    # torch's state-dict format version of this class, recorded in state_dict()._metadata;
    # a class that changes what it saves bumps it and upgrades older dicts on load
    _version: int = 1

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())

    # -- forward ----------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function'
        )

    def __call__(self, *args, **kwargs):
        for hook in list(self._forward_pre_hooks.values()):
            res = hook(self, args)
            if res is not None:
                args = res if isinstance(res, tuple) else (res,)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            res = hook(self, args, out)
            if res is not None:
                out = res
        return out

    def register_forward_pre_hook(self, hook):
        h = _RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[h.id] = hook
        return h

    def register_forward_hook(self, hook):
        h = _RemovableHandle(self._forward_hooks)
        self._forward_hooks[h.id] = hook
        return h

    # -- registration -----------------------------------------------------------------------
    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        _check_name(name, self, "parameter")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                "(sbpflow.nn.Parameter or None required)"
            )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True):
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        _check_name(name, self, "buffer")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                "(sbpflow Tensor or None required)"
            )
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        _check_name(name, self, "module")
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name, value):
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            for store in ("_buffers", "_modules"):
                d[store].pop(name, None)
            d.pop(name, None)
            self.register_parameter(name, value)
            return
        if isinstance(value, Tensor) and getattr(value, "_is_buffer", False):
            # nn.Buffer(t, persistent=...): register it as a buffer (torch.nn.Buffer)
            if params is None:
                raise AttributeError("cannot assign buffer before Module.__init__() call")
            params.pop(name, None)
            d["_modules"].pop(name, None)
            d.pop(name, None)
            self.register_buffer(name, value, getattr(value, "persistent", True))
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                    "(sbpflow.nn.Parameter or None expected)"
                )
            params[name] = None
            return
        if isinstance(value, Module):
            if d.get("_modules") is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            params.pop(name, None)
            d["_buffers"].pop(name, None)
            d.pop(name, None)
            d["_modules"][name] = value
            return
        modules = d.get("_modules")
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as child module '{name}' "
                    "(sbpflow.nn.Module or None expected)"
                )
            modules[name] = None
            return
        buffers = d.get("_buffers")
        if buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                    "(sbpflow.Tensor or None expected)"
                )
            buffers[name] = value
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            s = d.get(store)
            if s is not None and name in s:
                return s[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for store in ("_parameters", "_buffers", "_modules"):
            s = self.__dict__[store]
            if name in s:
                del s[name]
                self._non_persistent_buffers.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers)
                      | set(self._modules))

    # -- traversal --------------------------------------------------------------------------
    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if self in memo and remove_duplicate:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            yield from m.named_modules(memo, prefix + ("." if prefix else "") + name,
                                       remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and m not in seen:
                seen.add(m)
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, get, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mod_prefix, m in mods:
            for k, v in get(m):
                if v is None or (remove_duplicate and id(v) in seen):
                    continue
                if remove_duplicate:
                    seen.add(id(v))
                yield mod_prefix + ("." if mod_prefix else "") + k, v

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True):
        yield from self._named_members(lambda m: m._parameters.items(), prefix, recurse,
                                       remove_duplicate)

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True):
        yield from self._named_members(lambda m: m._buffers.items(), prefix, recurse,
                                       remove_duplicate)

    def buffers(self, recurse: bool = True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> Module:
        mod = self
        for part in target.split(".") if target else []:
            if part not in mod._modules:
                raise AttributeError(f"{type(mod).__name__} has no attribute `{part}`")
            mod = mod._modules[part]
        return mod

    def get_parameter(self, target: str):
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._parameters:
            raise AttributeError(f"{type(mod).__name__} has no parameter `{name}`")
        return mod._parameters[name]

    # -- modes and conversions --------------------------------------------------------------
    def train(self, mode: bool = True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with no_grad():
                    p.grad.zero_()

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def _apply(self, fn):
        """Replace every parameter's and buffer's data by fn(data), keeping the objects."""
        for m in self.children():
            m._apply(fn)
        for p in self._parameters.values():
            if p is None:
                continue
            with no_grad():
                new = fn(p)
            if new is not p:
                requires_grad = p.requires_grad and new.dtype.is_floating_point
                Tensor._alias(p, new)
                p.requires_grad = requires_grad
            if p.grad is not None:
                with no_grad():
                    g = fn(p.grad)
                p.grad = g
        for key, b in self._buffers.items():
            if b is not None:
                self._buffers[key] = fn(b)
        return self

    def to(self, *args, **kwargs):
        from ..._core.dtype import DType, as_dtype
        from ...device import Device
        from ...framework.tensor import check_memory_format, memory_format

        dtype, device = kwargs.get("dtype"), kwargs.get("device")
        unknown = set(kwargs) - {"dtype", "device", "non_blocking", "memory_format", "copy"}
        if unknown:
            raise TypeError(f"to() received an invalid combination of arguments: unexpected "
                            f"keyword argument(s) {sorted(unknown)}")
        fmt = kwargs.get("memory_format")
        for a in args:
            if isinstance(a, DType) or (isinstance(a, str) and _is_dtype_name(a)):
                dtype = a
            elif isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            elif isinstance(a, (str, Device, int)) and not isinstance(a, bool):
                device = a
            elif isinstance(a, memory_format):
                fmt = a
        if fmt is not None and not isinstance(fmt, memory_format):
            check_memory_format("to", None, fmt)  # raises torch's TypeError
        if device is not None:
            if isinstance(device, int):  # an accelerator index
                raise RuntimeError("Cannot access accelerator device when none is available.")
            dev = Device(device)
            if dev.type != "cpu":
                dev.check_available()  # torch's CPU build: "Torch not compiled with CUDA ..."
                raise NotImplementedError(f"Module.to(): moving modules to {dev} is not "
                                          "implemented")
        if dtype is not None:
            dtype = as_dtype(dtype)
            if not dtype.is_floating_point:
                raise TypeError(
                    f"nn.Module.to only accepts floating point dtypes, but got desired dtype="
                    f"{dtype}"
                )
            return self._apply(lambda t: t.to(dtype) if t.dtype.is_floating_point else t)
        return self

    def float(self):
        return self.to(dtype=_dt().float32)

    def double(self):
        return self.to(dtype=_dt().float64)

    def half(self):
        return self.to(dtype=_dt().float16)

    def bfloat16(self):
        return self.to(dtype=_dt().bfloat16)

    def cpu(self):
        return self

    def cuda(self, device=None):
        from ...device import Device

        Device("cuda", device if isinstance(device, int) else None).check_available()
        raise NotImplementedError("Module.cuda(): sbpflow runs on the CPU")

    def to_global(self, placement=None, sbp=None):
        """Make every parameter and buffer global (OneFlow's `Module.to_global`): local ones
        are taken as this rank's piece, as `Tensor.to_global` does; global ones are boxed.
        The parameter objects are kept, so optimizers built before still see them."""
        return self._apply(lambda t: t.to_global(placement, sbp))

    def to_local(self):
        """Make every global parameter and buffer this rank's piece (OneFlow's
        `Module.to_local`); local ones stay.  The parameter objects are kept."""
        return self._apply(lambda t: t.to_local() if t.is_global else t)

    def type(self, dst_type):
        return self.to(dst_type)

    # -- state dict -------------------------------------------------------------------------
    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        metadata = getattr(destination, "_metadata", None)
        if metadata is not None:  # as torch: {module prefix: {"version": class's version}}
            metadata[prefix[:-1]] = {"version": self._version}
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers:
                destination[prefix + name] = b if keep_vars else b.detach()
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".",
                             keep_vars=keep_vars)
        return destination

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        missing, unexpected, errors = [], [], []
        expected = set()
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)  # upgrades below must not change the caller's
        for mod_prefix, m in self.named_modules():
            pre = mod_prefix + "." if mod_prefix else ""
            m._upgrade_state_dict(state_dict, pre,
                                  {} if metadata is None else metadata.get(mod_prefix, {}))
            local = [(n, p) for n, p in m._parameters.items() if p is not None] + [
                (n, b) for n, b in m._buffers.items()
                if b is not None and n not in m._non_persistent_buffers
            ]
            for n, target in local:
                key = pre + n
                expected.add(key)
                if key not in state_dict:
                    missing.append(key)
                    continue
                src = state_dict[key]
                if isinstance(src, np.ndarray):  # OneFlow loads NumPy arrays too
                    from ...framework.functional.creation import from_numpy

                    src = from_numpy(np.ascontiguousarray(src))
                if not isinstance(src, Tensor):
                    errors.append(f'While copying the parameter named "{key}", expected '
                                  f"torch.Tensor or Tensor-like object from checkpoint but "
                                  f"received {type(src)}")
                    continue
                if tuple(src.shape) != tuple(target.shape):
                    errors.append(
                        f"size mismatch for {key}: copying a param with shape "
                        f"{src.shape} from checkpoint, the shape in current model is "
                        f"{target.shape}."
                    )
                    continue
                with no_grad():
                    target.copy_(src)
        unexpected = [k for k in state_dict if k not in expected]
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in missing) + ". ")
        if errors:
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                + "\n\t".join(errors)
            )
        return _IncompatibleKeysRepr(missing, unexpected)

    def _upgrade_state_dict(self, state_dict, prefix: str, local_metadata: dict) -> None:
        """Bring an older version's entries (local_metadata["version"], absent for a dict
        without torch's metadata) to this class's format, in place: the part of torch's
        `_load_from_state_dict` that classes override."""

    # -- printing ---------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self):
        lines = []
        extra = self.extra_repr()
        if extra:
            lines = extra.split("\n")
        children = []
        for name, m in self._modules.items():
            mod_str = _addindent(repr(m), 2)
            children.append(f"({name}): {mod_str}")
        lines = lines + children
        main = self._get_name() + "("
        if lines:
            if len(extra.split("\n")) == 1 and not children:
                main += extra
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


def _addindent(s: str, n: int) -> str:
    first, *rest = s.split("\n")
    if not rest:
        return s
    return first + "\n" + "\n".join(" " * n + line for line in rest)


def _check_name(name, module, kind):
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain "."')
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if hasattr(type(module), name) and name not in module.__dict__.get(f"_{kind}s", {}) and \
            not (kind == "module" and name in module._modules):
        raise KeyError(f"attribute '{name}' already exists")


def _dt():
    from ..._core import dtype

    return dtype


def _is_dtype_name(s: str) -> bool:
    from ..._core import dtype as dt

    return s in dt._NAMES
