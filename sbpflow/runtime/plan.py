"""The Plan: what the compiler hands the runtime, per rank.

A Plan is data only (serialisable, printable): tasks, the register descriptors that connect
them, the tensors the registers and compute chains hold, and the ops of each compute chain.
Kernels are not serialised: `Runtime` links them from op types (the op registry, plus a
`resolve` callable the graph layer passes in for op types such as `fused_elementwise`).

Task kinds (OneFlow's actor kinds, on one rank):

| kind      | consumes              | produces               | does                      |
|-----------|-----------------------|------------------------|---------------------------|
| `source`  | -                     | a tick per instance    | starts a job instance     |
| `copy_in` | the source's tick     | the inputs (buffers)   | copies input arrays in    |
| `compute` | input registers       | its result tensors     | runs its chain of ops     |
| `copy_out`| compute registers     | a done tick            | hands the outputs over    |
| `tick`    | completions           | a tick                 | joins completions         |
| `sink`    | a tick                | -                      | notifies the caller       |

A register descriptor names its producer and consumers, its `register_num` (slots: 2 lets
the producer run one step ahead of its slowest consumer, 1 is lock-step), the tensors one
slot holds, and the bytes of one slot.  A tensor carries its memory block offset when memory
planning placed it (`mem`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .._core import dtype as dt
from .._core.codec import attr_text, decode, encode
from .._core.meta import TensorMeta


@dataclasses.dataclass
class TensorDesc:
    """One tensor of the plan: its meta and, when planned, (offset, nbytes) in the memory
    block of the compute task that produces it.  `root` says whose memory it may alias:
    'own' (a fresh array), 'input', 'variable', 'feed', 'constant' (a view of that kind)."""

    name: str
    shape: tuple[int, ...]  # this rank's piece (the whole tensor for a local one)
    dtype: str
    mem: tuple[int, int] | None = None
    root: str = "own"
    view: bool = False
    # A piece of a global tensor: the logical shape, and the (start, stop) per axis of the
    # logical tensor this rank holds (kernels read them from their context: random ops,
    # arange and reductions over a split axis compute the piece of the logical result).
    logical: tuple[int, ...] | None = None
    piece: tuple[tuple[int, int], ...] | None = None

    @property
    def meta(self) -> TensorMeta:
        return TensorMeta(tuple(self.shape), dt._by_name(self.dtype))

    @property
    def logical_meta(self) -> TensorMeta:
        shape = self.shape if self.logical is None else self.logical
        return TensorMeta(tuple(shape), dt._by_name(self.dtype))

    @property
    def slices(self) -> tuple[slice, ...]:
        """The piece as slices of the logical tensor (the whole tensor when local)."""
        if self.piece is None:
            return tuple(slice(0, n) for n in self.logical_meta.shape)
        return tuple(slice(a, b) for a, b in self.piece)

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * dt._by_name(self.dtype).itemsize


@dataclasses.dataclass
class OpDesc:
    """One op of a compute chain (a copy of the Job's OpNode without graph types).  It has
    the OpNode's fields, so a kernel resolver written for OpNodes accepts it."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict = dataclasses.field(default_factory=dict)
    scope: str = ""
    loc: tuple[str, int] | None = None

    def where(self) -> str:
        if self.loc is None:
            return "<unknown>"
        return f"{self.loc[0]}:{self.loc[1]}"


@dataclasses.dataclass
class RegisterDesc:
    id: int
    name: str
    producer: int  # task id
    consumers: tuple[int, ...]
    register_num: int = 1
    blobs: tuple[str, ...] = ()  # tensor names one slot holds, in order
    nbytes: int = 0  # bytes of one slot (planned buffers)
    # The input copy's register when the graph call's VM instruction already keeps the
    # caller's arrays unchanged until the step is done: slots hold references, no copy.
    by_ref: bool = False
    # The compute task whose memory block holds this register's planned tensors (their
    # offsets are the tensors' `mem`), or None.
    mem_block: str | None = None


@dataclasses.dataclass
class TaskDesc:
    id: int
    name: str
    kind: str  # source | copy_in | compute | boxing | copy_out | tick | sink
    stream: str  # host | copy | compute: what the task's work runs on
    thread: int  # the actor thread that runs it (0: the calling thread)
    consumed: tuple[int, ...] = ()  # register ids
    produced: tuple[int, ...] = ()
    ops: list[OpDesc] = dataclasses.field(default_factory=list)  # compute: the chain
    # compute: what the chain returns, in order (tensors other tasks read, the outputs)
    results: tuple[str, ...] = ()
    # compute: (variable name, value tensor, position): the value is written into the
    # variable where the Job placed the assign (after the chain's first `position` ops), or,
    # when ops after that point still read the variable's old value, after the last of them
    assigns: tuple[tuple[str, str, int], ...] = ()
    # compute: bytes of the memory block its planned tensors live in
    mem_bytes: int = 0
    # compute: the name of that block when tasks share one ('' : the task's own).  The tasks
    # of one step cut at boxing nodes share the step's block: its offsets were planned over
    # the whole step, and one piece at a time runs through them.
    block: str = ""


@dataclasses.dataclass
class Plan:
    name: str
    tasks: list[TaskDesc]
    registers: list[RegisterDesc]
    tensors: dict[str, TensorDesc]
    inputs: tuple[str, ...]  # tensor per input index
    outputs: tuple[str, ...]  # tensor per output index
    feeds: dict[str, str]  # feed key -> tensor
    variables: dict[str, str]  # tensor of a `variable` op -> variable name
    var_metas: dict[str, TensorMeta] = dataclasses.field(default_factory=dict)
    random_ops: tuple[str, ...] = ()  # ops that draw from the generator, in execution order
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    device: str = "cpu"  # device type of this rank's tasks

    # -- queries ---------------------------------------------------------------------------
    def task(self, name_or_id) -> TaskDesc:
        for t in self.tasks:
            if t.id == name_or_id or t.name == name_or_id:
                return t
        raise KeyError(name_or_id)

    def register(self, rid: int) -> RegisterDesc:
        return self.registers[rid]

    def threads(self) -> list[int]:
        return sorted({t.thread for t in self.tasks})

    # -- text ------------------------------------------------------------------------------
    def __str__(self) -> str:
        names = {t.id: t.name for t in self.tasks}
        n_ops = sum(len(t.ops) for t in self.tasks)
        lines = [f"Plan {self.name} ({len(self.tasks)} tasks, {len(self.registers)} registers, "
                 f"{n_ops} ops, threads {self.threads()}, device {self.device})",
                 f"  inputs: {', '.join(self.inputs) or '-'}; outputs: "
                 f"{', '.join(self.outputs) or '-'}; feeds: "
                 f"{', '.join(f'{k}={v}' for k, v in self.feeds.items()) or '-'}"]
        for t in self.tasks:
            ins = ", ".join(self.registers[r].name for r in t.consumed) or "-"
            outs = ", ".join(self.registers[r].name for r in t.produced) or "-"
            mem = f", block {t.mem_bytes} B" if t.mem_bytes else ""
            lines.append(f"  task {t.id} {t.name} [{t.kind}] stream={t.stream} "
                         f"thread={t.thread}: {ins} -> {outs}{mem}")
            for op in t.ops:
                outs_ = ", ".join(self._tensor_text(o) for o in op.outputs)
                attrs = ", ".join(f"{k}={attr_text(v)}" for k, v in op.attrs.items())
                lhs = f"{outs_} = " if outs_ else ""
                args = "; ".join(x for x in (", ".join(op.inputs), attrs) if x)
                lines.append(f"    {lhs}{op.op_type}({args})  # {op.name}")
            for var, value, pos in t.assigns:
                lines.append(f"    assign {var} <- {value} (after op {pos})")
        for r in self.registers:
            cons = ", ".join(names[c] for c in r.consumers) or "-"
            blobs = f" holds {', '.join(r.blobs)}" if r.blobs else ""
            ref = " (by reference)" if r.by_ref else ""
            ref += f" in block of {r.mem_block}" if r.mem_block else ""
            lines.append(f"  register {r.id} {r.name}: {names[r.producer]} -> {cons}, "
                         f"register_num={r.register_num}, {r.nbytes} B{ref}{blobs}")
        return "\n".join(lines)

    def _tensor_text(self, name: str) -> str:
        t = self.tensors[name]
        mem = f" @{t.mem[0]}" if t.mem is not None else ""
        whole = f" of {list(t.logical)}" if t.logical is not None else ""
        return f"{name}: {t.dtype}{list(t.shape)}{whole}{mem}"

    # -- serialisation ---------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({
            "name": self.name,
            "tasks": [{
                "id": t.id, "name": t.name, "kind": t.kind, "stream": t.stream,
                "thread": t.thread, "consumed": list(t.consumed), "produced": list(t.produced),
                "ops": [{"name": o.name, "op_type": o.op_type, "inputs": list(o.inputs),
                         "outputs": list(o.outputs),
                         "attrs": {k: encode(v) for k, v in o.attrs.items()},
                         "scope": o.scope, "loc": list(o.loc) if o.loc else None}
                        for o in t.ops],
                "results": list(t.results), "assigns": [list(a) for a in t.assigns],
                "mem_bytes": t.mem_bytes, "block": t.block} for t in self.tasks],
            "registers": [dataclasses.asdict(r) for r in self.registers],
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
                         "mem": list(t.mem) if t.mem is not None else None, "root": t.root,
                         "view": t.view,
                         "logical": list(t.logical) if t.logical is not None else None,
                         "piece": [list(p) for p in t.piece] if t.piece is not None else None}
                        for t in self.tensors.values()],
            "inputs": list(self.inputs), "outputs": list(self.outputs), "feeds": self.feeds,
            "variables": self.variables,
            "var_metas": {k: [list(m.shape), m.dtype.name] for k, m in self.var_metas.items()},
            "random_ops": list(self.random_ops),
            "stats": {k: encode(v) for k, v in self.stats.items()},
            "device": self.device,
        })

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        tasks = [TaskDesc(
            t["id"], t["name"], t["kind"], t["stream"], t["thread"], tuple(t["consumed"]),
            tuple(t["produced"]),
            [OpDesc(o["name"], o["op_type"], tuple(o["inputs"]), tuple(o["outputs"]),
                    {k: decode(v) for k, v in o["attrs"].items()}, o["scope"],
                    tuple(o["loc"]) if o["loc"] else None) for o in t["ops"]],
            tuple(t["results"]), tuple(tuple(a) for a in t["assigns"]), t["mem_bytes"],
            t.get("block", "")) for t in d["tasks"]]
        regs = [RegisterDesc(r["id"], r["name"], r["producer"], tuple(r["consumers"]),
                             r["register_num"], tuple(r["blobs"]), r["nbytes"],
                             r.get("by_ref", False), r.get("mem_block"))
                for r in d["registers"]]
        tensors = {t["name"]: TensorDesc(t["name"], tuple(t["shape"]), t["dtype"],
                                         tuple(t["mem"]) if t["mem"] is not None else None,
                                         t["root"], t["view"],
                                         tuple(t["logical"]) if t.get("logical") else None,
                                         tuple(map(tuple, t["piece"])) if t.get("piece")
                                         else None) for t in d["tensors"]}
        return cls(d["name"], tasks, regs, tensors, tuple(d["inputs"]), tuple(d["outputs"]),
                   dict(d["feeds"]), dict(d["variables"]),
                   {k: TensorMeta(tuple(s), dt._by_name(n))
                    for k, (s, n) in d["var_metas"].items()},
                   tuple(d["random_ops"]), {k: decode(v) for k, v in d["stats"].items()},
                   d["device"])
