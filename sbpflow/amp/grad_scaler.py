"""torch.amp.grad_scaler: GradScaler.

For device "cuda" (no CUDA here) torch 2.13's CPU build warns and disables the scaler, which
then passes everything through; this does the same.  An enabled CPU scaler does torch's
dynamic loss scaling: scale the loss, unscale the gradients before the step, skip the step
when a gradient is inf/NaN, and grow or back off the scale in update().
"""

from __future__ import annotations

import math
import warnings

__all__ = ["GradScaler", "OptState"]


class OptState:
    READY = 0
    UNSCALED = 1
    STEPPED = 2


class GradScaler:
    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device
        self._enabled = enabled
        if self._device == "cuda" and enabled:
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  "
                          "Disabling.", UserWarning, stacklevel=2)
            self._enabled = False
        if not self._enabled:
            return
        if device != "cpu":
            raise NotImplementedError(f"GradScaler: sbpflow has no '{device}' device")
        if growth_factor <= 1.0:
            raise AssertionError("The growth factor must be > 1.0.")
        if backoff_factor >= 1.0:
            raise AssertionError("The backoff factor must be < 1.0.")
        self._init_scale = float(init_scale)
        self._scale = None
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._init_growth_tracker = 0
        self._growth_tracker = None
        self._per_optimizer_states: dict = {}

    # -- scaling -------------------------------------------------------------------------------
    def _lazy_init(self):
        if self._scale is None:
            self._scale = self._init_scale
            self._growth_tracker = self._init_growth_tracker

    def scale(self, outputs):
        """outputs times the current scale (a tensor, or tensors nested in lists/tuples)."""
        if not self._enabled:
            return outputs
        self._lazy_init()
        from ..framework.tensor import Tensor

        def apply(v):
            if isinstance(v, Tensor):
                return v * self._scale
            if isinstance(v, (list, tuple)):
                return type(v)(apply(x) for x in v)
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply(outputs)

    def _state(self, optimizer) -> dict:
        return self._per_optimizer_states.setdefault(
            id(optimizer), {"stage": OptState.READY, "found_inf": False})

    def unscale_(self, optimizer) -> None:
        if not self._enabled:
            return
        from ..autograd import no_grad

        self._lazy_init()
        state = self._state(optimizer)
        if state["stage"] == OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        if state["stage"] == OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv = 1.0 / self._scale
        found = False
        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    p.grad.mul_(inv)
                    if not found and not bool(p.grad.isfinite().all()):
                        found = True
        state["found_inf"] = found
        state["stage"] = OptState.UNSCALED

    def step(self, optimizer, *args, **kwargs):
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        self._lazy_init()
        state = self._state(optimizer)
        if state["stage"] == OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == OptState.READY:
            self.unscale_(optimizer)
        ret = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return ret

    def update(self, new_scale=None) -> None:
        if not self._enabled:
            return
        self._lazy_init()
        if new_scale is not None:
            self._scale = float(new_scale)
        else:
            found = [s["found_inf"] for s in self._per_optimizer_states.values()
                     if s["stage"] != OptState.READY]
            if not found:
                raise AssertionError("No inf checks were recorded prior to update.")
            if any(found):
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    grown = self._scale * self._growth_factor
                    if math.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
        self._per_optimizer_states = {}

    # -- accessors -----------------------------------------------------------------------------
    def get_scale(self) -> float:
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else \
            self._growth_tracker

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict:
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale = self._init_scale
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            self._growth_tracker = self._init_growth_tracker
