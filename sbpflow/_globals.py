"""torch's process-wide settings and small top-level helpers: finfo/iinfo, the strided layout,
float32 matmul precision, deterministic algorithms, intra-op thread count, numel, is_nonzero,
typename, and `compile` (refused, saying so)."""

from __future__ import annotations

import os
import warnings

import numpy as np

from ._core import dtype as dt
from .framework.tensor import Tensor, layout, strided

__all__ = [
    "are_deterministic_algorithms_enabled", "compile", "finfo", "get_default_device",
    "get_float32_matmul_precision", "set_default_device",
    "get_num_threads", "iinfo", "is_deterministic_algorithms_warn_only_enabled", "is_nonzero",
    "layout", "numel", "set_float32_matmul_precision", "set_num_threads", "strided",
    "typename", "use_deterministic_algorithms",
]


# -- dtype information ---------------------------------------------------------------------------
def _g(x: float) -> str:
    return f"{x:.6g}"


class finfo:  # noqa: N801 - torch's name
    """Machine limits of a floating dtype (the default dtype when none is given)."""

    def __init__(self, type=None):  # noqa: A002 - torch's parameter name
        d = dt.get_default_dtype() if type is None else dt.as_dtype(type)
        if not d.is_floating_point:
            raise TypeError("torch.finfo() requires a floating point input type. Use "
                            "torch.iinfo to handle 'torch.finfo'")
        info = np.finfo(d.np)
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = self.smallest_normal = float(info.smallest_normal)
        self.resolution = 10.0 ** -int(info.precision)
        self.dtype = d.name

    def __repr__(self):
        return (f"finfo(resolution={_g(self.resolution)}, min={_g(self.min)}, "
                f"max={_g(self.max)}, eps={_g(self.eps)}, "
                f"smallest_normal={_g(self.smallest_normal)}, tiny={_g(self.tiny)}, "
                f"dtype={self.dtype})")


class iinfo:  # noqa: N801 - torch's name
    """Limits of an integer dtype."""

    def __init__(self, type):  # noqa: A002 - torch's parameter name
        d = dt.as_dtype(type)
        if d.is_floating_point or d is dt.bool_:
            raise TypeError("torch.iinfo() requires an integer input type. Use torch.finfo "
                            "to handle 'torch.iinfo'")
        info = np.iinfo(d.np)
        self.bits, self.max, self.min, self.dtype = int(info.bits), int(info.max), \
            int(info.min), d.name

    def __repr__(self):
        return f"iinfo(min={_g(self.min)}, max={_g(self.max)}, dtype={self.dtype})"


# -- float32 matmul precision and TF32 flags ------------------------------------------------------
_PRECISIONS = ("highest", "high", "medium")


def get_float32_matmul_precision() -> str:
    from .backends import cuda

    return cuda._matmul_precision[0]


def set_float32_matmul_precision(precision: str) -> None:
    """Accepted and reported back as in torch (it also sets backends.cuda.matmul.allow_tf32).
    sbpflow's CPU float32 matmuls always run at full float32 precision, which every setting
    permits."""
    from .backends import cuda

    if precision not in _PRECISIONS:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current"
                      "setFloat32MatmulPrecision call has no effect.", UserWarning, stacklevel=2)
        return
    cuda._matmul_precision[0] = precision


# -- determinism -----------------------------------------------------------------------------------
_DETERMINISTIC = {"mode": False, "warn_only": False}


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Recorded; sbpflow's CPU kernels are deterministic already (the same inputs and seed give
    the same results, bit for bit)."""
    if not isinstance(mode, bool):
        raise TypeError(f"_set_deterministic_algorithms(): argument 'mode' (position 1) must "
                        f"be bool, not {type(mode).__name__}")
    _DETERMINISTIC.update(mode=mode, warn_only=bool(warn_only))


def are_deterministic_algorithms_enabled() -> bool:
    return _DETERMINISTIC["mode"]


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    return _DETERMINISTIC["warn_only"]


# -- threads ---------------------------------------------------------------------------------
def set_num_threads(num: int) -> None:
    """The number of threads the CPU kernels' BLAS uses (sbpflow's other kernels run on the
    VM's compute thread).  Also pins the VM's BLAS policy (SBPFLOW_BLAS_THREADS)."""
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise RuntimeError("set_num_threads expects a positive integer")
    os.environ["SBPFLOW_BLAS_THREADS"] = str(num)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency
        return
    threadpool_limits(limits=num, user_api="blas")


def get_num_threads() -> int:
    explicit = os.environ.get("SBPFLOW_BLAS_THREADS")
    if explicit:
        return max(1, int(explicit))
    try:
        from threadpoolctl import threadpool_info

        counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:  # pragma: no cover - a dependency
        counts = []
    if counts:
        return max(counts)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


# -- default device --------------------------------------------------------------------------
def get_default_device():
    from .device import Device

    return Device("cpu")


def set_default_device(device) -> None:
    """Only the CPU: sbpflow makes every tensor there.  Another device raises its error now
    (torch's CPU build accepts the setting and fails at the next factory call)."""
    if device is None:
        return
    from .device import Device

    d = Device(device) if not isinstance(device, int) else None
    if d is None or d.type != "cpu":
        if d is None:
            raise RuntimeError("Cannot access accelerator device when none is available.")
        d.check_available()
        raise NotImplementedError(f"set_default_device({d}): sbpflow makes tensors on the CPU")


# -- small helpers ---------------------------------------------------------------------------
def numel(input: Tensor) -> int:
    return input.numel()


def is_nonzero(input: Tensor) -> bool:
    if input.numel() == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    return bool(input)


def typename(obj) -> str:
    if isinstance(obj, Tensor):
        return obj.type()
    module = type(obj).__module__
    qual = type(obj).__qualname__
    return qual if module in ("builtins", None) else f"{module}.{qual}"


# -- torch.compile -------------------------------------------------------------------------------
def compile(model=None, *, fullgraph=False, dynamic=None, backend=None, mode=None, options=None,
            name=None, disable=False, recompile_limit=None, isolate_recompiles=False,
            shapes_spec=None):
    """torch.compile's signature.  `disable=True` gives the function back unchanged (as torch
    does, also as a decorator); anything else raises: sbpflow has no torch.compile.  Its
    static graphs are `sbpflow.nn.Graph` (OneFlow's API)."""
    if disable:
        return model if model is not None else (lambda fn: fn)
    raise NotImplementedError(
        "sbpflow.compile (torch.compile) is not supported: sbpflow runs eagerly, or compiles "
        "a static graph through sbpflow.nn.Graph; torch.compile(..., disable=True) returns the "
        "model unchanged")
