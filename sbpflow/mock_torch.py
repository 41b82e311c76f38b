"""`import torch` resolving to sbpflow: OneFlow's `mock_torch`, scoped and reversible.

    import sbpflow
    sbpflow.mock_torch.enable()        # or: with sbpflow.mock_torch.enable(): ...
    import torch                       # sbpflow
    from torch.utils.data import DataLoader
    sbpflow.mock_torch.disable()       # torch is torch again

While enabled, a finder at the front of `sys.meta_path` answers every import of `torch` or
`torch.<path>` with the module `sbpflow.<path>` itself (the same object, so `torch.nn is
sbpflow.nn`).  A path sbpflow lacks raises ModuleNotFoundError naming the torch path.  Any
real torch modules already imported are set aside and put back by `disable()`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading

__all__ = ["disable", "enable", "is_enabled"]

_PREFIX = "torch"
_lock = threading.Lock()


def _target(fullname: str) -> str | None:
    if fullname == _PREFIX:
        return "sbpflow"
    if fullname.startswith(_PREFIX + "."):
        return "sbpflow" + fullname[len(_PREFIX):]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass  # already executed as sbpflow.<path>


class _TorchAlias(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        name = _target(fullname)
        if name is None:
            return None
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            raise ModuleNotFoundError(
                f"No module named '{fullname}' (sbpflow.mock_torch: sbpflow has no {name})",
                name=fullname) from None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(module))


_finder = _TorchAlias()
_saved: dict[str, object] = {}


def _is_torch_name(name: str) -> bool:
    return name == _PREFIX or name.startswith(_PREFIX + ".")


class _Scope:
    """What enable() returns: also usable as `with mock_torch.enable(): ...`."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        disable()
        return False


def enable(lazy: bool = False, verbose: bool = False) -> _Scope:
    """Make `import torch` (and every `torch.x.y`) give sbpflow's modules."""
    if lazy:
        raise NotImplementedError(
            "mock_torch.enable(lazy=True) is not implemented in sbpflow yet: a missing torch "
            "API raises AttributeError/ModuleNotFoundError instead of returning a placeholder")
    with _lock:
        if _finder not in sys.meta_path:
            for name in [n for n in sys.modules if _is_torch_name(n)]:
                _saved[name] = sys.modules.pop(name)
            sys.meta_path.insert(0, _finder)
            if verbose:
                print("sbpflow.mock_torch: `import torch` now gives sbpflow", file=sys.stderr)
    return _Scope()


def disable() -> None:
    """Undo enable(): drop the aliases and restore any real torch modules set aside."""
    with _lock:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        for name in [n for n in sys.modules if _is_torch_name(n)]:
            del sys.modules[name]
        sys.modules.update(_saved)
        _saved.clear()


def is_enabled() -> bool:
    return _finder in sys.meta_path
