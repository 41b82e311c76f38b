"""Flatten parameters into one vector and back."""

from __future__ import annotations

from ...autograd import no_grad


def parameters_to_vector(parameters):
    from ...framework import functional as F

    return F.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters) -> None:
    offset = 0
    with no_grad():
        for p in parameters:
            n = p.numel()
            p.copy_(vec[offset:offset + n].view_as(p))
            offset += n
