"""Polynomial regression, in the style of PyTorch's regression example: one `Linear`,
`smooth_l1_loss` and hand-written SGD through `param.data.add_`.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and data come from a seeded NumPy generator, so both runs start the same.
"""
import json
from itertools import count

import numpy as np
import torch
import torch.nn.functional as F

POLY_DEGREE = 4
rng = np.random.default_rng(0)
W_target = torch.from_numpy(rng.normal(size=(POLY_DEGREE, 1)).astype(np.float32)) * 5
b_target = torch.from_numpy(rng.normal(size=(1,)).astype(np.float32)) * 5


def make_features(x):
    """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE+1)], 1)


def f(x):
    """Approximated function."""
    return x.mm(W_target) + b_target.item()


def poly_desc(W, b):
    """Creates a string description of a polynomial."""
    result = 'y = '
    for i, w in enumerate(W):
        result += '{:+.2f} x^{} '.format(w, i + 1)
    result += '{:+.2f}'.format(b[0])
    return result


def get_batch(batch_size=32):
    """Builds a batch i.e. (x, f(x)) pair."""
    random = torch.from_numpy(rng.normal(size=batch_size).astype(np.float32))
    x = make_features(random)
    y = f(x)
    return x, y


fc = torch.nn.Linear(W_target.size(0), 1)
with torch.no_grad():
    fc.weight.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, size=(1, POLY_DEGREE))
                                     .astype(np.float32)))
    fc.bias.zero_()
losses = []
for batch_idx in count(1):
    batch_x, batch_y = get_batch()
    fc.zero_grad()
    output = F.smooth_l1_loss(fc(batch_x), batch_y)
    loss = output.item()
    losses.append(loss)
    output.backward()
    for param in fc.parameters():
        param.data.add_(-0.01 * param.grad)
    if loss < 1e-3 or batch_idx >= 60:
        break
desc = 'Loss: {:.6f} after {} batches'.format(loss, batch_idx)
desc += '\n==> Learned function:\t' + poly_desc(fc.weight.view(-1), fc.bias)
desc += '\n==> Actual function:\t' + poly_desc(W_target.view(-1), b_target)
print(desc)
print(json.dumps({"losses": losses, "w": fc.weight.view(-1).tolist(), "desc": len(desc)}))
