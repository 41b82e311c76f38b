"""The Job: the op graph that `nn.Graph.build()` is traced into and that passes rewrite.

A Job is a list of `OpNode`s in a valid execution order over named `LogicalTensor`s (SSA:
every tensor name is produced by exactly one op).  Every tensor carries its logical meta and
its placement and nd-SBP, so the same IR serves one rank and many (a later pass lowers it to a
per-rank Plan).

Op types are the registry's op names (`matmul`, `add`, ...) plus a few structural ones:

| op_type    | inputs            | outputs | attrs                                                |
|------------|-------------------|---------|------------------------------------------------------|
| `input`    | -                 | 1       | `index`: position in the graph call's arguments     |
| `variable` | -                 | 1       | `var`: name in `job.variables` (a parameter, buffer, |
|            |                   |         | optimizer state or captured eager tensor)            |
| `feed`     | -                 | 1       | `key`: a host scalar fed at every call (e.g. `lr`)   |
| `constant` | -                 | 1       | `value`: a NumPy array (from constant folding)       |
| `assign`   | var tensor, value | 0       | writes value into the variable (an in-place update)  |
| `output`   | 1                 | 0       | `index`: position in the graph call's result         |

Anything else must be a registered OpDef, or an op type with a kernel resolver registered in
`KERNEL_RESOLVERS` (e.g. `fused_elementwise` from the fusion pass), so the compiler can find a
kernel for every node.

Attrs are the OpDef's bound attrs (values: bool, int, float, str, None, DType, tuples of
those); `constant`'s value is an ndarray.  `to_json`/`from_json` round-trip all of them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

from .._core import dtype as dt
from .._core.codec import attr_text, decode, encode
from .._core.meta import TensorMeta
from ..sbp import B, P, S
from ..sbp.placement import Placement

STRUCTURAL = ("input", "variable", "feed", "constant", "assign", "output")
# Conversions between (placement, SBP) pairs and between global and local tensors: explicit
# nodes of the Job (from `to_global`/`to_local` inside build() and from every reshard the SBP
# inference needs), lowered to boxing steps on each rank.  attrs: `boxing_attrs`.
BOXING = ("boxing", "local_to_global", "global_to_local")

# op_type -> fn(op_node, job) -> kernel(ctx, *arrays, **attrs); for op types that are not
# registered OpDefs (the fusion pass registers `fused_elementwise` here).
KERNEL_RESOLVERS: dict[str, Callable[..., Any]] = {}
# The op types of KERNEL_RESOLVERS whose kernels write their one output into the `out=` buffer
# the runtime hands them (the resolver's kernel exists only at link time, so its module declares
# it here): memory planning gives only such outputs, and those of registry kernels with
# `accepts_out`, an offset in the block.
OUT_WRITERS: set[str] = set()
# The op types of KERNEL_RESOLVERS whose one output is a view of their first input (declared
# here for the same reason): the compiler and memory planning alias it to that input's memory.
VIEW_OPS: set[str] = set()


@dataclasses.dataclass
class LogicalTensor:
    """One value of the Job: its logical meta, placement and nd-SBP, and who makes it."""

    name: str
    meta: TensorMeta
    placement: Placement
    sbp: tuple  # nd-SBP, one entry per placement hierarchy axis
    producer: str | None = None  # name of the OpNode that writes it
    # Set by memory planning: (offset, nbytes) in the plan's memory block, or None when the
    # tensor is not planned (variables, views, outputs of kernels that allocate their own).
    mem: tuple[int, int] | None = None
    # A global tensor (placement and SBP are the user's, each rank holds its piece), or a
    # local one (placement: this rank, B; every rank holds its own whole tensor).
    is_global: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape

    @property
    def dtype(self) -> dt.DType:
        return self.meta.dtype


@dataclasses.dataclass
class OpNode:
    """One op call: op type, input and output tensor names, bound attrs, and where it came
    from (the module path `scope` and the user's `build()` line `loc`)."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict = dataclasses.field(default_factory=dict)
    scope: str = ""
    loc: tuple[str, int] | None = None  # (filename, lineno) of the user's line
    # Gradient accumulation: the micro-batch (0..n-1) the op computes, or None for an op of
    # the whole step (inputs, variables, the update, packing the outputs).  Passes keep ops of
    # different micro-batches apart (fusing them would keep one micro-batch's values alive
    # into the next).
    micro_batch: int | None = None

    def where(self) -> str:
        """'<file>:<line>' of the user's build() line, for error messages."""
        if self.loc is None:
            return "<unknown>"
        return f"{self.loc[0]}:{self.loc[1]}"


@dataclasses.dataclass
class Variable:
    """A variable of the Job: state that lives across calls (parameters, buffers, optimizer
    states).  `tensor` is the eager tensor whose memory the graph reads and writes, so eager
    code and the graph see the same values; it is not serialised."""

    name: str
    meta: TensorMeta
    trainable: bool = False
    tensor: Any = None


class Job:
    """An op graph: ops in execution order, tensors by name, variables, and what the caller
    feeds and fetches.  Passes mutate it through the methods below, which keep the producer
    links and the name counters consistent."""

    def __init__(self, name: str = "job"):
        self.name = name
        self.ops: list[OpNode] = []
        self.tensors: dict[str, LogicalTensor] = {}
        self.variables: dict[str, Variable] = {}
        self.config: dict[str, Any] = {}  # graph config flags passes read (allow_fuse_*, ...)
        self.loss: list[str] = []  # tensors `loss.backward()` was called on inside build()
        self.grads: dict[str, str] = {}  # variable name -> gradient tensor (autograd pass)
        self.stats: dict[str, Any] = {}  # what passes report, e.g. memory planning's peak
        self._counter = itertools.count()

    # -- building ---------------------------------------------------------------------------
    def new_name(self, prefix: str) -> str:
        return f"{prefix}-{next(self._counter)}"

    def add_tensor(self, meta: TensorMeta, placement: Placement, sbp: tuple,
                   name: str | None = None, is_global: bool = False) -> LogicalTensor:
        name = name or self.new_name("t")
        if name in self.tensors:
            raise ValueError(f"Job {self.name}: tensor {name!r} exists")
        t = LogicalTensor(name, meta, placement, tuple(sbp), is_global=is_global)
        self.tensors[name] = t
        return t

    def add_op(self, op_type: str, inputs, outputs, attrs=None, scope: str = "", loc=None,
               name: str | None = None, index: int | None = None,
               micro_batch: int | None = None) -> OpNode:
        """Append an op (or insert it at `index`); `outputs` are names of tensors already
        added with `add_tensor`, which this op now produces."""
        name = name or self.new_name(f"{scope + '-' if scope else ''}{op_type}")
        node = OpNode(name, op_type, tuple(inputs), tuple(outputs), dict(attrs or {}), scope,
                      loc, micro_batch)
        for i in node.inputs:
            if i not in self.tensors:
                raise ValueError(f"Job {self.name}: op {name} reads unknown tensor {i!r}")
        for o in node.outputs:
            t = self.tensors[o]
            if t.producer is not None:
                raise ValueError(f"Job {self.name}: tensor {o!r} already produced by "
                                 f"{t.producer}")
            t.producer = name
        if index is None:
            self.ops.append(node)
        else:
            self.ops.insert(index, node)
        return node

    def remove_ops(self, names) -> None:
        """Drop ops (and the tensors only they produce)."""
        names = set(names)
        keep = []
        for op in self.ops:
            if op.name in names:
                for o in op.outputs:
                    self.tensors.pop(o, None)
            else:
                keep.append(op)
        self.ops = keep

    def replace_uses(self, old: str, new: str) -> None:
        """Make every reader of tensor `old` read `new` instead (also loss/grads lists)."""
        for op in self.ops:
            if old in op.inputs:
                op.inputs = tuple(new if i == old else i for i in op.inputs)
        self.loss = [new if x == old else x for x in self.loss]
        self.grads = {k: (new if v == old else v) for k, v in self.grads.items()}

    # -- queries ----------------------------------------------------------------------------
    def op(self, name: str) -> OpNode:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)

    def producer(self, tensor: str) -> OpNode | None:
        p = self.tensors[tensor].producer
        return None if p is None else self.op(p)

    def consumers(self) -> dict[str, list[OpNode]]:
        """tensor name -> the ops that read it, in execution order."""
        out: dict[str, list[OpNode]] = {}
        for op in self.ops:
            for i in op.inputs:
                out.setdefault(i, []).append(op)
        return out

    def ops_of(self, op_type: str) -> Iterator[OpNode]:
        return (op for op in self.ops if op.op_type == op_type)

    def inputs(self) -> list[OpNode]:
        return sorted(self.ops_of("input"), key=lambda o: o.attrs["index"])

    def outputs(self) -> list[OpNode]:
        return sorted(self.ops_of("output"), key=lambda o: o.attrs["index"])

    def check(self, placements: bool = False) -> None:
        """Every input is produced earlier, every tensor is produced once: raise otherwise.

        `placements=True` also checks placements and SBPs (the verifier `run_passes` runs
        after every pass under `debug()` and in the tests): an op reads either local tensors
        or global ones on one placement (0-d tensors aside), never both; its global tensors'
        (input, output) nd-SBPs are a signature its OpDef declares; a boxing node's tensors
        are the two ends its attrs name; every SBP fits its placement's hierarchy."""
        seen = set()
        for op in self.ops:
            for i in op.inputs:
                if i not in seen:
                    raise ValueError(f"Job {self.name}: op {op.name} reads {i!r} before it is "
                                     "produced")
            for o in op.outputs:
                if o in seen:
                    raise ValueError(f"Job {self.name}: {o!r} is produced twice")
                seen.add(o)
        if placements:
            for t in self.tensors.values():
                if len(t.sbp) != t.placement.ndim:
                    raise ValueError(f"Job {self.name}: tensor {t.name} has nd-SBP {t.sbp} "
                                     f"for a placement of {t.placement.ndim} axes")
            for op in self.ops:
                _check_placements(self, op)

    # -- text forms ---------------------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"Job {self.name} ({len(self.ops)} ops, {len(self.variables)} variables)"]
        for op in self.ops:
            outs = ", ".join(_tensor_text(self.tensors[o]) for o in op.outputs)
            attrs = ", ".join(f"{k}={attr_text(v)}" for k, v in op.attrs.items())
            scope = f"  # {op.scope}" if op.scope else ""
            if op.op_type in BOXING:
                scope = f"  # {boxing_text(op, self)}" + (f" ({op.scope})" if op.scope else "")
                attrs = ""
            if op.micro_batch is not None:
                scope += f"{'  #' if not scope else ','} micro-batch {op.micro_batch}"
            lhs = f"{outs} = " if outs else ""
            lines.append(f"  {lhs}{op.op_type}({', '.join(op.inputs)}"
                         f"{'; ' + attrs if attrs else ''}){scope}")
        return "\n".join(lines)

    def to_dot(self) -> str:
        """Graphviz source: ops as boxes, tensors as edges labelled with shape and SBP."""
        lines = [f'digraph "{self.name}" {{', "  node [shape=box, fontsize=10];"]
        for op in self.ops:
            label = op.op_type if not op.scope else f"{op.op_type}\\n{op.scope}"
            lines.append(f'  "{op.name}" [label="{label}"];')
        for op in self.ops:
            for i in op.inputs:
                t = self.tensors[i]
                if t.producer is not None:
                    lines.append(f'  "{t.producer}" -> "{op.name}" '
                                 f'[label="{_meta_text(t)}", fontsize=8];')
        lines.append("}")
        return "\n".join(lines)

    # -- serialisation ----------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({
            "name": self.name,
            "config": {k: encode(v) for k, v in self.config.items()},
            "loss": self.loss,
            "grads": self.grads,
            "variables": [{"name": v.name, "shape": list(v.meta.shape),
                           "dtype": v.meta.dtype.name, "trainable": v.trainable}
                          for v in self.variables.values()],
            "tensors": [{"name": t.name, "shape": list(t.meta.shape), "dtype": t.meta.dtype.name,
                         "placement": {"type": t.placement.type,
                                       "ranks": t.placement.ranks},
                         "sbp": [_sbp_enc(x) for x in t.sbp],
                         "is_global": t.is_global,
                         "mem": list(t.mem) if t.mem is not None else None}
                        for t in self.tensors.values()],
            "ops": [{"name": o.name, "op_type": o.op_type, "inputs": list(o.inputs),
                     "outputs": list(o.outputs),
                     "attrs": {k: encode(v) for k, v in o.attrs.items()},
                     "scope": o.scope, "loc": list(o.loc) if o.loc else None,
                     "micro_batch": o.micro_batch}
                    for o in self.ops],
        })

    @classmethod
    def from_json(cls, text: str) -> Job:
        d = json.loads(text)
        job = cls(d["name"])
        job.config = {k: decode(v) for k, v in d["config"].items()}
        job.loss = list(d["loss"])
        job.grads = dict(d["grads"])
        for v in d["variables"]:
            job.variables[v["name"]] = Variable(
                v["name"], TensorMeta(tuple(v["shape"]), dt._by_name(v["dtype"])),
                v["trainable"])
        for t in d["tensors"]:
            lt = job.add_tensor(TensorMeta(tuple(t["shape"]), dt._by_name(t["dtype"])),
                                Placement(t["placement"]["type"], t["placement"]["ranks"]),
                                tuple(_sbp_dec(x) for x in t["sbp"]), name=t["name"],
                                is_global=t.get("is_global", False))
            lt.mem = tuple(t["mem"]) if t["mem"] is not None else None
        for o in d["ops"]:
            job.add_op(o["op_type"], o["inputs"], o["outputs"],
                       {k: decode(v) for k, v in o["attrs"].items()}, o["scope"],
                       tuple(o["loc"]) if o["loc"] else None, name=o["name"],
                       micro_batch=o.get("micro_batch"))
        # Keep fresh names unique after a round trip.
        job._counter = itertools.count(len(job.ops) + len(job.tensors) + 1)
        return job


# -- the SBP/placement verifier ---------------------------------------------------------------
def _check_placements(job: Job, op: OpNode) -> None:
    ts = [job.tensors[n] for n in (*op.inputs, *op.outputs)]

    def fail(what: str):
        raise ValueError(f"Job {job.name}: op {op.name} ({op.op_type}) at {op.where()}: {what}")

    if op.op_type in BOXING:
        (sp, ss), (dp, ds) = boxing_ends(op.attrs)
        src, dst = ts
        if op.op_type != "local_to_global" and (src.placement != sp or src.sbp != ss):
            fail(f"reads {src.name} on {src.placement} {src.sbp}, attrs say {sp} {ss}")
        if op.op_type != "global_to_local" and (dst.placement != dp or dst.sbp != ds):
            fail(f"makes {dst.name} on {dst.placement} {dst.sbp}, attrs say {dp} {ds}")
        if src.is_global == (op.op_type == "local_to_global") or \
                dst.is_global == (op.op_type == "global_to_local"):
            fail("converts between the wrong kinds of tensor (local/global)")
        return
    if op.op_type in STRUCTURAL:
        if op.op_type == "assign":
            var, value = (job.tensors[n] for n in op.inputs)
            if var.is_global != value.is_global or (var.is_global and (
                    var.placement != value.placement or var.sbp != value.sbp)):
                fail(f"writes {value.name} ({value.placement} {value.sbp}) into variable "
                     f"{var.name} ({var.placement} {var.sbp}): box it first")
        return
    glob = [t for t in ts if t.is_global]
    if not glob:
        return
    if len(glob) != len(ts):
        fail("mixes local and global tensors: "
             f"{', '.join(t.name for t in ts if not t.is_global)} are local")
    placement = next((t.placement for t in glob if t.shape), glob[0].placement)
    for t in glob:
        if t.shape and t.placement != placement:
            fail(f"{t.name} is on {t.placement}, the op on {placement}")
    try:
        from ..ops import registry

        opdef = registry.get(op.op_type)
    except KeyError:
        return  # an op type of a pass (fused kernels): its own pass checked it
    from ..sbp import infer

    ins = tuple(job.tensors[n] for n in op.inputs)
    outs = tuple(job.tensors[n] for n in op.outputs)
    in_metas = tuple(t.meta for t in ins)
    out_metas = tuple(t.meta for t in outs)
    want = (tuple(t.sbp for t in ins), tuple(t.sbp for t in outs))
    if not ins:
        return  # creation ops: what they make is checked by the boxing after them
    cands = infer.candidates(opdef.signatures(in_metas, op.attrs), in_metas, out_metas,
                             placement, want[0])
    if want not in cands:
        fail(f"nd-SBPs {_sig_text(want)} are not a signature of {op.op_type} on {placement}")


def _sig_text(sig) -> str:
    ins, outs = sig
    return (f"({', '.join(_sbp_text(x) for x in ins)}) -> "
            f"({', '.join(_sbp_text(x) for x in outs)})")


# -- boxing nodes -----------------------------------------------------------------------------
def boxing_attrs(src: LogicalTensor, placement: Placement, sbp: tuple,
                 broadcast: bool = True, dst_is_local: bool = False) -> dict:
    """The attrs of a BOXING node: both ends as plain data (nested rank tuples, SBP text),
    so a Plan read back from JSON can rebuild the route.  `broadcast=False`: a local ->
    global relabel whose pieces are already right (the gradient of `to_local`)."""
    # A local end has no placement of its own (each rank's tensor is its own, stamped with
    # its rank): it is recorded as empty, so the node reads the same on every rank.
    local_src = not src.is_global
    local_dst = dst_is_local
    attrs = {"src_ranks": () if local_src else _nested(src.placement.ranks),
             "src_sbp": () if local_src else tuple(map(_sbp_enc, src.sbp)),
             "dst_ranks": () if local_dst else _nested(placement.ranks),
             "dst_sbp": () if local_dst else tuple(map(_sbp_enc, sbp)),
             "device": placement.type}
    if not broadcast:
        attrs["broadcast"] = False
    return attrs


def boxing_ends(attrs: dict) -> tuple:
    """((src placement, src nd-SBP), (dst placement, dst nd-SBP)) of a BOXING node; a local
    end is (None, ())."""
    dev = attrs["device"]

    def end(ranks, sbp):
        if not ranks:
            return None, ()
        return Placement(dev, _lists(ranks)), tuple(map(_sbp_dec, sbp))

    return end(attrs["src_ranks"], attrs["src_sbp"]), end(attrs["dst_ranks"], attrs["dst_sbp"])


def boxing_text(op: OpNode, job: Job) -> str:
    """A boxing node in `flow.boxing.explain`'s words (e.g. 'P -> B: all_reduce over [0, 1],
    4 KB'); conversions between local and global say what they do."""
    from ..sbp import boxing

    (sp, ss), (dp, ds) = boxing_ends(op.attrs)
    if op.op_type == "global_to_local":
        return f"to_local: this rank's piece of {_sbp_text(ss)} on ranks {sp.ranks}"
    if op.op_type == "local_to_global":
        how = "pieces" if not op.attrs.get("broadcast", True) or B not in ds else \
            "broadcast from the first rank of each B axis"
        return f"local_to_global: {_sbp_text(ds)} on ranks {dp.ranks} ({how})"
    meta = job.tensors[op.inputs[0]].meta
    return boxing.route(meta, sp, ss, dp, ds).explain().replace("\n", "; ")


def _sbp_text(sbp) -> str:
    return ", ".join(map(repr, sbp))


def _nested(ranks):
    return tuple(_nested(r) for r in ranks) if isinstance(ranks, (list, tuple)) else int(ranks)


def _lists(ranks):
    return [_lists(r) for r in ranks] if isinstance(ranks, (list, tuple)) else int(ranks)


# -- helpers ----------------------------------------------------------------------------------
def _meta_text(t: LogicalTensor) -> str:
    sbp = ", ".join(map(repr, t.sbp))
    if t.is_global:
        return f"{t.dtype.name}{list(t.shape)} ({sbp}) on ranks {t.placement.ranks}"
    return f"{t.dtype.name}{list(t.shape)} ({sbp})"


def _tensor_text(t: LogicalTensor) -> str:
    return f"{t.name}: {_meta_text(t)}"


def _sbp_enc(x) -> str:
    return repr(x)  # "S(0)", "B", "P"


def _sbp_dec(s: str):
    if s == "B":
        return B
    if s == "P":
        return P
    return S(int(s[2:-1]))
