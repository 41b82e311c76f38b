"""sbpflow: a deep-learning framework rebuilding OneFlow's architecture in Python.

`import sbpflow as flow` gives PyTorch's API for local tensors.
"""

from __future__ import annotations

from . import ops
from ._core.dtype import (
    bfloat16, float16, float32, float64, get_default_dtype, int8, int16, int32, int64,
    set_default_dtype, uint8,
)
from ._core.dtype import DType as dtype  # noqa: N813 - torch's name
from ._core.dtype import bool_ as bool  # noqa: A001 - torch's name
from ._core.dtype import promote_types
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .autograd.grad_mode import is_inference_mode_enabled
from .device import Device as device  # noqa: N813
from .framework import interpreter as _interpreter  # noqa: F401  (installs the dispatcher)
from .framework import global_tensor as _global_tensor  # noqa: F401  (the global interpreter)
from .framework.functional import *  # noqa: F403
from .framework.generator import Generator, default_generator, initial_seed, manual_seed, seed
from .framework.tensor import (  # noqa: E402
    Size, Tensor, channels_last, channels_last_3d, contiguous_format, memory_format,
    preserve_format,
)
from . import vm
from .vm import synchronize
from .framework.tensor_str import get_printoptions, printoptions, set_printoptions
from . import autograd  # noqa: E402
from . import sbp  # noqa: E402  (flow.sbp.split(i), broadcast, partial_sum)
from .sbp import boxing  # noqa: E402  (flow.boxing.explain)
from .sbp.placement import Placement as placement  # noqa: E402, N813 - OneFlow's name

float = float32  # noqa: A001
double = float64
half = float16
long = int64
int = int32  # noqa: A001
short = int16


def is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)


def is_floating_point(t: Tensor) -> bool:
    return t.dtype.is_floating_point


def is_complex(t: Tensor) -> bool:
    if not isinstance(t, Tensor):
        raise TypeError(f"is_complex(): argument 'input' (position 1) must be Tensor, not "
                        f"{type(t).__name__}")
    return False  # sbpflow has no complex dtypes


__version__ = "0.1.0"

from . import linalg, nn, optim, utils  # noqa: E402
from .framework.serialization import load, save  # noqa: E402
from .framework.global_tensor import tensor_to_global as to_global  # noqa: E402 (OneFlow)
from .framework.global_tensor import tensor_to_local as to_local  # noqa: E402 (OneFlow)
from . import serialization  # noqa: E402  (torch.serialization)
from . import comm, env  # noqa: E402  (flow.comm, flow.env; MPI starts only under mpiexec -n >1)
from . import distributed  # noqa: E402  (publishes flow.comm.all_reduce and the other collectives)
# torch's device and backend namespaces (CPU only: no CUDA, no accelerator)
from . import accelerator, amp, backends, cuda, onnx, random, testing, types  # noqa: E402
from . import mock_torch, one_embedding, profiler  # noqa: E402  (OneFlow's: `import torch` gives sbpflow while enabled)
from .amp import autocast  # noqa: E402
from ._legacy_types import CPU_TYPES as _CPU_TYPES  # noqa: E402
from ._legacy_types import tensortype  # noqa: E402, F401

globals().update(_CPU_TYPES)  # sbpflow.FloatTensor, LongTensor, ... (torch's legacy types)
from ._globals import (  # noqa: E402
    are_deterministic_algorithms_enabled, compile, finfo, get_default_device,
    get_float32_matmul_precision, get_num_threads, set_default_device,
    iinfo, is_deterministic_algorithms_warn_only_enabled, is_nonzero, layout, numel,
    set_float32_matmul_precision, set_num_threads, strided, typename,
    use_deterministic_algorithms,
)
from .amp.autocast_mode import get_autocast_dtype, is_autocast_enabled  # noqa: E402
from . import special  # noqa: E402  (torch.special)
from . import sparse  # noqa: E402  (torch.sparse)
from .framework.tensor import sparse_coo  # noqa: E402  (torch.sparse_coo)
from . import distributions  # noqa: E402  (torch.distributions)
