"""torch.utils.checkpoint: activation checkpointing (trade compute for memory).

`checkpoint(fn, *args)` runs `fn` under no_grad, so none of its intermediate activations are
kept; only the inputs are saved.  When backward reaches the checkpoint, `fn` runs again with
grad enabled on detached copies of the inputs (with the default generator put back to the
state it had at the forward, so dropout draws the same mask), and the recomputed graph is
back-propagated into the inputs and into any parameters `fn` uses.

Both of torch's variants are accepted.  `use_reentrant=False` also takes keyword arguments
and gives parameter gradients when no input requires grad; it is built on the same
recomputing Function, so unlike torch's it does not support `autograd.grad` on a checkpointed
region whose parameters are not among the requested inputs (they still accumulate `.grad`).
"""

from __future__ import annotations

import warnings

from ..autograd import Function, backward, enable_grad, no_grad
from ..framework.generator import get_rng_state, set_rng_state
from ..framework.tensor import Tensor

__all__ = ["check_backward_validity", "checkpoint", "checkpoint_sequential", "detach_variable",
           "noop_context_fn"]


def noop_context_fn():
    """The default `context_fn`: no extra context around forward or recomputation."""
    import contextlib

    return contextlib.nullcontext(), contextlib.nullcontext()


def detach_variable(inputs):
    """Detach every tensor of a tuple, keeping its requires_grad flag."""
    if not isinstance(inputs, tuple):
        raise RuntimeError("Only tuple of tensors is supported. Got Unsupported input type: "
                           f"{type(inputs).__name__}")
    out = []
    for inp in inputs:
        if isinstance(inp, Tensor):
            x = inp.detach()
            x.requires_grad = inp.requires_grad
            inp = x
        out.append(inp)
    return tuple(out)


def check_backward_validity(inputs) -> None:
    if not any(inp.requires_grad for inp in inputs if isinstance(inp, Tensor)):
        warnings.warn("None of the inputs have requires_grad=True. Gradients will be None",
                      stacklevel=2)


class CheckpointFunction(Function):
    """Forward without saving activations; backward recomputes them and back-propagates."""

    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        ctx.run_function = run_function
        ctx.preserve_rng_state = preserve_rng_state
        if preserve_rng_state:
            ctx.fwd_cpu_state = get_rng_state()
        ctx.inputs = [None if isinstance(a, Tensor) else a for a in args]
        ctx.tensor_indices = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.save_for_backward(*[a for a in args if isinstance(a, Tensor)])
        with no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        inputs = list(ctx.inputs)
        for idx, t in zip(ctx.tensor_indices, ctx.saved_tensors, strict=True):
            inputs[idx] = t
        detached = detach_variable(tuple(inputs))
        outer_state = get_rng_state() if ctx.preserve_rng_state else None
        try:
            if ctx.preserve_rng_state:
                set_rng_state(ctx.fwd_cpu_state)
            with enable_grad():
                outputs = ctx.run_function(*detached)
        finally:
            if outer_state is not None:
                set_rng_state(outer_state)
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        roots, root_grads = [], []
        for out, g in zip(outputs, grads, strict=False):
            if isinstance(out, Tensor) and out.requires_grad:
                roots.append(out)
                root_grads.append(g if g is not None else out.detach() * 0)
        if not roots:
            raise RuntimeError(
                "none of output has requires_grad=True, this checkpoint() is not necessary")
        backward(roots, root_grads)
        return (None, None) + tuple(
            d.grad if isinstance(d, Tensor) else None for d in detached)


def _with_anchor(function, n_args: int, kwargs):
    # use_reentrant=False: keyword arguments are closed over, and a zero-size input that
    # requires grad makes sure the region is recorded (so parameters get gradients) even when
    # no real input requires grad.
    def run(anchor, *args):
        return function(*args, **kwargs)

    return run


def checkpoint(function, *args, use_reentrant=None, context_fn=noop_context_fn,
               determinism_check="default", debug=False, early_stop=True, **kwargs):
    """Run `function(*args)` without keeping its activations; recompute them in backward."""
    if use_reentrant is None:
        warnings.warn(
            "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
            "Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an "
            "exception. use_reentrant=False is recommended, but if you need to preserve the "
            "current default behavior, you can pass use_reentrant=True. Refer to docs for more "
            "details on the differences between the two variants.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if use_reentrant:
        if context_fn is not noop_context_fn or debug is not False:
            raise ValueError("Passing `context_fn` or `debug` is only supported when "
                             "use_reentrant=False.")
        check_backward_validity(args)
        return CheckpointFunction.apply(function, preserve, *args)
    if context_fn is not noop_context_fn or debug is not False:
        raise NotImplementedError(
            "checkpoint(use_reentrant=False): `context_fn` and `debug` are not implemented in "
            "sbpflow (selective activation checkpointing needs torch's dispatch modes)")
    if determinism_check not in ("default", "none"):
        raise ValueError("determinism_check should be one of ['default', 'none'], but got "
                         f"{determinism_check}")
    from ..framework import functional as F

    anchor = F.empty(0, requires_grad=True)
    return CheckpointFunction.apply(_with_anchor(function, len(args), kwargs), preserve,
                                    anchor, *args)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """Split `functions` (a Sequential or a list) into `segments` chunks and checkpoint each
    chunk but the last."""
    if use_reentrant is None:
        warnings.warn(
            "torch.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should "
            "be passed explicitly. In version 2.9 we will raise an exception if use_reentrant "
            "is not passed. use_reentrant=False is recommended, but if you need to preserve the "
            "current default behavior, you can pass use_reentrant=True. Refer to docs for more "
            "details on the differences between the two variants.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))

    def run_function(start, end, functions):
        def forward(input):
            for j in range(start, end + 1):
                input = functions[j](input)
            return input

        return forward

    if not isinstance(functions, (list, tuple)) and hasattr(functions, "children"):
        functions = list(functions.children())  # nn.Sequential (nn is a sibling layer)
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(run_function(start, end, functions), input,
                           use_reentrant=use_reentrant, preserve_rng_state=preserve)
    return run_function(end + 1, len(functions) - 1, functions)(input)
