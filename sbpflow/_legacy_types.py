"""torch's legacy tensor types: sbpflow.FloatTensor, LongTensor, ... as constructors
(FloatTensor(2, 3) allocates, LongTensor([1, 2]) copies data) and as isinstance checks by
dtype; Tensor.type("torch.DoubleTensor") converts by name.  The torch.cuda.* types exist and
refuse to be built, as in torch's CPU build."""

from __future__ import annotations

from ._core import dtype as dt
from .framework.tensor import Size, Tensor

LEGACY_TYPES = {
    "FloatTensor": dt.float32, "DoubleTensor": dt.float64, "HalfTensor": dt.float16,
    "BFloat16Tensor": dt.bfloat16, "LongTensor": dt.int64, "IntTensor": dt.int32,
    "ShortTensor": dt.int16, "CharTensor": dt.int8, "ByteTensor": dt.uint8,
    "BoolTensor": dt.bool_,
}


class tensortype(type):  # noqa: N801 - torch's name
    """The metaclass of the legacy types: isinstance(t, FloatTensor) checks t's dtype."""

    def __instancecheck__(cls, obj):
        return (not cls.is_cuda and isinstance(obj, Tensor) and obj.is_local
                and obj.dtype is cls.dtype)

    def __repr__(cls):
        return f"<class '{cls.__module__.split('.')[0]}.{cls.__qualname__}'>"


def _make(cls, *args, device=None):
    from .framework.functional import creation

    if cls.is_cuda:
        raise TypeError(f"type torch.cuda.{cls.__name__} not available. Torch not compiled "
                        "with CUDA enabled.")
    if device is not None:
        from .device import Device

        Device(device).check_available()
    d = cls.dtype
    if not args:
        return creation.empty(0, dtype=d)
    if len(args) == 1 and isinstance(args[0], Size):
        return creation.empty(*args[0], dtype=d)
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return creation.empty(*args, dtype=d)
    if len(args) == 1:
        data = args[0]
        if isinstance(data, Tensor):
            if data.dtype is not d:
                raise TypeError(f"expected {cls.__name__} (got {data.type().split('.')[-1]})")
            return data
        if isinstance(data, (int, float, bool)):
            raise TypeError(f"new(): data must be a sequence (got {type(data).__name__})")
        return creation.tensor(data, dtype=d)
    raise TypeError(f"{cls.__name__}(): expected sizes (ints) or one sequence of data, got "
                    f"{tuple(type(a).__name__ for a in args)}")


def _legacy_class(name: str, d, is_cuda: bool):
    return tensortype(name, (), {
        "__new__": _make, "dtype": d, "is_cuda": is_cuda, "__module__": "sbpflow",
        "__qualname__": ("cuda." if is_cuda else "") + name,
        "__doc__": f"The legacy {'CUDA ' if is_cuda else ''}tensor type of dtype {d.name}.",
    })


CPU_TYPES = {name: _legacy_class(name, d, False) for name, d in LEGACY_TYPES.items()}
CUDA_TYPES = {name: _legacy_class(name, d, True) for name, d in LEGACY_TYPES.items()}
