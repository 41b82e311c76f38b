"""One-embedding ops: the lookup (id shuffle, gather from the store, embedding shuffle), the
gradient shuffle and the in-store updates, as OneFlow puts them into a Job
(`id_shuffle` + `embedding_lookup` + `embedding_shuffle`, `embedding_gradient_shuffle`,
`*_embedding_update`).

The store is state that lives outside any tensor (an index, a RAM cache, a file), so the
lookup and update ops reach it through a *handle*: the string attr `handle` names an object
registered with `register_handle` by `sbpflow.one_embedding` (this layer never imports it).
A handle offers:

    name, embedding_dim, storage_dim, world_size, num_tables
    dedup(keys) -> (uniq, first, inverse)      distinct keys in first-seen order
    owner(keys) -> ranks                       hash(key) % world_size
    gather(keys, table_ids) -> rows (n, embedding_dim)   distinct keys this rank owns;
                                               new keys are initialised (and inserted)
    update(keys, grads, rule)                  store.apply_update: one optimizer step

Static shapes, as OneFlow's: a batch of n ids on W ranks gives at most n distinct ids per
rank and at most n * W ids reaching one owner, so the plan tensors are padded to those sizes
and carry their valid length (`cur_rank_num_unique`, `num_unique_matrix`).

    one_embedding_lookup(shadow, ids, table_ids) ->
        embeddings (*ids.shape, D)                        float32
        num_unique_matrix (2, W)                          row 0: distinct ids this rank sends
                                                          to each rank; row 1: receives
        inverse_unique_partition_indices (n,)             each id's row among the sent ids
        cur_rank_num_unique ()                            C: distinct ids this rank owns
        cur_rank_unique_ids (n * W,)                      those ids (then -1)
        cur_rank_inverse_indices (n * W,)                 each received id's row among them
    one_embedding_gradient_shuffle(embedding_grad, num_unique_matrix,
        inverse_unique_partition_indices, cur_rank_num_unique, cur_rank_inverse_indices)
        -> cur_rank_unique_embedding_grad (n * W, D)      summed per owned id (then zeros)
    one_embedding_{sgd,momentum,adam,adagrad,ftrl}_update(
        cur_rank_unique_ids, cur_rank_num_unique, cur_rank_unique_embedding_grad, [...], lr)
        -> nothing: applies one optimizer step to the owned rows inside the store

`shadow` is the module's placeholder parameter: it makes the lookup differentiable (the
autograd pass differentiates toward trainable variables), and its own gradient is zero, as
in eager mode. The rows' gradient is the gradient shuffle's output, which the graph's
optimizer pass hands to the update op of the embedding's optimizer.

The same functions run the eager lookup (`shuffle_and_gather`) and the in-store rules
(`make_rule`), so a graph step and an eager step compute the same numbers in the same order.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from .. import comm as _comm
from .._core import dtype as dt
from .._core.errors import op_error
from .._core.meta import TensorMeta
from .registry import Attr, OpDef, Sample, op, register

# -- handles ----------------------------------------------------------------------------------
_HANDLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_STRONG: dict = {}  # built-in handles that nothing else keeps alive


def register_handle(key: str, obj) -> str:
    """Make `obj` reachable by ops whose `handle` attr is `key` (while obj lives)."""
    if key in _HANDLES and _HANDLES[key] is not obj:
        raise ValueError(f"one_embedding: handle {key!r} is taken by another store")
    _HANDLES[key] = obj
    return key


def get_handle(op: str, key: str):
    h = _HANDLES.get(key)
    if h is None:
        raise op_error(op, f"handle {key!r} names no live one-embedding store (the embedding "
                           "module was deleted, or the Job was loaded in another process)",
                       RuntimeError)
    return h


# -- the shared NumPy core ------------------------------------------------------------------------
class LookupPlan:
    """Where one lookup's ids went: what the backward and the update need."""

    __slots__ = ("uniq", "tids", "inverse", "order", "send", "recv", "cur_keys",
                 "cur_inverse", "rows")


def shuffle_and_gather(h, keys: np.ndarray, tids: np.ndarray) -> LookupPlan:
    """Deduplicate `keys`, send the distinct ones to their owners (all-to-all), gather the
    rows there and send them back (all-to-all). plan.rows: (len(uniq), D), uniq order."""
    p = LookupPlan()
    p.uniq, first, p.inverse = h.dedup(keys)
    p.tids = tids[first]
    nu = len(p.uniq)
    w = h.world_size
    if w == 1:
        p.order = np.arange(nu, dtype=np.int64)
        p.send = p.recv = np.array([nu], np.int64)
        p.cur_keys, p.cur_inverse = p.uniq, np.arange(nu, dtype=np.int64)
        p.rows = h.gather(p.uniq, p.tids)
        return p
    world = _comm.world()
    owner = h.owner(p.uniq)
    p.order = np.argsort(owner, kind="stable").astype(np.int64)
    p.send = np.bincount(owner, minlength=w).astype(np.int64)
    counts = world.all_to_all(p.send.reshape(-1, 1), send_sizes=[1] * w, recv_sizes=[1] * w)
    p.recv = counts.reshape(-1).astype(np.int64)
    req = np.stack([p.uniq[p.order], p.tids[p.order]], axis=1)
    got = world.all_to_all(req, send_sizes=p.send.tolist(), recv_sizes=p.recv.tolist())
    p.cur_keys, cfirst, p.cur_inverse = h.dedup(got[:, 0])
    rows = h.gather(p.cur_keys, got[cfirst, 1])[p.cur_inverse]
    back = world.all_to_all(np.ascontiguousarray(rows), send_sizes=p.recv.tolist(),
                            recv_sizes=p.send.tolist())
    p.rows = np.empty_like(back)
    p.rows[p.order] = back
    return p


def sum_rows(index: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """out[i] = sum of rows[j] with index[j] == i, added in j order from 0 (as a loop)."""
    out = np.zeros((n, rows.shape[1]), np.float32)
    np.add.at(out, index, rows.astype(np.float32, copy=False))
    return out


def _ftrl_step(w, acc, z, g, lr, lr_power, l1, l2, beta, init_acc):
    """FTRL-proximal, in place on NumPy arrays (acc holds the accumulator - init_acc)."""
    old = acc + init_acc
    new = old + g * g
    sigma = (np.power(new, -lr_power) - np.power(old, -lr_power)) / lr
    z += g - sigma * w
    acc += g * g
    denom = (beta + np.power(new, -lr_power)) / lr + l2
    w[...] = np.where(np.abs(z) > l1, -(z - np.sign(z) * l1) / denom, 0).astype(w.dtype)


ftrl_step = _ftrl_step

# kind -> (the update op's hyperparameter attrs, rows of state per key + 1)
RULES = {
    "sgd": ({"weight_decay": Attr("float", 0.0), "maximize": Attr("bool", False)}, 1),
    "momentum": ({"momentum": Attr("float"), "dampening": Attr("float", 0.0),
                  "nesterov": Attr("bool", False), "weight_decay": Attr("float", 0.0),
                  "maximize": Attr("bool", False)}, 2),
    "adam": ({"beta1": Attr("float", 0.9), "beta2": Attr("float", 0.999),
              "eps": Attr("float", 1e-8), "weight_decay": Attr("float", 0.0),
              "decoupled_weight_decay": Attr("bool", False), "amsgrad": Attr("bool", False),
              "maximize": Attr("bool", False)}, 3),
    "adagrad": ({"lr_decay": Attr("float", 0.0), "initial_accumulator_value": Attr("float", 0.0),
                 "eps": Attr("float", 1e-10), "weight_decay": Attr("float", 0.0),
                 "maximize": Attr("bool", False)}, 2),
    "ftrl": ({"lr_power": Attr("float", -0.5), "initial_accumulator_value": Attr("float", 0.1),
              "lambda1": Attr("float", 0.0), "lambda2": Attr("float", 0.0),
              "beta": Attr("float", 0.0), "weight_decay": Attr("float", 0.0)}, 3),
}
_RULE_NAMES = {"sgd": "SGD", "momentum": "SGD with momentum", "adam": "Adam",
               "adagrad": "Adagrad", "ftrl": "Ftrl"}


def make_rule(kind: str, hyper: dict, d: int, storage_dim: int, name: str):
    """The in-store update `rule(rows, g, step, lr)`: rows (n, storage_dim) in place, rows[:, :d]
    the embedding, then the states (momentum; Adam's m, v; Adagrad's sum; Ftrl's accumulator
    and z), all zero for a new key. Torch's formulas with float32 scalars."""
    if kind not in RULES:
        raise NotImplementedError(f"one_embedding {name!r}: no in-store rule {kind!r}; rules: "
                                  f"{', '.join(RULES)}")
    factor = RULES[kind][1]
    if storage_dim < factor * d:
        raise RuntimeError(
            f"one_embedding {name!r}: {_RULE_NAMES[kind]} keeps {factor - 1} state row(s) per "
            f"key and needs size_factor >= {factor}, but the store has storage_dim "
            f"{storage_dim} (embedding_dim {d})")
    f32 = np.float32
    wd = f32(hyper.get("weight_decay", 0.0))
    maximize = bool(hyper.get("maximize", False))
    if kind in ("sgd", "momentum"):
        m, damp = f32(hyper.get("momentum", 0.0)), f32(hyper.get("dampening", 0.0))
        nesterov = bool(hyper.get("nesterov", False))
        if m != 0 and damp != 0:
            raise NotImplementedError(
                f"one_embedding {name!r}: SGD with dampening is not offered (a row's first "
                "momentum step would need a per-row step count)")

        def sgd(rows, g, step, lr):
            lr = f32(lr)
            w = rows[:, :d]
            g = -g if maximize else g
            if wd != 0:
                g = g + wd * w
            if m != 0:
                buf = rows[:, d:2 * d]
                buf *= m
                buf += g
                g = g + m * buf if nesterov else buf
            w -= lr * g
        return sgd
    if kind == "adam":
        if hyper.get("amsgrad", False):
            raise NotImplementedError(f"one_embedding {name!r}: Adam(amsgrad=True) is not "
                                      "offered")
        b1, b2 = float(hyper["beta1"]), float(hyper["beta2"])
        eps = float(hyper["eps"])
        decoupled = bool(hyper.get("decoupled_weight_decay", False))

        def adam(rows, g, step, lr):
            lr = f32(lr)
            w, mom, var = rows[:, :d], rows[:, d:2 * d], rows[:, 2 * d:3 * d]
            g = -g if maximize else g
            if wd != 0:
                if decoupled:
                    w *= f32(1 - float(lr) * float(wd))
                else:
                    g = g + wd * w
            mom += (g - mom) * f32(1 - b1)
            var *= f32(b2)
            var += f32(1 - b2) * g * g
            bc1, bc2 = 1 - b1**step, 1 - b2**step
            denom = np.sqrt(var) / f32(math.sqrt(bc2)) + f32(eps)
            w -= f32(float(lr) / bc1) * mom / denom
        return adam
    if kind == "adagrad":
        lr_decay = float(hyper.get("lr_decay", 0.0))
        init_acc = f32(hyper.get("initial_accumulator_value", 0.0))
        eps = f32(hyper["eps"])

        def adagrad(rows, g, step, lr):
            lr = f32(lr)
            w, acc = rows[:, :d], rows[:, d:2 * d]  # acc: sum of squares - initial value
            g = -g if maximize else g
            if wd != 0:
                g = g + wd * w
            clr = f32(float(lr) / (1 + (step - 1) * lr_decay))
            acc += g * g
            w -= clr * g / (np.sqrt(acc + init_acc) + eps)
        return adagrad
    p = float(hyper["lr_power"])
    l1, l2, beta = (f32(hyper[k]) for k in ("lambda1", "lambda2", "beta"))
    init_acc = f32(hyper["initial_accumulator_value"])

    def ftrl(rows, g, step, lr):
        lr = f32(lr)
        w, acc, z = rows[:, :d], rows[:, d:2 * d], rows[:, 2 * d:3 * d]
        if wd != 0:
            g = g + wd * w
        _ftrl_step(w, acc, z, g, lr, p, l1, l2, beta, init_acc)
    return ftrl


# -- a built-in handle for the registry's samples ------------------------------------------------
def _dedup_np(keys):
    """(uniq in first-seen order, first, inverse) with NumPy (the store uses a hashed pass)."""
    keys = np.asarray(keys, np.int64).reshape(-1)
    u, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return u[order], first[order].astype(np.int64), rank[inv.reshape(-1)].astype(np.int64)


def sample_rows(keys, d: int) -> np.ndarray:
    """The rows of the sample table: sin(0.01 * key + 0.1 * column), a pure function."""
    return np.sin(np.asarray(keys, np.float64)[:, None] * 0.01
                  + 0.1 * np.arange(d)).astype(np.float32)


class SampleTable:
    """A stateless table for the op registry's samples: rows are `sample_rows(key)`; updates
    are counted, not kept (so every sample sees the same rows in any test order)."""

    name, embedding_dim, storage_dim, world_size, num_tables = "sample", 3, 9, 1, 2

    def __init__(self):
        self.updates = 0

    dedup = staticmethod(_dedup_np)

    def owner(self, keys):
        return np.zeros(len(keys), np.int64)

    def gather(self, keys, table_ids):
        return sample_rows(keys, self.embedding_dim)

    def update(self, keys, grads, rule):
        rows = np.zeros((len(keys), self.storage_dim), np.float32)
        rows[:, :self.embedding_dim] = self.gather(keys, None)
        rule(rows, grads, 1)
        self.updates += 1


_STRONG["sample"] = SampleTable()
register_handle("sample", _STRONG["sample"])


# -- the lookup ---------------------------------------------------------------------------------
_LOOKUP_OUT = ("embeddings", "num_unique_matrix", "inverse_unique_partition_indices",
               "cur_rank_num_unique", "cur_rank_unique_ids", "cur_rank_inverse_indices")


def _lookup_meta(shadow, ids, table_ids, handle, embedding_dim, world_size):
    name = "one_embedding_lookup"
    if ids.dtype not in (dt.int32, dt.int64):
        raise op_error(name, f"ids must be int32 or int64, got {ids.dtype.name}", TypeError)
    if table_ids.dtype.is_floating_point or table_ids.dtype is dt.bool_:
        raise op_error(name, f"table_ids must be an integer tensor, got "
                             f"{table_ids.dtype.name}", TypeError)
    if table_ids.shape != ids.shape:
        raise op_error(name, f"table_ids shape {list(table_ids.shape)} must equal ids shape "
                             f"{list(ids.shape)}")
    if embedding_dim <= 0 or world_size <= 0:
        raise op_error(name, f"embedding_dim and world_size must be > 0, got {embedding_dim} "
                             f"and {world_size}")
    n = math.prod(ids.shape)
    i64 = dt.int64
    return (TensorMeta(tuple(ids.shape) + (embedding_dim,), dt.float32),
            TensorMeta((2, world_size), i64), TensorMeta((n,), i64), TensorMeta((), i64),
            TensorMeta((n * world_size,), i64), TensorMeta((n * world_size,), i64))


def _host_arrays(ctx, *arrays):
    return [np.asarray(ctx.prims.to_host(a)) for a in arrays]


def _lookup_kernel(ctx, shadow, ids, table_ids, handle, embedding_dim, world_size):
    name = "one_embedding_lookup"
    h = get_handle(name, handle)
    if h.embedding_dim != embedding_dim or h.world_size != world_size:
        raise op_error(name, f"the store {h.name!r} has embedding_dim {h.embedding_dim} on "
                             f"{h.world_size} rank(s); the op was built for {embedding_dim} "
                             f"on {world_size}", RuntimeError)
    ids, table_ids = _host_arrays(ctx, ids, table_ids)
    keys = ids.astype(np.int64).reshape(-1)
    tids = table_ids.astype(np.int64).reshape(-1)
    if len(keys) and keys.min() < 0:
        raise op_error(name, f"ids must be non-negative, got {int(keys.min())} (store "
                             f"{h.name!r})", ValueError)
    bad = (tids < 0) | (tids >= h.num_tables)
    if bad.any():
        raise op_error(name, f"table_ids must be in [0, {h.num_tables}), got "
                             f"{int(tids[bad][0])} (store {h.name!r})", IndexError)
    p = shuffle_and_gather(h, keys, tids)
    n, w = len(keys), world_size
    emb = p.rows[p.inverse].reshape(ids.shape + (embedding_dim,))
    rank_of = np.empty(len(p.order), np.int64)
    rank_of[p.order] = np.arange(len(p.order))
    cur_ids = np.full(n * w, -1, np.int64)
    cur_ids[: len(p.cur_keys)] = p.cur_keys
    cur_inv = np.full(n * w, -1, np.int64)
    cur_inv[: len(p.cur_inverse)] = p.cur_inverse
    outs = (emb, np.stack([p.send, p.recv]), rank_of[p.inverse],
            np.array(len(p.cur_keys), np.int64), cur_ids, cur_inv)
    return tuple(ctx.prims.from_host(a, m.dtype) for a, m in zip(outs, ctx.out_metas))


def _lookup_grad(ctx, g_emb, *_):
    """Rows' gradients go to their owners (the gradient shuffle, which the optimizer pass
    hands to the update); the placeholder parameter's own gradient is zero, as in eager."""
    op("one_embedding_gradient_shuffle", g_emb, ctx.output(1), ctx.output(2), ctx.output(3),
       ctx.output(5))
    # zeros made from the gradient, so they live where it does (a global gradient gives a
    # global zero; a sum, so an empty batch works too); the shadow is (1,) float32
    zero = (g_emb.sum() * 0.0).reshape(1)
    return (zero, None, None)


def _torch_lookup(torch, shadow, ids, table_ids, handle, embedding_dim, world_size):
    """The sample table's lookup in torch (one rank): first-seen dedup with a dict."""
    keys = ids.reshape(-1).tolist()
    pos: dict = {}
    inverse = [pos.setdefault(k, len(pos)) for k in keys]
    uniq = list(pos)
    n, nu = len(keys), len(uniq)
    cols = torch.arange(embedding_dim, dtype=torch.float64) * 0.1
    rows = torch.sin(torch.tensor(uniq, dtype=torch.float64)[:, None] * 0.01 + cols).float()
    inv = torch.tensor(inverse, dtype=torch.int64)
    emb = rows[inv].reshape(tuple(ids.shape) + (embedding_dim,)) + 0 * shadow.sum()
    pad = torch.full((n - nu,), -1, dtype=torch.int64)
    return (emb, torch.tensor([[nu], [nu]]), inv, torch.tensor(nu),
            torch.cat([torch.tensor(uniq, dtype=torch.int64), pad]),
            torch.cat([torch.arange(nu), pad]))


def _lookup_samples(rng):
    ids = np.array([[5, 17, 5], [900, 17, 3]], np.int64)
    tids = np.array([[0, 1, 0], [1, 1, 0]], np.int64)
    s = np.zeros(1, np.float32)
    return [Sample(s, ids, tids, handle="sample", embedding_dim=3, world_size=1),
            Sample(s, ids[0].astype(np.int32), tids[0], handle="sample", embedding_dim=3,
                   world_size=1)]


register(OpDef(
    "one_embedding_lookup", inputs=("shadow", "ids", "table_ids"), outputs=_LOOKUP_OUT,
    attrs={"handle": Attr("str"), "embedding_dim": Attr("int"), "world_size": Attr("int", 1)},
    infer_meta=_lookup_meta, kernel=_lookup_kernel, grad=_lookup_grad,
    saves=("num_unique_matrix", "inverse_unique_partition_indices", "cur_rank_num_unique",
           "cur_rank_inverse_indices"),
    reference=_torch_lookup, samples=_lookup_samples,
    doc="Dedup ids, id shuffle (all-to-all), gather rows from the store (new keys "
        "initialised), embedding shuffle (all-to-all) back to the ids' order."))


# -- the gradient shuffle -------------------------------------------------------------------
def _gshuffle_meta(g, matrix, ipi, cur_num, cur_inv):
    name = "one_embedding_gradient_shuffle"
    if g.dtype is not dt.float32 or len(g.shape) < 1:
        raise op_error(name, f"embedding_grad must be float32 (..., D), got "
                             f"{g.dtype.name}{list(g.shape)}", TypeError)
    if len(matrix.shape) != 2 or matrix.shape[0] != 2:
        raise op_error(name, f"num_unique_matrix must be (2, world_size), got "
                             f"{list(matrix.shape)}")
    n = math.prod(g.shape[:-1])
    w = matrix.shape[1]
    if ipi.shape != (n,) or cur_inv.shape != (n * w,) or cur_num.shape != ():
        raise op_error(name, f"plan shapes {list(ipi.shape)}, {list(cur_num.shape)}, "
                             f"{list(cur_inv.shape)} do not fit {n} ids on {w} rank(s)")
    return TensorMeta((n * w, g.shape[-1]), dt.float32)


def _gshuffle_kernel(ctx, g, matrix, ipi, cur_num, cur_inv):
    g, matrix, ipi, cur_num, cur_inv = _host_arrays(ctx, g, matrix, ipi, cur_num, cur_inv)
    d = g.shape[-1]
    g = g.reshape(-1, d)
    send, recv = matrix[0], matrix[1]
    w = len(send)
    sent = sum_rows(ipi, g, int(send.sum()))  # per distinct id, in owner order
    if w == 1:
        got = sent
    else:
        got = _comm.world().all_to_all(sent, send_sizes=send.tolist(), recv_sizes=recv.tolist())
    c = int(cur_num)
    out = np.zeros((len(g) * w, d), np.float32)
    out[:c] = sum_rows(cur_inv[: len(got)], got, c)
    return ctx.prims.from_host(out, dt.float32)


def _torch_gshuffle(torch, g, matrix, ipi, cur_num, cur_inv):
    d = g.shape[-1]
    g = g.reshape(-1, d).float()
    nu = int(matrix[0].sum())
    sent = torch.zeros(nu, d).index_add_(0, ipi, g)
    c = int(cur_num)
    out = torch.zeros(g.shape[0], d)
    out[:c] = torch.zeros(c, d).index_add_(0, cur_inv[:nu], sent)
    return out


def _gshuffle_samples(rng):
    ids = np.array([4, 9, 4, 4, 2, 9], np.int64)
    _, _, inv = _dedup_np(ids)
    pad = np.full(3, -1, np.int64)
    return [Sample(rng.standard_normal((2, 3, 4)).astype(np.float32), np.array([[3], [3]]),
                   inv, np.array(3), np.concatenate([np.arange(3), pad]), grad=False)]


register(OpDef(
    "one_embedding_gradient_shuffle",
    inputs=("embedding_grad", "num_unique_matrix", "inverse_unique_partition_indices",
            "cur_rank_num_unique", "cur_rank_inverse_indices"),
    outputs=("cur_rank_unique_embedding_grad",),
    infer_meta=_gshuffle_meta, kernel=_gshuffle_kernel, reference=_torch_gshuffle,
    samples=_gshuffle_samples,
    doc="Sum the ids' gradient rows per distinct id, send them to the owners (all-to-all), "
        "sum there per owned id."))


# -- the in-store updates ---------------------------------------------------------------------
def _update_meta(kind):
    name = f"one_embedding_{kind}_update"

    def meta(*metas, handle, **hyper):
        if len(metas) < 4 or (len(metas) - 1) % 3:
            raise op_error(name, "takes (cur_rank_unique_ids, cur_rank_num_unique, "
                                 "cur_rank_unique_embedding_grad) per lookup, then lr; got "
                                 f"{len(metas)} tensors")
        for k in range(0, len(metas) - 1, 3):
            ids, num, g = metas[k:k + 3]
            if (ids.dtype is not dt.int64 or num.shape != () or g.dtype is not dt.float32
                    or len(g.shape) != 2 or g.shape[0] != ids.shape[0]):
                raise op_error(name, f"lookup {k // 3}: expected int64 ids (m,), a 0-d count "
                                     f"and float32 grads (m, D), got {ids}, {num}, {g}")
        if metas[-1].shape != ():
            raise op_error(name, f"lr must be a 0-d tensor, got {list(metas[-1].shape)}")
        return ()
    return meta


def _update_kernel(kind):
    name = f"one_embedding_{kind}_update"

    def kernel(ctx, tensors, handle, **hyper):
        h = get_handle(name, handle)
        arrays = _host_arrays(ctx, *tensors)
        lr = float(arrays[-1].reshape(()))
        keys, grads = [], []
        for k in range(0, len(arrays) - 1, 3):
            ids, num, g = arrays[k:k + 3]
            c = int(num)
            keys.append(ids[:c])
            grads.append(g[:c])
        if len(keys) == 1:
            keys, grads = keys[0], grads[0]
        else:  # several lookups of one table in a step: one update of their distinct ids
            uniq, _, inverse = h.dedup(np.concatenate(keys))
            grads = sum_rows(inverse, np.concatenate(grads), len(uniq))
            keys = uniq
        if grads.shape[1] != h.embedding_dim:
            raise op_error(name, f"grads have {grads.shape[1]} columns, the store "
                                 f"{h.name!r} has embedding_dim {h.embedding_dim}")
        rule = make_rule(kind, hyper, h.embedding_dim, h.storage_dim, h.name)
        h.update(np.ascontiguousarray(keys, np.int64), grads,
                 lambda rows, g, step: rule(rows, g, step, lr))
        return ()
    return kernel


def _torch_nothing(torch, *args, **kwargs):
    return ()


def _update_samples(kind):
    def samples(rng):
        pad = np.full(2, -1, np.int64)
        hyper = {"momentum": {"momentum": 0.9}}.get(kind, {})
        return [Sample([np.concatenate([np.array([7, 3], np.int64), pad]), np.array(2),
                        rng.standard_normal((4, 3)).astype(np.float32), np.array(0.1)],
                       handle="sample", grad=False, **hyper)]
    return samples


for _kind, (_attrs, _) in RULES.items():
    register(OpDef(
        f"one_embedding_{_kind}_update", inputs=("*tensors",), outputs=(),
        attrs={"handle": Attr("str"), **_attrs},
        infer_meta=_update_meta(_kind), kernel=_update_kernel(_kind),
        reference=_torch_nothing, samples=_update_samples(_kind),
        doc=f"One {_RULE_NAMES[_kind]} step on the owned rows, inside the store (an effect: "
            "no outputs)."))
