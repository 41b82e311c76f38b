"""torch.nn.functional for sbpflow: re-exported from the framework's nn and conv families."""

from ..framework.functional.conv import *  # noqa: F403
from ..framework.functional.fused import *  # noqa: F403
from ..framework.functional.nn import *  # noqa: F403
from ..framework.functional.resample import *  # noqa: F403
from ..framework.functional.shape import pad  # noqa: F401
