"""Grad mode: a thread-local switch that decides whether ops record autograd nodes."""

from __future__ import annotations

import functools
import threading


class _State(threading.local):
    enabled = True
    inference = False


_state = _State()


def is_grad_enabled() -> bool:
    return _state.enabled


def is_inference_mode_enabled() -> bool:
    return _state.inference


class _GradModeContext:
    """Base for the three grad-mode managers; usable as context managers and decorators."""

    _target: bool

    def __enter__(self):
        self._prev = _state.enabled
        _state.enabled = self._target

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False

    def __new__(cls, orig_func=None):
        # `@no_grad` without parentheses, as torch allows: decorate directly.
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)

    def _clone(self):
        return type(self)()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self._clone():  # a fresh manager per call: calls may nest or overlap
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradModeContext):
    _target = False


class enable_grad(_GradModeContext):
    _target = True


class set_grad_enabled(_GradModeContext):
    def __new__(cls, mode: bool):
        return object.__new__(cls)

    def __init__(self, mode: bool):
        self._target = bool(mode)
        self._prev = _state.enabled
        _state.enabled = self._target  # takes effect on call too, as torch's does

    def _clone(self):
        return set_grad_enabled(self._target)

    def __call__(self, fn):
        # Used as a decorator, the call above must not leave the mode changed.
        _state.enabled = self._prev
        return super().__call__(fn)

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False


class inference_mode(no_grad):
    def __new__(cls, mode=True):
        if callable(mode):  # bare `@inference_mode`
            return cls()(mode)
        return object.__new__(cls)

    def __init__(self, mode: bool = True):
        self._target = not mode

    def _clone(self):
        return inference_mode(not self._target)

    def __enter__(self):
        self._prev_inference = _state.inference
        _state.inference = not self._target
        super().__enter__()

    def __exit__(self, *exc):
        _state.inference = self._prev_inference
        return super().__exit__(*exc)
