"""One-embedding: embedding tables bigger than memory, keyed by arbitrary int ids, sharded
over ranks, cached in RAM over an on-disk store, with the optimizer applied inside the store.
OneFlow's `oneflow.one_embedding` API.

    tables = [make_table_options(make_uniform_initializer(low=-0.1, high=0.1))] * 3
    store = make_cached_ssd_store_options(cache_budget_mb=64, persistent_path=path,
                                          capacity=10**6, size_factor=3)
    emb = MultiTableEmbedding("emb", 16, flow.float, flow.int64, tables, store)
    opt = flow.optim.Adam(emb.parameters(), lr=1e-3)   # the update runs in the store
    y = emb(ids)                  # ids (batch, 3): column j is looked up in table j
    loss(y).backward(); opt.step()

How it fits together (see `store.py` for one rank's store):

- As in OneFlow, the module has one placeholder parameter (`shadow`); the regular optimizer
  given `emb.parameters()` names the update rule and its hyperparameters. A global optimizer
  step hook (torch's `register_optimizer_step_post_hook`) applies that rule to the rows
  touched since the last step, inside the store: SGD (momentum, nesterov, weight decay),
  Adam/AdamW, Adagrad, and `one_embedding.Ftrl`. `size_factor` must leave room for the
  rule's state (SGD 1, momentum 2, Adagrad 2, Adam 3, Ftrl 3). Updates are sparse: only rows
  in the batch change, as torch's sparse embedding updates (for Adam: `SparseAdam`); the
  step counter (bias correction, learning-rate decay) counts optimizer steps.
- The lookup is an autograd `Function`: forward deduplicates the ids, backward sums the
  gradient rows of each distinct id and hands them to the owning store, applied at step.
- Ids are keys of one key space shared by the tables (as OneFlow: give the tables disjoint
  ids); a key's table only picks the initializer used when the key is first seen. The
  initial row is a function of (seed, key) only, so it is the same on any rank count.
- Sharding: with several ranks, each key lives on rank `hash(key) % world_size`. A lookup
  sends its distinct ids to their owners (all-to-all), the owners gather rows and send them
  back (all-to-all); backward sends the gradient rows to the owners the same way, where
  they are summed over ranks (the gradient of the sum of the ranks' losses). Every rank must
  call forward, backward and step the same number of times (SPMD).
- Eager only: inside `nn.Graph` the lookup raises NotImplementedError.
"""

from __future__ import annotations

import math
import os
import weakref

import numpy as np

from .. import comm as _comm
from .._core import dtype as _dt
from ..autograd import grad_mode
from ..autograd.function import Function
from ..framework.functional.creation import tensor as _tensor
from ..framework.functional.creation import zeros as _zeros
from ..framework.generator import initial_seed as _initial_seed
from ..framework.parameter import Parameter
from ..nn.modules.module import Module
from ..optim import SGD, Adagrad, Adam, AdamW
from ..optim.optimizer import (
    Optimizer,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from ._hash import dedup, sum_rows_into
from .store import EmbeddingStore, SnapshotError

__all__ = [
    "Ftrl", "MultiTableEmbedding", "MultiTableMultiColumnEmbedding", "SnapshotError",
    "make_cached_host_mem_store_options", "make_cached_ssd_store_options",
    "make_column_options", "make_device_mem_store_options", "make_normal_initializer",
    "make_table", "make_table_options", "make_uniform_initializer",
]


# -- option builders (OneFlow's dicts) ------------------------------------------------------
def make_uniform_initializer(low, high) -> dict:
    """An initializer drawing each value uniformly from [low, high)."""
    return {"type": "uniform", "low": low, "high": high}


def make_normal_initializer(mean, std) -> dict:
    """An initializer drawing each value from N(mean, std^2)."""
    return {"type": "normal", "mean": mean, "std": std}


def make_column_options(initializer) -> dict:
    return {"initializer": initializer}


def make_table_options(param) -> dict:
    """A table: an initializer, or a list of column options (MultiTableMultiColumnEmbedding)."""
    if isinstance(param, dict):
        return {"initializer": param}
    if isinstance(param, (list, tuple)):
        return {"columns": list(param)}
    raise ValueError("make_table_options: param must be an initializer (dict) or a list of "
                     f"column options, got {type(param).__name__}")


def make_table(param) -> dict:
    """Alias of make_table_options."""
    return make_table_options(param)


def _store(caches, persistent_path, capacity, size_factor, physical_block_size,
           storage_dim=-1) -> dict:
    if not isinstance(persistent_path, (str, list, tuple)):
        raise TypeError("one_embedding: persistent_path must be a str or a list of str (one per "
                        f"rank), got {type(persistent_path).__name__}")
    if int(size_factor) < 1:
        raise ValueError(f"one_embedding: size_factor must be >= 1, got {size_factor}")
    if physical_block_size not in (512, 4096):
        raise ValueError("one_embedding: physical_block_size must be 512 or 4096, got "
                         f"{physical_block_size}")
    return {"kv_store": {"caches": caches,
                         "persistent_table": {"path": persistent_path,
                                              "physical_block_size": physical_block_size,
                                              "capacity_hint": int(capacity or 0)}},
            "size_factor": int(size_factor), "storage_dim": int(storage_dim)}


def make_device_mem_store_options(persistent_path, capacity, size_factor=1,
                                  physical_block_size=512) -> dict:
    """Every row in memory ("full" cache of `capacity` rows), persisted at snapshots."""
    if capacity is None or capacity <= 0:
        raise ValueError(f"one_embedding: capacity must be > 0, got {capacity}")
    caches = [{"policy": "full", "capacity": int(capacity), "value_memory_kind": "device"}]
    return _store(caches, persistent_path, capacity, size_factor, physical_block_size)


def make_cached_ssd_store_options(cache_budget_mb, persistent_path, capacity=None,
                                  size_factor=1, storage_dim=-1, physical_block_size=4096,
                                  host_cache_budget_mb=0) -> dict:
    """Rows on disk under an LRU cache of cache_budget_mb (+ host_cache_budget_mb: on this
    CPU build both tiers are RAM, so the budgets add up)."""
    if not (cache_budget_mb > 0 or host_cache_budget_mb > 0):
        raise ValueError("one_embedding: cache_budget_mb or host_cache_budget_mb must be > 0, "
                         f"got {cache_budget_mb} and {host_cache_budget_mb}")
    if capacity is not None and capacity <= 0:
        raise ValueError(f"one_embedding: capacity must be > 0, got {capacity}")
    caches = []
    if cache_budget_mb > 0:
        caches.append({"policy": "lru", "cache_memory_budget_mb": cache_budget_mb,
                       "value_memory_kind": "device"})
    if host_cache_budget_mb > 0:
        caches.append({"policy": "lru", "cache_memory_budget_mb": host_cache_budget_mb,
                       "value_memory_kind": "host"})
    return _store(caches, persistent_path, capacity, size_factor, physical_block_size,
                  storage_dim)


def make_cached_host_mem_store_options(cache_budget_mb, persistent_path, capacity,
                                       size_factor=1, storage_dim=-1,
                                       physical_block_size=4096) -> dict:
    """An LRU cache over a "full" host tier of `capacity` rows (all RAM on this build)."""
    if cache_budget_mb <= 0 or capacity is None or capacity <= 0:
        raise ValueError("one_embedding: cache_budget_mb and capacity must be > 0, got "
                         f"{cache_budget_mb} and {capacity}")
    caches = [{"policy": "lru", "cache_memory_budget_mb": cache_budget_mb,
               "value_memory_kind": "device"},
              {"policy": "full", "capacity": int(capacity), "value_memory_kind": "host"}]
    return _store(caches, persistent_path, capacity, size_factor, physical_block_size,
                  storage_dim)


def _check_initializer(init, where: str) -> dict:
    if not isinstance(init, dict) or init.get("type") not in ("uniform", "normal"):
        raise ValueError(f"one_embedding: {where} must be made by make_uniform_initializer or "
                         f"make_normal_initializer, got {init!r}")
    need = ("low", "high") if init["type"] == "uniform" else ("mean", "std")
    for k in need:
        if k not in init:
            raise ValueError(f"one_embedding: {where} ({init['type']}) lacks {k!r}")
    return init


# -- the in-store optimizer rules -----------------------------------------------------------
# Each rule updates rows (n, storage_dim) in place: rows[:, :d] is the embedding, then states.
def _rule_for(optimizer, group: dict, d: int, storage_dim: int, name: str):
    def need(factor: int, what: str):
        if storage_dim < factor * d:
            raise RuntimeError(
                f"one_embedding {name!r}: {what} keeps {factor - 1} state row(s) per key and "
                f"needs size_factor >= {factor}, but the store has storage_dim {storage_dim} "
                f"(embedding_dim {d})")

    f32 = np.float32
    lr = f32(group["lr"])
    wd = f32(group.get("weight_decay", 0.0))
    if isinstance(optimizer, SGD):
        m, damp = f32(group.get("momentum", 0.0)), f32(group.get("dampening", 0.0))
        nesterov, maximize = group.get("nesterov", False), group.get("maximize", False)
        if m != 0:
            need(2, "SGD with momentum")
            if damp != 0:
                raise NotImplementedError(
                    f"one_embedding {name!r}: SGD with dampening is not offered (a row's first "
                    "momentum step would need a per-row step count)")

        def sgd(rows, g, step):
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
    if isinstance(optimizer, (Adam, AdamW)):
        need(3, type(optimizer).__name__)
        if group.get("amsgrad", False):
            raise NotImplementedError(f"one_embedding {name!r}: Adam(amsgrad=True) is not "
                                      "offered")
        b1, b2 = (float(b) for b in group["betas"])
        eps, maximize = float(group["eps"]), group.get("maximize", False)
        decoupled = isinstance(optimizer, AdamW) or group.get("decoupled_weight_decay", False)

        def adam(rows, g, step):
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
    if isinstance(optimizer, Adagrad):
        need(2, "Adagrad")
        lr_decay, init_acc = float(group.get("lr_decay", 0.0)), f32(
            group.get("initial_accumulator_value", 0.0))
        eps, maximize = f32(group["eps"]), group.get("maximize", False)

        def adagrad(rows, g, step):
            w, acc = rows[:, :d], rows[:, d:2 * d]  # acc: sum of squares - initial value
            g = -g if maximize else g
            if wd != 0:
                g = g + wd * w
            clr = f32(float(lr) / (1 + (step - 1) * lr_decay))
            acc += g * g
            w -= clr * g / (np.sqrt(acc + init_acc) + eps)
        return adagrad
    if isinstance(optimizer, Ftrl):
        need(3, "Ftrl")
        p = float(group["lr_power"])
        l1, l2, beta = (f32(group[k]) for k in ("lambda1", "lambda2", "beta"))
        init_acc = f32(group["initial_accumulator_value"])

        def ftrl(rows, g, step):
            w, acc, z = rows[:, :d], rows[:, d:2 * d], rows[:, 2 * d:3 * d]
            if wd != 0:
                g = g + wd * w
            _ftrl_step(w, acc, z, g, lr, p, l1, l2, beta, init_acc)
        return ftrl
    raise NotImplementedError(
        f"one_embedding {name!r}: the optimizer {type(optimizer).__name__} is not offered "
        "inside the store; use SGD, Adam, AdamW, Adagrad or one_embedding.Ftrl")


def _ftrl_step(w, acc, z, g, lr, lr_power, l1, l2, beta, init_acc):
    """FTRL-proximal, in place on NumPy arrays (acc holds the accumulator - init_acc)."""
    old = acc + init_acc
    new = old + g * g
    sigma = (np.power(new, -lr_power) - np.power(old, -lr_power)) / lr
    z += g - sigma * w
    acc += g * g
    denom = (beta + np.power(new, -lr_power)) / lr + l2
    w[...] = np.where(np.abs(z) > l1, -(z - np.sign(z) * l1) / denom, 0).astype(w.dtype)


class Ftrl(Optimizer):
    """FTRL-proximal (OneFlow's one_embedding.Ftrl): on one-embedding parameters the update
    runs in the store; on ordinary parameters it runs here.

        n' = n + g^2;  sigma = (n'^-lr_power - n^-lr_power) / lr;  z += g - sigma * w
        w = 0 if |z| <= lambda1 else -(z - sign(z) lambda1) / ((beta + n'^-lr_power) / lr
            + lambda2)
    """

    def __init__(self, params, lr: float = 0.001, weight_decay: float = 0.0,
                 lr_power: float = -0.5, initial_accumulator_value: float = 0.1,
                 lambda1: float = 0.0, lambda2: float = 0.0, beta: float = 0.0):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, lr_power=lr_power,
                                      initial_accumulator_value=initial_accumulator_value,
                                      lambda1=lambda1, lambda2=lambda2, beta=beta))

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with grad_mode.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or _embedding_of(p) is not None:
                    continue  # a one-embedding's placeholder: the store applies the rule
                st = self.state[p]
                if not st:
                    st["accumulate"] = np.zeros(p.shape, np.float32)
                    st["z"] = np.zeros(p.shape, np.float32)
                w = p.detach().numpy().astype(np.float32)
                g = p.grad.numpy().astype(np.float32)
                if group["weight_decay"]:
                    g = g + np.float32(group["weight_decay"]) * w
                _ftrl_step(w, st["accumulate"], st["z"], g, np.float32(group["lr"]),
                           float(group["lr_power"]), np.float32(group["lambda1"]),
                           np.float32(group["lambda2"]), np.float32(group["beta"]),
                           np.float32(group["initial_accumulator_value"]))
                p.copy_(_tensor(w, dtype=p.dtype))
        return loss


# -- the step hooks: pending gradients -> store updates -------------------------------------
_SHADOWS: dict[int, weakref.ref] = {}  # id(shadow parameter) -> its embedding module


def _forget(key: int):
    def drop(ref) -> None:  # the embedding died; a newer one may hold the same id by now
        if _SHADOWS.get(key) is ref:
            del _SHADOWS[key]
    return drop


def _embedding_of(p):
    """The live embedding whose placeholder parameter is `p`, or None (ids are reused)."""
    ref = _SHADOWS.get(id(p))
    emb = ref() if ref is not None else None
    return emb if emb is not None and emb.shadow is p else None


def _embeddings_of(optimizer):
    for group in optimizer.param_groups:
        for p in group["params"]:
            emb = _embedding_of(p)
            if emb is not None:
                yield emb, group


def _before_step(optimizer, args, kwargs):
    for emb, _ in _embeddings_of(optimizer):
        if emb.shadow.grad is None:  # zero_grad(set_to_none) since the last backward
            emb._pending.clear()


def _after_step(optimizer, args, kwargs):
    for emb, group in _embeddings_of(optimizer):
        emb._apply_pending(optimizer, group)


register_optimizer_step_pre_hook(_before_step)
register_optimizer_step_post_hook(_after_step)


# -- the lookup -----------------------------------------------------------------------------
def _sum_rows(inverse: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """out[i] = sum of rows[j] with inverse[j] == i (in j order): one numba pass."""
    out = np.zeros((n, rows.shape[1]), np.float32)
    sum_rows_into(out, np.ascontiguousarray(inverse, np.int64),
                  np.ascontiguousarray(rows, np.float32))
    return out


class _Lookup(Function):
    @staticmethod
    def forward(ctx, shadow, emb, plan, rows):
        ctx.emb, ctx.plan = emb, plan
        return _tensor(rows)

    @staticmethod
    def backward(ctx, grad):
        g = grad.numpy().reshape(-1, ctx.emb.embedding_dim).astype(np.float32, copy=False)
        ctx.emb._backward(ctx.plan, g)
        return _zeros(1), None, None, None


class _Plan:
    """What a lookup's backward needs: the distinct ids and where they went."""

    __slots__ = ("uniq", "tids", "inverse", "order", "send", "recv", "shape")


class Embedding(Module):
    """The base of MultiTableEmbedding and MultiTableMultiColumnEmbedding."""

    def __init__(self, name, embedding_dim, dtype, key_type, tables, store_options,
                 default_initializer=None):
        super().__init__()
        if dtype not in (_dt.float32,):
            raise NotImplementedError(f"one_embedding {name!r}: dtype {dtype} is not offered "
                                      "(float32 only)")
        if key_type not in (_dt.int32, _dt.int64):
            raise TypeError(f"one_embedding {name!r}: key_type must be int32 or int64, got "
                            f"{key_type}")
        dims = list(embedding_dim) if isinstance(embedding_dim, (list, tuple)) else [
            embedding_dim]
        if not dims or any(not isinstance(c, int) or c <= 0 for c in dims):
            raise ValueError(f"one_embedding {name!r}: embedding_dim must be a positive int or "
                             f"a list of them, got {embedding_dim!r}")
        self.name, self.dtype, self.key_type = name, dtype, key_type
        self.embedding_dim = sum(dims)
        self.column_dims = dims
        bounds = np.cumsum([0] + dims)
        default = _check_initializer(
            default_initializer or make_normal_initializer(0.0, 0.05), "default_initializer")
        if tables is None:
            tables = [make_table_options(default)]
        if not isinstance(tables, (list, tuple)) or not tables:
            raise ValueError(f"one_embedding {name!r}: tables must be a non-empty list of "
                             "make_table_options(...)")
        columns = []
        for t, table in enumerate(tables):
            if "columns" in table:
                cols = table["columns"]
                if len(cols) != len(dims):
                    raise ValueError(f"one_embedding {name!r}: table {t} has {len(cols)} "
                                     f"columns, embedding_dim lists {len(dims)}")
                inits = [_check_initializer(c.get("initializer"), f"table {t} column {j}")
                         for j, c in enumerate(cols)]
            else:
                inits = [_check_initializer(table.get("initializer"), f"table {t}")] * len(dims)
            columns.append([(int(bounds[j]), int(bounds[j + 1]), init)
                            for j, init in enumerate(inits)])
        self.num_tables = len(tables)
        self.store_options = store_options
        self.rank, self.world_size = _comm.get_rank(), _comm.get_world_size()
        storage_dim = int(store_options.get("storage_dim", -1))
        if storage_dim <= 0:
            storage_dim = int(store_options["size_factor"]) * self.embedding_dim
        kv = store_options["kv_store"]
        table_opts = kv["persistent_table"]
        path = table_opts["path"]
        if isinstance(path, (list, tuple)):
            if len(path) != self.world_size:
                raise ValueError(f"one_embedding {name!r}: persistent_path lists {len(path)} "
                                 f"paths for {self.world_size} ranks")
            path = path[self.rank]
        else:
            path = os.path.join(path, f"rank-{self.rank}")
        row_bytes = 4 * storage_dim + 17  # the row, its slot, tick and dirty flag
        lines = 0
        for cache in kv["caches"]:
            if cache["policy"] == "full":
                lines += -(-int(cache["capacity"]) // self.world_size)
            else:
                lines += int(float(cache["cache_memory_budget_mb"]) * 2**20) // row_bytes
        seed = np.array([_initial_seed() & (2**63 - 1)], np.int64)
        if self.world_size > 1:  # every rank initialises keys alike
            _comm.world().broadcast(seed, root=0)
        self.store = EmbeddingStore(
            path, self.embedding_dim, storage_dim, lines, columns, int(seed[0]),
            table_opts.get("physical_block_size", 4096),
            table_opts.get("capacity_hint", 0) // self.world_size)
        self.shadow = Parameter(_zeros(1))
        _SHADOWS[id(self.shadow)] = weakref.ref(self, _forget(id(self.shadow)))
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    # -- snapshots --------------------------------------------------------------------------
    def save_snapshot(self, snapshot_name: str) -> None:
        """Save every row and the optimizer state to persistent_path/rank-N/snapshots/<name>
        (atomically: a crash mid-save leaves an older snapshot of that name loadable)."""
        self.store.save_snapshot(snapshot_name, {"rank": self.rank,
                                                 "world_size": self.world_size})

    def load_snapshot(self, snapshot_name: str) -> None:
        """Restore the rows and optimizer state saved by save_snapshot(snapshot_name)."""
        header = self.store.load_snapshot(snapshot_name)
        if header.get("world_size", self.world_size) != self.world_size:
            raise SnapshotError(f"one_embedding {self.name!r}: snapshot {snapshot_name!r} was "
                                f"saved by {header['world_size']} ranks, this job has "
                                f"{self.world_size} (keys are sharded by rank count)")
        self._pending.clear()

    # -- forward ----------------------------------------------------------------------------
    def _check(self, ids, table_ids):
        from ..framework.tensor import Tensor

        if not isinstance(ids, Tensor):
            raise TypeError(f"one_embedding {self.name!r}: ids must be a Tensor, got "
                            f"{type(ids).__name__}")
        if ids.dtype != self.key_type:
            raise TypeError(f"one_embedding {self.name!r}: ids must have dtype key_type "
                            f"{self.key_type}, got {ids.dtype}")
        keys = ids.numpy().astype(np.int64).reshape(-1)
        if len(keys) and keys.min() < 0:
            raise ValueError(f"one_embedding {self.name!r}: ids must be non-negative, got "
                             f"{int(keys.min())}")
        if table_ids is None:
            if self.num_tables == 1:
                tids = np.zeros(len(keys), np.int64)
            elif ids.dim() == 2 and ids.shape[1] == self.num_tables:
                tids = np.tile(np.arange(self.num_tables), ids.shape[0])
            else:
                raise ValueError(
                    f"one_embedding {self.name!r}: with {self.num_tables} tables, pass "
                    f"table_ids or ids of shape (batch, {self.num_tables}); got ids of shape "
                    f"{tuple(ids.shape)}")
        else:
            if not isinstance(table_ids, Tensor) or table_ids.dtype.is_floating_point:
                raise TypeError(f"one_embedding {self.name!r}: table_ids must be an integer "
                                "Tensor")
            if tuple(table_ids.shape) != tuple(ids.shape):
                raise ValueError(f"one_embedding {self.name!r}: table_ids shape "
                                 f"{tuple(table_ids.shape)} must equal ids shape "
                                 f"{tuple(ids.shape)}")
            tids = table_ids.numpy().astype(np.int64).reshape(-1)
            bad = (tids < 0) | (tids >= self.num_tables)
            if bad.any():
                raise IndexError(f"one_embedding {self.name!r}: table_ids must be in [0, "
                                 f"{self.num_tables}), got {int(tids[bad][0])}")
        return keys, tids

    def forward(self, ids, table_ids=None):
        """Look up ids (any shape) -> (*ids.shape, embedding_dim). table_ids (same shape)
        names each id's table; it may be left out with one table, or when ids is
        (batch, num_tables) and column j belongs to table j."""
        if getattr(ids, "is_lazy", False):
            raise NotImplementedError(f"one_embedding {self.name!r}: lookups inside nn.Graph "
                                      "are not offered yet; call the module eagerly")
        keys, tids = self._check(ids, table_ids)
        plan = _Plan()
        plan.shape = tuple(ids.shape) + (self.embedding_dim,)
        uniq, first, inverse = dedup(keys)
        plan.uniq, plan.tids, plan.inverse = uniq, tids[first], inverse
        rows = self._gather(plan)[plan.inverse].reshape(plan.shape)
        return _Lookup.apply(self.shadow, self, plan, rows)

    def _gather(self, plan) -> np.ndarray:
        if self.world_size == 1:
            return self.store.lookup(plan.uniq, plan.tids)
        world = _comm.world()
        owner = _hash_owner(plan.uniq, self.world_size)
        plan.order = np.argsort(owner, kind="stable")
        plan.send = np.bincount(owner, minlength=self.world_size).astype(np.int64)
        counts = world.all_to_all(plan.send.reshape(-1, 1), send_sizes=[1] * self.world_size,
                                  recv_sizes=[1] * self.world_size)
        plan.recv = counts.reshape(-1).astype(np.int64)
        req = np.stack([plan.uniq[plan.order], plan.tids[plan.order]], axis=1)
        got = world.all_to_all(req, send_sizes=plan.send.tolist(),
                               recv_sizes=plan.recv.tolist())
        keys, first, inv = dedup(got[:, 0])
        rows = self.store.lookup(keys, got[first, 1])[inv]
        back = world.all_to_all(np.ascontiguousarray(rows), send_sizes=plan.recv.tolist(),
                                recv_sizes=plan.send.tolist())
        out = np.empty_like(back)
        out[plan.order] = back
        return out

    # -- backward and step ------------------------------------------------------------------
    def _backward(self, plan, g: np.ndarray) -> None:
        grads = _sum_rows(plan.inverse, g, len(plan.uniq))
        if self.world_size == 1:
            self._pending.append((plan.uniq, grads))
            return
        world = _comm.world()
        got_g = world.all_to_all(np.ascontiguousarray(grads[plan.order]),
                                 send_sizes=plan.send.tolist(), recv_sizes=plan.recv.tolist())
        got_k = world.all_to_all(plan.uniq[plan.order], send_sizes=plan.send.tolist(),
                                 recv_sizes=plan.recv.tolist())
        self._pending.append((got_k, got_g))

    def _apply_pending(self, optimizer, group) -> None:
        if not self._pending:
            return
        if len(self._pending) == 1 and self.world_size == 1:
            uniq, grads = self._pending[0]  # one backward on one rank: ids already distinct
        else:
            keys = np.concatenate([k for k, _ in self._pending])
            uniq, _, inverse = dedup(keys)
            grads = _sum_rows(inverse,
                              np.concatenate([g for _, g in self._pending]), len(uniq))
        self._pending.clear()
        rule = _rule_for(optimizer, group, self.embedding_dim, self.store.storage_dim,
                         self.name)
        self.store.apply_update(uniq, grads, rule)

    def extra_repr(self) -> str:
        return (f"name={self.name!r}, embedding_dim={self.embedding_dim}, "
                f"num_tables={self.num_tables}, storage_dim={self.store.storage_dim}")


def _hash_owner(keys, world_size):
    from ._hash import owner_of

    return owner_of(keys, world_size)


class MultiTableEmbedding(Embedding):
    """Several tables of one embedding_dim, dtype and key_type in one key-value store."""

    def __init__(self, name, embedding_dim, dtype, key_type, tables, store_options,
                 default_initializer=None):
        if not isinstance(embedding_dim, int):
            raise TypeError(f"MultiTableEmbedding: embedding_dim must be an int, got "
                            f"{type(embedding_dim).__name__}")
        super().__init__(name, embedding_dim, dtype, key_type, tables, store_options,
                         default_initializer)


class MultiTableMultiColumnEmbedding(Embedding):
    """Tables whose rows are several columns (embedding_dim a list), each column with its own
    initializer; a lookup returns the columns concatenated (sum(embedding_dim) wide)."""

    def __init__(self, name, embedding_dim, dtype, key_type, tables, store_options,
                 default_initializer=None):
        super().__init__(name, embedding_dim, dtype, key_type, tables, store_options,
                         default_initializer)
