"""nn modules, one file per torch.nn.modules submodule (torch's module paths)."""

from . import (  # noqa: F401
    activation,
    container,
    conv,
    distance,
    dropout,
    flatten,
    fold,
    linear,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
)
from .activation import *  # noqa: F403
from .container import *  # noqa: F403
from .conv import *  # noqa: F403
from .distance import *  # noqa: F403
from .dropout import *  # noqa: F403
from .flatten import *  # noqa: F403
from .fold import *  # noqa: F403
from .linear import *  # noqa: F403
from .loss import *  # noqa: F403
from .module import *  # noqa: F403
from .normalization import *  # noqa: F403
from .padding import *  # noqa: F403
from .pixelshuffle import *  # noqa: F403
from .pooling import *  # noqa: F403
from .rnn import *  # noqa: F403
from .sparse import *  # noqa: F403
from .transformer import *  # noqa: F403
from .upsampling import *  # noqa: F403

__all__ = sorted({name for m in (
    module, container, activation, linear, conv, pooling, normalization, dropout, sparse,
    flatten, loss, transformer, rnn, pixelshuffle, upsampling, fold, padding, distance,
) for name in m.__all__})
