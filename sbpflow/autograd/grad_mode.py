"""Grad mode: a thread-local switch that decides whether ops record autograd nodes."""

from __future__ import annotations

import functools
import threading


class _State(threading.local):
    enabled = True


_state = _State()


def is_grad_enabled() -> bool:
    return _state.enabled


class _GradModeContext:
    """Base for the three grad-mode managers; usable as context managers and decorators."""

    _target: bool

    def __enter__(self):
        self._prev = _state.enabled
        _state.enabled = self._target

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)() if not isinstance(self, set_grad_enabled) else set_grad_enabled(
                self._target
            ):
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradModeContext):
    _target = False


class enable_grad(_GradModeContext):
    _target = True


class set_grad_enabled(_GradModeContext):
    def __init__(self, mode: bool):
        self._target = bool(mode)
        self._prev = _state.enabled
        _state.enabled = self._target  # takes effect on call too, as torch's does

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False


class inference_mode(no_grad):
    def __init__(self, mode: bool = True):
        self._target = not mode
