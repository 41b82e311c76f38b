"""Neural networks: modules, functional, init, utils."""

from ..framework.parameter import Parameter
from . import functional, graph, init, parallel, parameter, utils
from .graph import Graph
from .modules import *  # noqa: F403
from .modules import __all__ as _modules_all
from .parameter import Buffer

__all__ = ["Buffer", "Graph", "Parameter", "functional", "graph", "init", "parallel",
           "parameter", "utils", *_modules_all]
