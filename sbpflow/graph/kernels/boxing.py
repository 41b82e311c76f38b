"""Kernels of the Job's boxing nodes (`ir.BOXING`), run on each rank's pieces.

- `boxing`: the eager boxing route (`sbp.boxing.route`) between the two (placement, nd-SBP)
  ends, run as the task body: the same collectives and copies eager mode runs, on this
  rank's piece; its point-to-point messages are tagged per (register, piece)
  (`boxing.graph_tag`: the `register` attr the compiler gives a boxing task's op, and the
  job instance).  Every rank of the route runs the Job's boxing nodes in the Job's order, so
  the collectives are issued in one order, fixed by the Plan, on every rank.
- `local_to_global`: this rank's local tensor becomes its piece; a B axis of the target takes
  the piece of the first rank along it (a broadcast), as eager `to_global` does.  With
  `broadcast=False` (the gradient of `to_local`) the pieces are taken as they are.
- `global_to_local`: this rank's piece, as a local tensor.

The conversions copy the piece (the chain owns every kernel result; a view here would alias
an input slot or a variable behind the chain's back).
"""

from __future__ import annotations

import numpy as np

from ... import comm
from ...sbp import B, boxing
from .. import ir


def _resolve_boxing(node, job):
    (sp, ss), (dp, ds) = ir.boxing_ends(node.attrs)
    rank = comm.get_rank()
    in_src, in_dst = sp.has(rank), dp.has(rank)
    state = {}

    def kernel(ctx, x, register=0, **_attrs):  # the node attrs (both ends) were read above
        route = state.get("route")
        if route is None:
            route = state["route"] = boxing.route(ctx.logical_in[0], sp, ss, dp, ds)
        if rank not in route.participants():
            return ctx.prims.empty(ctx.out_metas[0].shape, ctx.out_metas[0].dtype)
        local = np.require(x, requirements="C") if in_src else None
        out = route.run(local, comm.world(), boxing.graph_tag(register, ctx.instance))
        if not in_dst:
            return ctx.prims.empty(ctx.out_metas[0].shape, ctx.out_metas[0].dtype)
        return out

    kernel.uses_instance = True  # ctx.instance: the job instance, for the messages' tags
    return kernel


def _resolve_local_to_global(node, job):
    _, (dp, ds) = ir.boxing_ends(node.attrs)
    rank = comm.get_rank()
    axes = [k for k, x in enumerate(ds) if x == B and dp.hierarchy[k] > 1] \
        if node.attrs.get("broadcast", True) else []
    groups = [dp.axis_ranks(rank, k) for k in axes] if dp.has(rank) else []

    def kernel(ctx, x, **_attrs):  # the node attrs (both ends) were read above
        if not dp.has(rank):
            return ctx.prims.empty(ctx.out_metas[0].shape, ctx.out_metas[0].dtype)
        if not groups:
            return np.array(x, order="C", copy=True)  # a fresh array: the chain owns it
        buf = np.array(x, order="C", copy=True)
        world = comm.world()
        for ranks in groups:
            world.group(ranks).broadcast(buf, root=0)
        return buf

    return kernel


def _resolve_global_to_local(node, job):
    def kernel(ctx, x, **_attrs):  # the node attrs (both ends) were read above
        return np.array(x, order="C", copy=True)  # a fresh array: the chain owns it

    return kernel


ir.KERNEL_RESOLVERS["boxing"] = _resolve_boxing
ir.KERNEL_RESOLVERS["local_to_global"] = _resolve_local_to_global
ir.KERNEL_RESOLVERS["global_to_local"] = _resolve_global_to_local
