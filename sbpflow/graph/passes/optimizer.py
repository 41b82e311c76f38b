"""Optimizer pass: the update ops of the optimizers added with `nn.Graph.add_optimizer`.

The front end describes each optimizer in `job.config["optimizers"]` (plain data, so the Job
still serialises) and puts the optimizer states into `job.variables` (the eager optimizer's
own `state[p]` tensors):

    {"kind": "sgd" | "adam" | "adagrad" | "ftrl" (the last two: one-embedding tables only),
     "groups": [{"params": [param variable, ...],
                 "hyper": {attrs of sgd_update / adam_update},
                 "lr": feed key, "first": variable (SGD with momentum: 1.0 until the
                 group's momentum buffers are initialised; the step clears it),
                 "states": {param variable: {state name: variable}},
                 "clip_grad_max_norm": float | None, "clip_grad_norm_type": float}]}

For every group whose parameters got gradients (`job.grads`, from the autograd pass) this
appends: `feed` ops for the host scalars (the learning rate is fed at every call, so LR
schedulers work without recompiling), OneFlow-style gradient clipping over the group (torch's
clip_grad_norm_ formula), one update op per parameter (or one `multi_*` op per group with
`job.config["allow_fuse_model_update_ops"]`), and `assign` ops writing the new parameters and
states into their variables at the end of the step.

One-embedding tables: a parameter that is a table's placeholder (the `shadow` input of a
`one_embedding_lookup` whose rows' gradient a `one_embedding_gradient_shuffle` computes) gets
no dense update; its group's rule becomes `one_embedding_{sgd,momentum,adam,adagrad,ftrl}_update`
over the owned ids and summed gradient rows of every lookup of the table in the step, which
updates the rows inside the store (an effect op: dead-code elimination keeps it).
"""

from __future__ import annotations

from ..._core import dtype as dt
from ..._core.meta import TensorMeta
from ...framework.functional import reduce
from ...framework.global_tensor import GlobalDevice
from ...ops import registry
from ...sbp import B
from ..ir import Job
from ..trace import Trace

STATE_ORDER = {"sgd": ("momentum_buffer",),
               "adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")}


def run(job: Job) -> None:
    specs = job.config.get("optimizers") or []
    if not specs or not job.grads:
        return
    trace = Trace(job)
    fuse = bool(job.config.get("allow_fuse_model_update_ops", False))
    tables = embedding_grads(job)
    with trace.active(), trace.scope("optimizer"):
        for spec in specs:
            for group in spec["groups"]:
                _group(job, trace, spec["kind"], group, fuse, tables)


def embedding_grads(job: Job) -> dict[str, tuple[str, list]]:
    """One-embedding tables: placeholder variable -> (store handle, [(owned ids, their count,
    their gradient rows)] per lookup), from the lookups' gradient shuffles."""
    out: dict[str, tuple[str, list]] = {}
    for op in job.ops_of("one_embedding_gradient_shuffle"):
        lookup = job.producer(op.inputs[1])
        if lookup is None or lookup.op_type != "one_embedding_lookup":
            raise ValueError(f"Job {job.name}: {op.name} reads a plan that no "
                             "one_embedding_lookup made")
        shadow = job.producer(lookup.inputs[0])
        if shadow is None or shadow.op_type != "variable":
            continue
        entry = out.setdefault(shadow.attrs["var"], (lookup.attrs["handle"], []))
        entry[1].append((lookup.outputs[4], lookup.outputs[3], op.outputs[0]))
    return out


def _embedding_update(job: Job, trace: Trace, kind: str, hyper: dict, lr, param: str,
                      tables: dict) -> None:
    """The in-store update of one-embedding table `param` (its placeholder variable): the
    rows' gradients from the gradient shuffles go to `one_embedding_<rule>_update`."""
    handle, lookups = tables[param]
    if kind == "sgd":
        rule = "momentum" if hyper.get("momentum", 0.0) != 0 else "sgd"
    elif kind in ("adam", "adagrad", "ftrl"):
        rule = kind
    else:
        raise NotImplementedError(f"nn.Graph optimizer pass: no in-store update for {kind!r}")
    attrs = registry.get(f"one_embedding_{rule}_update").attrs
    flat = [trace.lazy(t) for block in lookups for t in block] + [lr]
    registry.op(f"one_embedding_{rule}_update", flat, handle=handle,
                **{k: v for k, v in hyper.items() if k in attrs})


def _feed(job: Job, trace: Trace, key: str, like: str | None = None):
    """The host scalar fed as `key` at every call; for the parameters of a global model, a
    B tensor on the placement of `like` (a parameter), so the update ops see global inputs
    only, as eager's do."""
    name = f"feed-{key}"
    if name not in job.tensors:
        t = job.tensors.get(like) if like is not None else None
        if t is not None and t.is_global:
            job.add_tensor(TensorMeta((), dt.float64), t.placement, (B,) * t.placement.ndim,
                           name=name, is_global=True)
        else:
            job.add_tensor(TensorMeta((), dt.float64), trace.placement, trace.sbp, name=name)
        job.add_op("feed", (), (name,), {"key": key}, scope="optimizer")
    return trace.lazy(name)


def _variable(job: Job, trace: Trace, var: str):
    """The tensor holding variable `var` (its variable op, added if the Job has none)."""
    if var not in job.tensors:
        v = job.variables[var]
        placement, sbp, is_global = trace._where(v.tensor) if v.tensor is not None else (
            trace.placement, trace.sbp, False)
        job.add_tensor(v.meta, placement, sbp, name=var, is_global=is_global)
        job.add_op("variable", (), (var,), {"var": var}, scope="optimizer")
    return trace.lazy(var)


def _clip(grads, max_norm: float, norm_type: float):
    """torch.nn.utils.clip_grad_norm_ on the group's gradients (as lazy ops)."""
    _, coef = reduce.clip_coef(grads, max_norm, norm_type)
    return [g * coef.to(g.dtype) for g in grads]


def _group(job: Job, trace: Trace, kind: str, group: dict, fuse: bool,
           tables: dict | None = None) -> None:
    tables = tables or {}
    params = [p for p in group["params"] if p in job.grads]
    hyper = dict(group["hyper"])
    embeddings = [p for p in params if p in tables]
    if embeddings:
        if group.get("clip_grad_max_norm") is not None:
            raise NotImplementedError(
                "nn.Graph optimizer pass: gradient clipping over a group with a one-embedding "
                f"table ({', '.join(embeddings)}) is not offered; put the table in its own group")
        for p in embeddings:  # its rows update in the store; the placeholder stays zero
            _embedding_update(job, trace, kind, hyper, _feed(job, trace, group["lr"], p), p,
                              tables)
        params = [p for p in params if p not in tables]
    if not params:
        return
    grads = [trace.lazy(job.grads[p]) for p in params]
    if group.get("clip_grad_max_norm") is not None:
        grads = _clip(grads, group["clip_grad_max_norm"], group.get("clip_grad_norm_type", 2.0))
    lr = _feed(job, trace, group["lr"], params[0])
    if kind == "sgd":
        names = STATE_ORDER["sgd"] if hyper.get("momentum", 0.0) != 0 else ()
        shared = [lr, _variable(job, trace, group["first"])] if names else [lr]
        op_name = "sgd_update"
    elif kind == "adam":
        names = ("exp_avg", "exp_avg_sq")
        names += ("max_exp_avg_sq", "step") if hyper.get("amsgrad") else ("step",)
        shared = [lr]
        op_name = "adam_update"
    else:
        raise NotImplementedError(
            f"nn.Graph optimizer pass: no dense update op for {kind!r} (parameters "
            f"{', '.join(params)}); in a graph it updates one-embedding tables only")
    blocks = []
    for p, g in zip(params, grads):
        states = [_as_param(trace, _variable(job, trace, group["states"][p][s]), job.tensors[p])
                  for s in names]
        blocks.append((p, [_variable(job, trace, p), g, *states]))
    targets = []  # variable names in output order
    outs = []
    if fuse:
        # one multi-tensor op per parameter layout: its signature splits all its blocks alike,
        # and every parameter is updated where it lies (`OpDef.keeps_sbp`)
        buckets: dict = {}
        for i, (p, _) in enumerate(blocks):
            t = job.tensors[p]
            buckets.setdefault((t.placement, t.sbp) if t.is_global else None, []).append(i)
        outs_of: dict[int, list] = {}
        for idx in buckets.values():
            flat = [t for i in idx for t in blocks[i][1]] + shared
            res = registry.op(f"multi_{op_name}", flat, n=len(idx), **hyper)
            res = list(res) if isinstance(res, tuple) else [res]
            k = len(res) // len(idx)
            for j, i in enumerate(idx):
                outs_of[i] = res[j * k:(j + 1) * k]
        outs = [o for i in range(len(blocks)) for o in outs_of[i]]
    else:
        for _, b in blocks:
            res = registry.op(op_name, [*b, *shared], **hyper)
            outs.extend(res if isinstance(res, tuple) else (res,))
    for p, _ in blocks:
        targets.append(p)
        targets.extend(group["states"][p][s] for s in names)
    if len(outs) != len(targets):
        raise AssertionError(f"{op_name}: {len(outs)} outputs for {len(targets)} variables")
    if kind == "sgd" and names:
        targets.append(group["first"])
        flag = job.tensors[group["first"]]
        outs.append(registry.op("full", shape=(), fill_value=0.0, dtype=dt.float64,
                                _device=GlobalDevice(flag.placement) if flag.is_global
                                else None))
    for var, value in zip(targets, outs):
        target = job.tensors[var]
        if not target.is_global and value.is_global:
            value = trace.convert("to_local", value)  # a local state of a global parameter
        elif target.is_global and value.is_global and tuple(value.sbp) != target.sbp:
            # the update keeps the variable's SBP (eager's in-place writes box the same way)
            value = trace.convert("to_global", value, target.placement, target.sbp)
        job.add_op("assign", (var, trace.name_of(value)), (), scope="optimizer")


def _as_param(trace: Trace, state, param):
    """A local state of a global parameter (Adam's step counter, the same on every rank)
    taken as a B tensor on the parameter's placement, so the update sees global inputs."""
    if state.is_global or not param.is_global:
        return state
    placement = param.placement
    return trace.piece_to_global(state, placement, (B,) * placement.ndim, state._meta)
