"""Neural networks: modules, functional, init, utils."""

from ..framework.parameter import Parameter
from . import functional, init, utils
from .modules import *  # noqa: F403
from .modules import __all__ as _modules_all

__all__ = ["Parameter", "functional", "init", "utils", *_modules_all]
