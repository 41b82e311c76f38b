"""The backward engine.

Given root tensors and their gradients, it counts each node's consumers, then runs nodes in
dependency order (ties broken by creation order, newest first, as torch does), summing the
gradients that meet at a node's output.  With `inputs`, it returns the gradients reaching those
tensors instead of accumulating into `.grad`, and runs only the nodes that lead to them.
Gradients are computed with ops, so with `create_graph=True` they are themselves differentiable.
"""

from __future__ import annotations

import heapq
import sys

from ..ops.registry import op
from .grad_mode import set_grad_enabled
from .node import AccumulateGrad


def _edge(t):
    """(node, output_nr) through which a gradient reaches tensor t."""
    if t.grad_fn is not None:
        return t.grad_fn, t._output_nr
    if t.requires_grad:
        return t._grad_accumulator(), 0
    return None


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return op("add", a, b)


def run_backward(roots, grad_roots, retain_graph=False, create_graph=False, inputs=None,
                 allow_unused=False, accumulate=True):
    root_edges = []
    for t in roots:
        e = _edge(t)
        if e is None:
            raise RuntimeError(
                "element 0 of tensors does not require grad and does not have a grad_fn"
            )
        root_edges.append(e)

    # Nodes whose incoming gradient we capture (autograd.grad) instead of running them.
    capture = {}
    if inputs is not None:
        for i, t in enumerate(inputs):
            e = _edge(t)
            if e is None:
                raise RuntimeError("One of the differentiated Tensors does not require grad")
            capture.setdefault((id(e[0]), e[1]), []).append(i)

    # Count dependencies over the reachable graph.
    deps: dict[int, int] = {}
    nodes = {}
    # One entry per node: two roots can be outputs of the same node (nll_loss, max_dim).
    stack = list({id(e[0]): e[0] for e in root_edges}.values())
    for n in stack:
        nodes[id(n)] = n
    while stack:
        n = stack.pop()
        for e in n.next_functions:
            if e is None:
                continue
            child = e[0]
            deps[id(child)] = deps.get(id(child), 0) + 1
            if id(child) not in nodes:
                nodes[id(child)] = child
                stack.append(child)

    needed = None
    if inputs is not None:
        needed = _nodes_leading_to({k[0] for k in capture}, nodes)

    buffers: dict[int, dict[int, object]] = {}
    for (n, nr), g in zip(root_edges, grad_roots):
        slot = buffers.setdefault(id(n), {})
        slot[nr] = _add(slot.get(nr), g)

    results = [None] * (len(inputs) if inputs is not None else 0)
    ready = []
    for n, _ in root_edges:
        if deps.get(id(n), 0) == 0 and all(id(n) != r[1] for r in ready):
            heapq.heappush(ready, (-n.seq, id(n), n))
    seen_ready = {id(r[2]) for r in ready}

    with set_grad_enabled(create_graph):
        while ready:
            _, _, node = heapq.heappop(ready)
            grads = buffers.pop(id(node), {})
            if node.pre_hooks:
                for nr, hooks in node.pre_hooks.items():
                    # retain_grad's hooks run last, so .grad shows what other hooks returned.
                    for hook in sorted(hooks, key=_retains_grad_hook):
                        if grads.get(nr) is not None:
                            new = hook(grads[nr])
                            if new is not None:
                                grads[nr] = new
            if isinstance(node, AccumulateGrad) and grads.get(0) is not None:
                # A leaf's hooks shape its gradient for autograd.grad as well as for .grad.
                grads[0] = _run_leaf_hooks(node.variable, grads[0])
            for nr, idxs in ((k[1], v) for k, v in capture.items() if k[0] == id(node)):
                for i in idxs:
                    results[i] = grads.get(nr)
            if isinstance(node, AccumulateGrad):
                if inputs is None and accumulate:
                    _accumulate(node.variable, grads.get(0), create_graph)
                continue
            if needed is not None and id(node) not in needed:
                in_grads = [None] * len(node.next_functions)
            else:
                in_grads = node.apply(_materialize(node, grads))
                if not retain_graph:
                    node.release()
                _check_grads(node, in_grads)
            for e, g in zip(node.next_functions, in_grads):
                if e is None:
                    continue
                child, nr = e
                if g is not None:
                    slot = buffers.setdefault(id(child), {})
                    slot[nr] = _add(slot.get(nr), g)
                deps[id(child)] -= 1
                if deps[id(child)] == 0 and id(child) not in seen_ready:
                    seen_ready.add(id(child))
                    heapq.heappush(ready, (-child.seq, id(child), child))
            in_grads = g = grads = None  # only the buffers hold gradients now (_only_reference)

    if inputs is not None:
        for i, r in enumerate(results):
            if r is None and not allow_unused:
                raise RuntimeError(
                    f"The differentiated Tensor at index {i} appears to not have been used in "
                    "the graph. Set allow_unused=True if this is the desired behavior."
                )
        return results
    return None


def _retains_grad_hook(hook) -> bool:
    return getattr(hook, "retains_grad", False)


def _nodes_leading_to(targets: set[int], nodes: dict) -> set[int]:
    """Ids of the nodes from which some target node is reachable."""
    memo: dict[int, bool] = {}

    def reaches(n) -> bool:
        k = id(n)
        if k in memo:
            return memo[k]
        memo[k] = k in targets
        for e in n.next_functions:
            if e is not None and reaches(e[0]):
                memo[k] = True
        return memo[k]

    for n in nodes.values():
        reaches(n)
    return {k for k, v in memo.items() if v}


def _materialize(node, grads):
    """Zeros for differentiable outputs that got no gradient; None for the others (integer
    outputs, an op's nondiff workspace)."""
    out = []
    opdef = getattr(node, "opdef", None)
    for i, meta in enumerate(node.out_metas):
        g = grads.get(i)
        if (g is None and meta.dtype.is_floating_point and node.materialize_grads
                and (opdef is None or opdef.differentiable(i, meta))):
            g = op("full", shape=meta.shape, fill_value=0.0, dtype=meta.dtype,
                   _device=getattr(node, "device", None))
        out.append(g)
    return out


def _check_grads(node, grads):
    if len(grads) != len(node.next_functions):
        raise RuntimeError(
            f"function {node.name()} returned an incorrect number of gradients (expected "
            f"{len(node.next_functions)}, got {len(grads)})"
        )
    for i, (g, m) in enumerate(zip(grads, node.in_metas)):
        if g is not None and node.next_functions[i] is not None and tuple(g.shape) != m.shape:
            raise RuntimeError(
                f"Function {node.name()} returned an invalid gradient at index {i} - got "
                f"{list(g.shape)} but expected shape compatible with {list(m.shape)}"
            )


def _run_leaf_hooks(leaf, g):
    for hook in leaf._leaf_hooks or ():
        new = hook(g)
        if new is not None:
            g = new
    return g


# References to a gradient tensor that only the engine holds when `_only_reference` counts
# them: run_backward's `grads` dict, _accumulate's and _only_reference's arguments, and
# getrefcount's own.
_ENGINE_REFS = 4


def _only_reference(g) -> bool:
    """Whether g (a gradient arriving at a leaf) is seen by nobody but the engine: no user
    variable, hook or saved tensor holds it, nothing else shares its memory (its storage's
    only referrer is g), and it is a plain contiguous local tensor.  Then leaf.grad may take
    its memory instead of a copy, as torch's AccumulateGrad does."""
    st = g._storage
    return (g._base is None and g._gl is None and g._grad_fn is None and g._offset == 0
            and g.is_contiguous() and sys.getrefcount(g) <= _ENGINE_REFS
            and sys.getrefcount(st) <= 3)  # g's field, `st` here, getrefcount's argument


def _accumulate(leaf, g, create_graph):
    """Add g (already through the leaf's hooks) into leaf.grad."""
    if g is None:
        return
    if leaf.grad is None:
        if create_graph:
            leaf.grad = g
        elif _only_reference(g):
            leaf.grad = g.detach()  # torch "steals" a gradient nobody else can see: no copy
        else:
            leaf.grad = g.detach().clone()
    elif create_graph:
        leaf.grad = leaf.grad + g
    else:
        with set_grad_enabled(False):
            leaf.grad.add_(g.detach())
    if leaf.is_global and (leaf.grad.placement != leaf.placement or leaf.grad.sbp != leaf.sbp):
        # As OneFlow: a global leaf's gradient takes the leaf's placement and SBP, so a B
        # parameter gets a B gradient (partial sums all-reduced) that optimizers can use.
        # Checked last: clone and add choose their own signature, which never splits an axis
        # shorter than the ranks (sbp.infer), so even a matching g may come back changed.
        leaf.grad = leaf.grad.to_global(leaf.placement, leaf.sbp)
