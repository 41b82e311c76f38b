"""nn modules."""

from .activation import (
    ELU,
    GELU,
    Hardtanh,
    LeakyReLU,
    LogSoftmax,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
)
from .container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from .conv import Conv1d, Conv2d
from .linear import Identity, Linear
from .loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from .misc import (
    AdaptiveAvgPool2d,
    AvgPool2d,
    Dropout,
    Embedding,
    Flatten,
    MaxPool2d,
    Unflatten,
)
from .module import Module
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .transformer import MultiheadAttention, TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "AdaptiveAvgPool2d", "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d",
    "BatchNorm2d", "Conv1d", "Conv2d", "CrossEntropyLoss", "Dropout", "ELU", "Embedding",
    "Flatten", "GELU", "GroupNorm", "Hardtanh", "Identity", "L1Loss", "LayerNorm", "LeakyReLU",
    "Linear", "LogSoftmax", "MSELoss", "MaxPool2d", "Module", "ModuleDict", "ModuleList",
    "MultiheadAttention", "NLLLoss", "ParameterDict", "ParameterList", "ReLU", "ReLU6",
    "Sequential", "SiLU", "Sigmoid", "SmoothL1Loss", "Softmax", "Softplus", "Tanh",
    "TransformerEncoder", "TransformerEncoderLayer", "Unflatten",
]
