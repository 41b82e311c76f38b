"""sbpflow.profiler: torch.profiler's API (`profile`, `record_function`, `schedule`,
`ProfilerActivity`, `tensorboard_trace_handler`) over sbpflow's own events: op dispatch, VM
instructions per stream, boxing steps with their collectives and bytes, and nn.Graph actors.
`export_chrome_trace` writes Trace Event Format JSON that Perfetto opens; see profiler.py.

This package imports only the lower layers (lazily, when recording starts), so any layer may
be profiled and none imports it.
"""

from __future__ import annotations

import functools

from . import _recorder
from .profiler import (
    DeviceType,
    EventList,
    FunctionEvent,
    FunctionEventAvg,
    ProfilerAction,
    ProfilerActivity,
    kineto_available,
    merge_chrome_traces,
    profile,
    rank_path,
    schedule,
    supported_activities,
    tensorboard_trace_handler,
)


class record_function:
    """A named range in the trace and in key_averages(): a context manager or a decorator,
    as torch.profiler.record_function.  Costs nothing when no profiler records."""

    def __init__(self, name: str, args: str | None = None):
        if not isinstance(name, str):
            raise TypeError(f"record_function(): name must be str, got {type(name).__name__}")
        self.name = name
        self.args = args
        self._t0 = None

    def __enter__(self):
        self._t0 = _recorder._clock()
        return self

    def __exit__(self, *exc):
        t0, self._t0 = self._t0, None
        if t0 is not None:
            args = {"args": self.args} if self.args is not None else None
            _recorder.record_range(self.name, t0, _recorder._clock(), args)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*a, **kw):
            with record_function(self.name, self.args):
                return fn(*a, **kw)

        return wrapped


__all__ = [
    "DeviceType", "EventList", "FunctionEvent", "FunctionEventAvg", "ProfilerAction",
    "ProfilerActivity", "kineto_available", "merge_chrome_traces", "profile", "rank_path",
    "record_function", "schedule", "supported_activities", "tensorboard_trace_handler",
]
