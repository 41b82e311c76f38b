"""Fit a linear model by gradient descent with sbpflow's autograd.

Run: python -m sbpflow.examples.regression
"""

from __future__ import annotations

import numpy as np

import sbpflow as flow


def main(steps: int = 200, lr: float = 0.1) -> float:
    flow.manual_seed(0)
    rng = np.random.default_rng(0)
    true_w = np.array([[2.0], [-3.0], [0.5]], dtype=np.float32)
    x_np = rng.standard_normal((256, 3)).astype(np.float32)
    y_np = x_np @ true_w + 1.0 + 0.01 * rng.standard_normal((256, 1)).astype(np.float32)
    x, y = flow.tensor(x_np), flow.tensor(y_np)
    w = flow.zeros(3, 1, requires_grad=True)
    b = flow.zeros(1, requires_grad=True)
    for step in range(steps):
        err = flow.matmul(x, w) + b - y
        loss = (err * err).sum() * (1.0 / len(x_np))
        loss.backward()
        with flow.no_grad():
            w -= w.grad * lr
            b -= b.grad * lr
        w.grad = None
        b.grad = None
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.6f}")
    print("learned w:", np.round(w.detach().numpy().ravel(), 3), "b:", round(b.item(), 3))
    print("true    w:", true_w.ravel(), "b: 1.0")
    return loss.item()


if __name__ == "__main__":
    main()
