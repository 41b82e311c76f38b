"""Plan agreement: before a Job's first run on several ranks, the ranks check that they traced
the same Job (DESIGN.md, "Graphs across ranks", step 4).

`agree(job)` gathers every rank's `fingerprint(job)`: one small collective per compiled plan.
Where the hashes differ, the ranks exchange their `entries(job)` and raise, on every rank, one
RuntimeError naming the first op where each rank differs from rank 0, on both sides. Every
rank sees the same gathered table, so every rank takes the same branch: a mismatch fails the
ranks together within seconds and never leaves one waiting for the others.

What is compared (`entries`): each op's type and attrs, the logical meta, placement and nd-SBP
of its inputs and outputs, and which earlier op's output each input is (by position, not by
tensor name); the variables (name, meta, trainable); the loss and gradient tensors; the config
flags. What is left out: `loc` (shown in the message, never compared), op and tensor names
(counters that say nothing the positions do not), memory offsets and pass statistics (per
rank), the Job's name (a per-process counter), object addresses and absolute paths in attr and
config strings (they differ between processes and machines), and the rank itself.

The rank enters a Job through placements only: a graph of local tensors on several ranks is
each rank's own SPMD program (graph/trace.py), its tensors stamped with that rank's `cpu[r]`
but marked local (`LogicalTensor.is_global` False), and read as "local" here; a global
tensor reads with its placement, which is the same on every rank (a pipeline stage on cpu[1]
is cpu[1] everywhere), and its logical shape; a local tensor with its dtype and number of axes
only (pieces and SPMD batches differ in length), bar a variable's, whose shape is compared.
Each rank also reads its Job with its own one-rank placement read as "local" ("spmd", for
Jobs built without the marker, e.g. by hand); the ranks agree when either reading is the same
on every rank, and an op agrees when either reading of it does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import NamedTuple

import numpy as np

from .. import comm as _comm
from .._core.codec import attr_text
from .ir import Job

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")  # reprs of objects
_PATH = re.compile(r"(?<![\w.~-])/[\w.+~-]+(?:/[\w.+~-]*)*")  # an absolute POSIX path


class Entry(NamedTuple):
    """One compared item of a Job: an op, or (after the ops) one item of its header.

    `literal` and `spmd` are the two readings compared across ranks (see the module doc);
    `what` names it ("m.fc-matmul-12", the op's name, or "variable m.fc.weight", "config
    allow_fuse_add_to_output"); `index` is the op's position, -1 for a header item; `loc` is
    an op's user line ("file:line", "" if unknown), never compared."""

    literal: str
    spmd: str
    what: str
    index: int
    loc: str


def entries(job: Job, rank: int | None = None) -> list[Entry]:
    """What `fingerprints` hashes, item by item: every op in order, then the header (each
    variable, the loss and gradient tensors, each config flag).  `rank` (default: this
    process's) is the one whose one-rank placement the spmd reading calls local."""
    own = [_comm.get_rank() if rank is None else rank]
    ref = {}  # tensor name -> "%<op index>", or "%<op index>.<output index>"
    out = []
    for i, op in enumerate(job.ops):
        attrs = ", ".join(f"{k}={_attr_text(op.attrs[k])}" for k in sorted(op.attrs))
        texts = []
        for mine in (None, own):  # literal, spmd
            ins = ", ".join(f"{ref.get(x, '%?')} {_tensor_text(job, x, mine)}"
                            for x in op.inputs)
            state = op.op_type == "variable"  # a variable's shape is the model's: compared
            outs = ", ".join(_tensor_text(job, x, mine, state) for x in op.outputs)
            texts.append(f"{op.op_type}({ins}{'; ' + attrs if attrs else ''})"
                         f"{' -> ' + outs if outs else ''}")
        out.append(Entry(texts[0], texts[1], op.name, i, _where(op.loc)))
        many = len(op.outputs) > 1
        for j, x in enumerate(op.outputs):
            ref[x] = f"%{i}.{j}" if many else f"%{i}"
    header = [(f"variable {v.name}", f"{v.meta.dtype.name}{list(v.meta.shape)}"
               f"{' trainable' if v.trainable else ''}")
              for v in sorted(job.variables.values(), key=lambda v: v.name)]
    header.append(("loss", ", ".join(ref.get(x, "%?") for x in job.loss) or "(none)"))
    header.append(("gradients", ", ".join(f"{k}: {ref.get(x, '%?')}"
                                          for k, x in sorted(job.grads.items())) or "(none)"))
    header += [(f"config {k}", _attr_text(job.config[k])) for k in sorted(job.config)]
    out += [Entry(f"{what} = {text}", f"{what} = {text}", what, -1, "")
            for what, text in header]
    return out


def fingerprints(job: Job, rank: int | None = None) -> tuple[int, int]:
    """(literal, spmd): the Job's two 8-byte hashes, as signed ints (see the module doc)."""
    items = entries(job, rank)
    return (_hash(e.literal for e in items), _hash(e.spmd for e in items))


def fingerprint(job: Job) -> int:
    """The Job's hash as written: the same on every rank, and in every process, for the same
    program (whatever its file paths, line numbers and temporary directories)."""
    return fingerprints(job)[0]


def agree(job: Job, world=None, name: str | None = None) -> None:
    """Check that every rank of `world` (default: `sbpflow.comm.control()`) traced the same
    Job; raise the same RuntimeError on every rank where one did not.  Collective: every rank
    of `world` calls it for the same plan.  Nothing to do on one process."""
    world = _comm.control() if world is None else world
    if world.size == 1:
        return
    table = world.all_gather(np.array([fingerprints(job, world.rank)], np.int64))
    if (table[:, 0] == table[0, 0]).all() or (table[:, 1] == table[0, 1]).all():
        return
    # The hashes are the fast path; the entries decide. (A Job mixing local tensors with
    # global ones on a single rank agrees op by op, in one reading or the other, but in
    # neither reading as a whole.)
    per_rank = _exchange(world, entries(job, world.rank))
    pairs = []
    for r, theirs in enumerate(per_rank[1:], 1):
        k = _first_difference(per_rank[0], theirs)
        if k is not None:
            pairs.append(f"rank 0 {_say(per_rank[0], *k)}, rank {r} {_say(theirs, *k)}")
    if pairs:
        name = job.name if name is None else name
        raise RuntimeError(
            f"nn.Graph {name}: the ranks traced different graphs:\n  " + "\n  ".join(pairs)
            + "\n  Every rank must trace the same build() on inputs of the same shapes, "
            "dtypes, placements and SBPs, with the same config.")


# -- the mismatch report ------------------------------------------------------------------------
def _exchange(world, items: list[Entry]) -> list[list[Entry]]:
    """Every rank's entries, to every rank: the byte lengths first, then the bytes."""
    mine = np.frombuffer(json.dumps([list(e) for e in items]).encode(), np.uint8)
    sizes = [int(n) for n in world.all_gather(np.array([mine.size], np.int64))]
    everyone = world.all_gather(mine, sizes=sizes)
    out, start = [], 0
    for n in sizes:
        out.append([Entry(*e) for e in json.loads(everyone[start:start + n].tobytes())])
        start += n
    return out


def _n_ops(items: list[Entry]) -> int:
    return sum(1 for e in items if e.index >= 0)


def _first_difference(a: list[Entry], b: list[Entry]) -> tuple[int, bool] | None:
    """(position, is an op) of the first entry where two ranks differ in both readings: an op,
    else (the ops agreeing) the shorter Job's end, else a header item."""
    n_a, n_b = _n_ops(a), _n_ops(b)
    for k in range(min(n_a, n_b)):
        if a[k].literal != b[k].literal and a[k].spmd != b[k].spmd:
            return k, True
    if n_a != n_b:
        return min(n_a, n_b), True
    for k in range(n_a, min(len(a), len(b))):
        if a[k].literal != b[k].literal:  # header items read the same both ways
            return k, False
    return (min(len(a), len(b)), False) if len(a) != len(b) else None


def _say(items: list[Entry], k: int, is_op: bool) -> str:
    """What one rank has at position k: "op k (name) is <op> at <file:line>", the end of its
    ops, or a header item."""
    n = _n_ops(items)
    if is_op and k >= n:
        return f"has no op {k} (its Job ends after {n} ops)"
    if k >= len(items):
        return "has nothing more after its ops, variables and config"
    e = items[k]
    if not is_op:
        return f"has {e.spmd}"
    return f"op {k} ({e.what}) is {e.spmd}" + (f" at {e.loc}" if e.loc else "")


# -- texts --------------------------------------------------------------------------------------
def _tensor_text(job: Job, name: str, own: list | None, whole: bool = False) -> str:
    t = job.tensors.get(name)
    if t is None:
        return "?"
    text = f"{t.dtype.name}{list(t.shape)} ({', '.join(map(repr, t.sbp))})"
    p = t.placement
    if not t.is_global:
        # A local tensor is each rank's own, whatever rank stamped it, and so is its shape:
        # a rank's piece from to_local(), or its own batch in an SPMD program, may differ in
        # length; its dtype and number of axes may not.  A variable's shape is compared.
        if not whole:
            text = f"{t.dtype.name}[{', '.join('?' * len(t.shape))}] (local)"
        return text if p.type == "cpu" else f"{text} on {p.type}"
    return f"{text} on {p.type}{p.ranks}"  # global: the same placement on every rank


def _attr_text(v) -> str:
    if isinstance(v, np.ndarray):  # a folded constant: its bytes, by digest
        digest = hashlib.blake2b(np.ascontiguousarray(v).tobytes(), digest_size=8).hexdigest()
        return f"array({v.dtype}{list(v.shape)} #{digest})"
    return _PATH.sub("<path>", _ADDRESS.sub("", attr_text(v)))


def _where(loc) -> str:
    if not loc:
        return ""
    file, line = loc
    rel = os.path.relpath(file) if os.path.isabs(file) else file
    return f"{file if rel.startswith('..') else rel}:{line}"


def _hash(texts) -> int:
    h = hashlib.blake2b(digest_size=8)
    for text in texts:
        h.update(text.encode())
        h.update(b"\n")
    return int.from_bytes(h.digest(), "little", signed=True)
