"""NAdam: Adam with Nesterov momentum and a momentum schedule (torch's NAdam)."""

from __future__ import annotations

from ..framework import functional as F
from .optimizer import (
    Optimizer,
    _check_betas,
    _check_lr,
    _check_unsupported,
    _foreach_update,
    _HostScalars,
    _round_like,
    _scalar,
    _step_counter,
)


class NAdam(Optimizer):
    """NAdam, torch's single-tensor update (step t counts from 1):

        g = ±grad (+ weight_decay * p)          p = p * (1 - lr * weight_decay) (decoupled)
        mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay))
        mu_product = mu_product * mu_t          (a float32 0-d tensor in the state, as in torch)
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        denom = sqrt(v / (1 - beta2^t)) + eps
        p = p - lr * (1 - mu_t) / (1 - mu_product) * g / denom
              - lr * mu_{t+1} / (1 - mu_product * mu_{t+1}) * m / denom
    """

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 momentum_decay=4e-3, decoupled_weight_decay=False, *, foreach=None,
                 maximize=False, capturable=False, differentiable=False):
        _check_lr(lr)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        betas = _check_betas(betas)
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= momentum_decay:
            raise ValueError(f"Invalid momentum_decay value: {momentum_decay}")
        _check_unsupported("NAdam", capturable=capturable, differentiable=differentiable)
        defaults = {
            "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
            "momentum_decay": momentum_decay, "decoupled_weight_decay": decoupled_weight_decay,
            "maximize": maximize, "foreach": foreach, "capturable": capturable,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)
        self._host = _HostScalars()

    def _state_for(self, p) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            self._host.remember(p, state, "step", 0.0)
            state["mu_product"] = _step_counter(1.0)
            self._host.remember(p, state, "mu_product", 1.0)
            state["exp_avg"] = F.zeros_like(p)
            state["exp_avg_sq"] = F.zeros_like(p)
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_nadam_update` per (device, dtype) bucket, written in place (the op
        advances the step counts and mu_product and reads them itself); False, with nothing
        done, where it doesn't apply."""
        beta1, beta2 = (float(_scalar(b)) for b in group["betas"])
        attrs = {"beta1": beta1, "beta2": beta2, "eps": float(group["eps"]),
                 "weight_decay": float(group["weight_decay"]),
                 "momentum_decay": float(group["momentum_decay"]),
                 "decoupled_weight_decay": bool(group["decoupled_weight_decay"]),
                 "maximize": bool(group["maximize"])}
        return _foreach_update("multi_nadam_update", params, self._state_for,
                               ("exp_avg", "exp_avg_sq"), ("step", "mu_product"), attrs,
                               (float(_scalar(group["lr"])),))

    def _single_group(self, group, params) -> None:
        lr = _scalar(group["lr"])
        beta1, beta2 = (_scalar(b) for b in group["betas"])
        eps, weight_decay = group["eps"], group["weight_decay"]
        momentum_decay = group["momentum_decay"]
        for p in params:
            state = self._state_for(p)
            step = self._host.advance(p, state)
            grad = -p.grad if group["maximize"] else p.grad
            if weight_decay != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * weight_decay)
                else:
                    grad = grad.add(p, alpha=weight_decay)
            mu = beta1 * (1.0 - 0.5 * 0.96 ** (step * momentum_decay))
            mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * momentum_decay))
            # torch multiplies the float32 tensor by mu (rounded to float32 first).
            mu_product = self._host.get(p, state, "mu_product")
            mu_product = self._host.set(
                p, state, "mu_product",
                _product_f32(mu_product, mu, state["mu_product"]),
            )
            mu_product_next = mu_product * mu_next
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = exp_avg_sq.div(1 - beta2**step).sqrt_().add_(eps)
            p.addcdiv_(grad, denom, value=-lr * (1.0 - mu) / (1.0 - mu_product))
            p.addcdiv_(exp_avg, denom, value=-lr * mu_next / (1.0 - mu_product_next))



def _product_f32(a: float, b: float, like) -> float:
    """a * b as a tensor of `like`'s dtype computes it (both factors in that dtype)."""
    return _round_like(_round_like(a, like) * _round_like(b, like), like)
