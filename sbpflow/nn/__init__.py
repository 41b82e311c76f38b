"""Neural networks: modules, functional, init, utils."""

from ..framework.parameter import Parameter
from . import functional, init, parallel, utils
from .modules import *  # noqa: F403
from .modules import __all__ as _modules_all

__all__ = ["Parameter", "functional", "init", "parallel", "utils", *_modules_all]
