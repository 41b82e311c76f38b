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
- Inside `nn.Graph.build()` the lookup is the registered op `one_embedding_lookup` (dedup,
  id shuffle, gather, embedding shuffle), its backward `one_embedding_gradient_shuffle`, and
  the graph's optimizer pass adds `one_embedding_<rule>_update`, which applies the same rule
  inside the store (sbpflow/ops/embedding.py); the ops reach the store through a handle
  named by the op's `handle` attr. Graph and eager steps share the store and compute the same
  numbers, so training may switch between them.
"""

from __future__ import annotations

import itertools
import os
import weakref

import numpy as np

from .. import comm as _comm
from .._core import dtype as _dt
from ..autograd import grad_mode
from ..autograd.function import Function
from ..framework.functional.creation import arange as _arange
from ..framework.functional.creation import tensor as _tensor
from ..framework.functional.creation import zeros as _zeros
from ..framework.generator import initial_seed as _initial_seed
from ..framework.parameter import Parameter
from ..nn.modules.module import Module
from ..ops import embedding as _ops_emb
from ..ops import registry as _registry
from ..optim import SGD, Adagrad, Adam, AdamW
from ..optim.optimizer import (
    Optimizer,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from ._hash import dedup, owner_of, sum_rows_into
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
# The rules' math lives in ops/embedding.py (`make_rule`), shared with the graph's update ops.
def rule_of(optimizer, group: dict, name: str) -> tuple[str, dict]:
    """(rule kind, hyperparameters) of an optimizer's param group, as the update ops take
    them: sgd, momentum, adam, adagrad or ftrl."""
    if isinstance(optimizer, SGD):
        if float(group.get("momentum", 0.0)) != 0:
            return "momentum", {k: group.get(k, v) for k, v in (
                ("momentum", 0.0), ("dampening", 0.0), ("nesterov", False),
                ("weight_decay", 0.0), ("maximize", False))}
        return "sgd", {"weight_decay": group.get("weight_decay", 0.0),
                       "maximize": group.get("maximize", False)}
    if isinstance(optimizer, (Adam, AdamW)):
        b1, b2 = (float(b) for b in group["betas"])
        return "adam", {"beta1": b1, "beta2": b2, "eps": float(group["eps"]),
                        "weight_decay": group.get("weight_decay", 0.0),
                        "decoupled_weight_decay": isinstance(optimizer, AdamW) or bool(
                            group.get("decoupled_weight_decay", False)),
                        "amsgrad": bool(group.get("amsgrad", False)),
                        "maximize": bool(group.get("maximize", False))}
    if isinstance(optimizer, Adagrad):
        return "adagrad", {k: group.get(k, v) for k, v in (
            ("lr_decay", 0.0), ("initial_accumulator_value", 0.0), ("eps", 1e-10),
            ("weight_decay", 0.0), ("maximize", False))}
    if isinstance(optimizer, Ftrl):
        return "ftrl", {k: group[k] for k in (
            "lr_power", "initial_accumulator_value", "lambda1", "lambda2", "beta",
            "weight_decay")}
    raise NotImplementedError(
        f"one_embedding {name!r}: the optimizer {type(optimizer).__name__} is not offered "
        "inside the store; use SGD, Adam, AdamW, Adagrad or one_embedding.Ftrl")


def _rule_for(optimizer, group: dict, d: int, storage_dim: int, name: str):
    kind, hyper = rule_of(optimizer, group, name)
    rule = _ops_emb.make_rule(kind, hyper, d, storage_dim, name)
    lr = group["lr"]
    lr = float(lr.item() if hasattr(lr, "item") else lr)
    return lambda rows, g, step: rule(rows, g, step, lr)


_ftrl_step = _ops_emb.ftrl_step


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
        # The graph's lookup and update ops reach the store through this handle (by name).
        self._handle = _StoreHandle(self)
        _ops_emb.register_handle(self._handle.key, self._handle)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    # -- snapshots --------------------------------------------------------------------------
    def save_snapshot(self, snapshot_name: str) -> None:
        """Save every row and the optimizer state to persistent_path/rank-N/snapshots/<name>
        (atomically: a crash mid-save leaves an older snapshot of that name loadable)."""
        self.store.save_snapshot(snapshot_name, {"rank": self.rank,
                                                 "world_size": self.world_size})

    def load_snapshot(self, snapshot_name: str) -> None:
        """Restore the rows and optimizer state saved by save_snapshot(snapshot_name).

        Every rank checks its whole snapshot first (length, CRC, dims, dtype, rank count);
        the ranks then agree, and the table is replaced on all of them or on none: a refused
        load leaves the live table as it was. Every rank must call it (SPMD)."""
        checked, error = None, None
        try:
            checked = self.store.check_snapshot(snapshot_name)
            self._check_header(snapshot_name, checked.header)
        except Exception as e:  # reported after the ranks agree: a lone raise would hang them
            error = e
        try:
            if self.world_size > 1:
                ok = _comm.world().all_gather(np.array([error is None], np.int32))
                refused = np.flatnonzero(ok == 0).tolist()
                if refused and error is None:
                    raise SnapshotError(
                        f"one_embedding {self.name!r}: snapshot {snapshot_name!r} was refused "
                        f"on rank(s) {refused} (their error says why); no rank loaded it, "
                        "the table is unchanged")
            if error is not None:
                raise error
            self.store.replace(checked)
        finally:
            if checked is not None:
                checked.close()
        self._pending.clear()

    def _check_header(self, snapshot_name: str, header: dict) -> None:
        saved = header.get("world_size", self.world_size)  # older snapshots: unchecked
        if saved != self.world_size:
            raise SnapshotError(f"one_embedding {self.name!r}: snapshot {snapshot_name!r} was "
                                f"saved by {saved} ranks, this job has {self.world_size} "
                                "(keys are sharded by rank count)")
        rank = header.get("rank", self.rank)
        if rank != self.rank:
            raise SnapshotError(f"one_embedding {self.name!r}: snapshot {snapshot_name!r} in "
                                f"{self.store.path!r} was saved by rank {rank}, this is rank "
                                f"{self.rank} (each rank holds the keys it owns)")

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
            return self._lazy_forward(ids, table_ids)
        keys, tids = self._check(ids, table_ids)
        plan = _ops_emb.shuffle_and_gather(self._handle, keys, tids)
        rows = plan.rows[plan.inverse].reshape(tuple(ids.shape) + (self.embedding_dim,))
        return _Lookup.apply(self.shadow, self, plan, rows)

    def _lazy_forward(self, ids, table_ids):
        """Inside nn.Graph.build(): the op one_embedding_lookup in the Job (ids are checked
        for sign and table range when the graph runs)."""
        from ..framework.tensor import Tensor

        if ids.dtype != self.key_type:
            raise TypeError(f"one_embedding {self.name!r}: ids must have dtype key_type "
                            f"{self.key_type}, got {ids.dtype}")
        shape = tuple(ids.shape)
        if table_ids is None:
            tids = _zeros(shape, dtype=_dt.int64)
            if self.num_tables > 1:
                if len(shape) != 2 or shape[1] != self.num_tables:
                    raise ValueError(
                        f"one_embedding {self.name!r}: with {self.num_tables} tables, pass "
                        f"table_ids or ids of shape (batch, {self.num_tables}); got ids of "
                        f"shape {shape}")
                tids = tids + _arange(self.num_tables, dtype=_dt.int64)
        else:
            if not isinstance(table_ids, Tensor) or table_ids.dtype.is_floating_point:
                raise TypeError(f"one_embedding {self.name!r}: table_ids must be an integer "
                                "Tensor")
            if tuple(table_ids.shape) != shape:
                raise ValueError(f"one_embedding {self.name!r}: table_ids shape "
                                 f"{tuple(table_ids.shape)} must equal ids shape {shape}")
            tids = table_ids
        outs = _registry.op("one_embedding_lookup", self.shadow, ids, tids,
                            handle=self._handle.key, embedding_dim=self.embedding_dim,
                            world_size=self.world_size)
        return outs[0]

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


_handle_ids = itertools.count()


class _StoreHandle:
    """What the one-embedding ops see of an embedding (the protocol in ops/embedding.py)."""

    def __init__(self, emb: Embedding):
        self.key = f"{emb.name}#{next(_handle_ids)}"
        self.name, self.embedding_dim = emb.name, emb.embedding_dim
        self.world_size, self.num_tables = emb.world_size, emb.num_tables
        self.store = emb.store
        self.storage_dim = emb.store.storage_dim

    dedup = staticmethod(dedup)

    def owner(self, keys: np.ndarray) -> np.ndarray:
        return owner_of(keys, self.world_size)

    def gather(self, keys: np.ndarray, table_ids: np.ndarray) -> np.ndarray:
        return self.store.lookup(keys, table_ids)

    def update(self, keys: np.ndarray, grads: np.ndarray, rule) -> None:
        self.store.apply_update(keys, grads, rule)


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
