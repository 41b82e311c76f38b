"""OneFlow's fused functional ops (`flow.nn.functional`): quick_gelu, square_relu,
sparse_softmax_cross_entropy and gather_nd (also `flow.gather_nd`), each one registered op
(`sbpflow/ops/fused.py`). torch has none of them; the signatures are OneFlow's.
"""

from __future__ import annotations

from ..tensor import Tensor
from ._base import call


def _require_tensor(name: str, arg: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' must be Tensor, not {type(x).__name__}")


def quick_gelu(x: Tensor) -> Tensor:
    """x * sigmoid(1.702 * x): the sigmoid approximation of GELU."""
    _require_tensor("quick_gelu", "x", x)
    return call("quick_gelu", x)


def square_relu(x: Tensor) -> Tensor:
    """relu(x) ** 2."""
    _require_tensor("square_relu", "x", x)
    return call("square_relu", x)


def sparse_softmax_cross_entropy(labels: Tensor, logits: Tensor) -> Tensor:
    """The per-entry softmax cross entropy of `logits` ([..., C]) at the class `labels`
    ([...], int32/int64): -log_softmax(logits, -1) picked at labels, shaped as labels.
    Arguments in OneFlow's (and TensorFlow's) order: labels first."""
    _require_tensor("sparse_softmax_cross_entropy", "labels", labels)
    _require_tensor("sparse_softmax_cross_entropy", "logits", logits)
    return call("sparse_softmax_cross_entropy", labels, logits)


def gather_nd(params: Tensor, indices: Tensor) -> Tensor:
    """`params[indices[..., 0], ..., indices[..., K-1]]` for indices of shape [..., K]: shape
    indices.shape[:-1] + params.shape[K:]."""
    _require_tensor("gather_nd", "params", params)
    _require_tensor("gather_nd", "indices", indices)
    return call("gather_nd", params, indices)


__all__ = ["gather_nd", "quick_gelu", "sparse_softmax_cross_entropy", "square_relu"]

METHODS: dict = {}
