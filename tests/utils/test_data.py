"""utils.data against torch 2.13: datasets, samplers, collation, DataLoader (with workers)."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import torch
import torch.utils.data as tdata

import sbpflow as flow
from sbpflow.utils import data as fdata


def _to_np(x):
    """A batch structure with tensors (either framework) replaced by NumPy arrays."""
    if isinstance(x, (flow.Tensor, torch.Tensor)):
        return x.detach().numpy()
    if isinstance(x, dict):
        return {k: _to_np(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_to_np(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_to_np(v) for v in x)
    return x


def _assert_same(ours, theirs, where="batch"):
    """Same structure, container types, dtypes and values."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, flow.Tensor), f"{where}: {type(ours)} is not a Tensor"
        assert ours.dtype.name == str(theirs.dtype).replace("torch.", ""), where
        assert tuple(ours.shape) == tuple(theirs.shape), where
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=where)
    elif isinstance(theirs, dict):
        assert type(ours) is type(theirs) and list(ours) == list(theirs), where
        for k in theirs:
            _assert_same(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, where


def _xy(n=10):
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    y = np.arange(n, dtype=np.int64) * 10
    return x, y


# -- datasets ---------------------------------------------------------------------------------
def test_tensor_dataset_and_subset_and_concat():
    x, y = _xy()
    ours = fdata.TensorDataset(flow.tensor(x), flow.tensor(y))
    theirs = tdata.TensorDataset(torch.tensor(x), torch.tensor(y))
    assert len(ours) == len(theirs) == 10
    for i in (0, 3, -1):
        _assert_same(ours[i], theirs[i], f"item {i}")
    with pytest.raises(AssertionError, match="Size mismatch"):
        fdata.TensorDataset(flow.tensor(x), flow.tensor(y[:5]))
    fsub, tsub = fdata.Subset(ours, [7, 2, 2]), tdata.Subset(theirs, [7, 2, 2])
    assert len(fsub) == 3
    _assert_same(fsub[0], tsub[0])
    _assert_same(fsub.__getitems__([1, 2]), tsub.__getitems__([1, 2]))
    a, b = list(range(3)), list(range(10, 15))
    fcat, tcat = fdata.ConcatDataset([a, b]), tdata.ConcatDataset([a, b])
    assert len(fcat) == len(tcat) == 8
    assert [fcat[i] for i in range(-8, 8)] == [tcat[i] for i in range(-8, 8)]
    assert fcat.cumulative_sizes == tcat.cumulative_sizes
    with pytest.raises(ValueError, match="should not exceed dataset length"):
        fcat[-9]


def test_dataset_add_and_stack_dataset():
    class Squares(fdata.Dataset):
        def __init__(self, n):
            self.n = n

        def __getitem__(self, i):
            return i * i

        def __len__(self):
            return self.n

    both = Squares(3) + Squares(2)
    assert isinstance(both, fdata.ConcatDataset) and [both[i] for i in range(5)] == [
        0, 1, 4, 0, 1]
    stacked = fdata.StackDataset(a=Squares(3), b=list("xyz"))
    assert stacked[2] == {"a": 4, "b": "z"} and len(stacked) == 3
    with pytest.raises(ValueError, match="Size mismatch"):
        fdata.StackDataset(Squares(3), Squares(4))


@pytest.mark.parametrize("lengths", [[3, 8], [0.3, 0.7], [0.2, 0.2, 0.6], [0.33, 0.33, 0.34],
                                     [1, 1, 1, 8]])
def test_random_split_sizes_match_torch(lengths):
    n = 11
    ours = fdata.random_split(list(range(n)), lengths, generator=flow.Generator().manual_seed(0))
    theirs = tdata.random_split(list(range(n)), lengths, torch.Generator().manual_seed(0))
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert sorted(i for s in ours for i in s) == list(range(n))  # disjoint, covering


def test_random_split_is_seeded():
    split = lambda seed: [list(s) for s in fdata.random_split(  # noqa: E731
        range(20), [0.5, 0.5], generator=flow.Generator().manual_seed(seed))]
    assert split(1) == split(1)
    assert split(1) != split(2)
    with pytest.raises(ValueError, match="Sum of input lengths"):
        fdata.random_split(range(5), [2, 2])
    flow.manual_seed(5)
    first = [list(s) for s in fdata.random_split(range(20), [10, 10])]
    flow.manual_seed(5)
    assert [list(s) for s in fdata.random_split(range(20), [10, 10])] == first


# -- samplers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n,replicas,drop_last", [(10, 3, False), (10, 3, True), (10, 4, False),
                                                  (12, 4, True), (2, 5, False), (7, 7, True),
                                                  (5, 2, True), (0, 2, False)])
def test_distributed_sampler_matches_torch(n, replicas, drop_last):
    dataset = list(range(n))
    total = []
    for rank in range(replicas):
        ours = fdata.DistributedSampler(dataset, replicas, rank, shuffle=False,
                                        drop_last=drop_last)
        theirs = tdata.DistributedSampler(dataset, replicas, rank, shuffle=False,
                                          drop_last=drop_last)
        assert list(ours) == list(theirs), f"rank {rank}"
        assert len(ours) == len(theirs)
        total += list(ours)
    if not drop_last and n:
        assert set(total) == set(dataset)


def test_distributed_sampler_shuffle():
    dataset = list(range(23))
    epochs = []
    for epoch in range(2):
        parts = []
        for rank in range(3):
            s = fdata.DistributedSampler(dataset, 3, rank, shuffle=True, seed=7)
            s.set_epoch(epoch)
            parts.append(list(s))
            assert list(s) == parts[-1]  # the same order every pass within an epoch
        assert [len(p) for p in parts] == [8, 8, 8]
        assert set().union(*parts) == set(dataset)
        epochs.append(parts)
    assert epochs[0] != epochs[1]
    with pytest.raises(ValueError, match="Invalid rank 3"):
        fdata.DistributedSampler(dataset, 3, 3)


def test_sequential_batch_and_random_samplers():
    data = list(range(10))
    assert list(fdata.SequentialSampler(data)) == list(tdata.SequentialSampler(data))
    for bs, drop in [(3, False), (3, True), (5, True), (20, False)]:
        ours = fdata.BatchSampler(fdata.SequentialSampler(data), bs, drop)
        theirs = tdata.BatchSampler(tdata.SequentialSampler(data), bs, drop)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
    g = flow.Generator().manual_seed(3)
    perm = list(fdata.RandomSampler(data, generator=g))
    assert sorted(perm) == data and perm != data
    g.manual_seed(3)
    assert list(fdata.RandomSampler(data, generator=g)) == perm
    long = list(fdata.RandomSampler(data, num_samples=25, generator=g))
    assert len(long) == 25 and sorted(long[:10]) == data and sorted(long[10:20]) == data
    drawn = list(fdata.RandomSampler(data, replacement=True, num_samples=70, generator=g))
    assert len(drawn) == 70 and set(drawn) <= set(data) and len(set(drawn)) > 5
    sub = list(fdata.SubsetRandomSampler([5, 6, 7], generator=g))
    assert sorted(sub) == [5, 6, 7]
    with pytest.raises(ValueError, match="num_samples should be a positive integer"):
        fdata.RandomSampler(data, num_samples=0)
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        fdata.BatchSampler(data, 0, False)


# -- collation --------------------------------------------------------------------------------
Point = collections.namedtuple("Point", "x y")


def _samples(lib):
    t = (lambda a: flow.tensor(a)) if lib is flow else (lambda a: torch.tensor(a))
    return [
        {"img": t(np.full((2, 3), i, np.float32)), "label": i, "w": 0.5 * i, "name": f"s{i}",
         "arr": np.arange(3, dtype=np.int16) + i, "flag": bool(i % 2),
         "pair": (np.float64(i), np.int32(i)), "pt": Point(i, [i, i + 1])}
        for i in range(4)
    ]


def test_default_collate_matches_torch():
    _assert_same(fdata.default_collate(_samples(flow)), tdata.default_collate(_samples(torch)))


def test_default_collate_errors():
    with pytest.raises(RuntimeError, match="equal size"):
        fdata.default_collate([[1, 2], [3]])
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        fdata.default_collate([object(), object()])
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        fdata.default_collate([np.array(["a"]), np.array(["b"])])


def test_default_convert_matches_torch():
    sample = {"a": np.ones((2, 2), np.float32), "b": (np.int64(3), "x"), "c": [np.zeros(1)]}
    _assert_same(fdata.default_convert(sample), tdata.default_convert(sample))


# -- DataLoader -------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size,drop_last", [(4, False), (4, True), (1, False),
                                                  (None, False)])
def test_dataloader_sequential_matches_torch(batch_size, drop_last):
    x, y = _xy()
    ours = fdata.DataLoader(fdata.TensorDataset(flow.tensor(x), flow.tensor(y)),
                            batch_size=batch_size, drop_last=drop_last)
    theirs = tdata.DataLoader(tdata.TensorDataset(torch.tensor(x), torch.tensor(y)),
                              batch_size=batch_size, drop_last=drop_last)
    assert len(ours) == len(theirs)
    fb, tb = list(ours), list(theirs)
    assert len(fb) == len(tb)
    for i, (a, b) in enumerate(zip(fb, tb, strict=True)):
        _assert_same(a, b, f"batch {i}")


def test_dataloader_dict_samples_match_torch():
    ours = list(fdata.DataLoader(_samples(flow), batch_size=3))
    theirs = list(tdata.DataLoader(_samples(torch), batch_size=3))
    _assert_same(ours, theirs)


def _epochs(loader, n_epochs=2):
    return [[_to_np(b) for b in loader] for _ in range(n_epochs)]


def _eq(a, b):
    return all(np.array_equal(x, y) for x, y in zip(_flatten(a), _flatten(b), strict=True))


def _flatten(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _flatten(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _flatten(v)
    else:
        yield np.asarray(x)


def test_shuffle_is_seeded_and_covers_the_dataset():
    x, y = _xy(13)
    ds = fdata.TensorDataset(flow.tensor(x), flow.tensor(y))
    g = flow.Generator().manual_seed(11)
    runs = _epochs(fdata.DataLoader(ds, batch_size=4, shuffle=True, generator=g))
    labels = [np.concatenate([b[1] for b in epoch]) for epoch in runs]
    assert sorted(labels[0].tolist()) == (np.arange(13) * 10).tolist()
    assert labels[0].tolist() != labels[1].tolist()  # a new order each epoch
    g.manual_seed(11)
    again = _epochs(fdata.DataLoader(ds, batch_size=4, shuffle=True, generator=g))
    assert _eq(runs, again)
    flow.manual_seed(4)  # without a generator: the default generator decides
    d1 = _epochs(fdata.DataLoader(ds, batch_size=4, shuffle=True), 1)
    flow.manual_seed(4)
    assert _eq(d1, _epochs(fdata.DataLoader(ds, batch_size=4, shuffle=True), 1))


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_give_the_same_batches_as_the_main_process(persistent):
    x, y = _xy(23)
    ds = fdata.TensorDataset(flow.tensor(x), flow.tensor(y))
    kw = {"batch_size": 3, "shuffle": True}
    g = flow.Generator().manual_seed(5)
    single = _epochs(fdata.DataLoader(ds, generator=g, **kw), 3)
    g.manual_seed(5)
    multi_loader = fdata.DataLoader(ds, generator=g, num_workers=2, persistent_workers=persistent,
                                    **kw)
    multi = _epochs(multi_loader, 3)
    assert len(single[0]) == len(multi[0]) == 8
    assert _eq(single, multi)
    batch = next(iter(multi_loader))
    assert isinstance(batch[0], flow.Tensor) and batch[0].dtype is flow.float32
    assert batch[1].dtype is flow.int64 and tuple(batch[0].shape) == (3, 2)


class _WorkerProbe(fdata.Dataset):
    """Each sample reports which worker fetched it, a draw from the worker's sbpflow generator,
    and what worker_init_fn set."""

    tag = "main"

    def __len__(self):
        return 12

    def __getitem__(self, i):
        info = fdata.get_worker_info()
        return {"i": i, "worker": -1 if info is None else info.id,
                "noise": flow.rand(2, dtype=flow.float64), "tag": _WorkerProbe.tag,
                "bf16": np.full(2, i, dtype=flow.bfloat16.np)}


def _init_worker(worker_id):
    _WorkerProbe.tag = f"init{worker_id}"


def test_worker_info_init_fn_seeds_and_round_robin():
    assert fdata.get_worker_info() is None
    g = flow.Generator().manual_seed(1)
    loader = fdata.DataLoader(_WorkerProbe(), batch_size=2, num_workers=3, generator=g,
                              worker_init_fn=_init_worker)
    batches = list(loader)
    assert [b["i"].tolist() for b in batches] == [[2 * k, 2 * k + 1] for k in range(6)]
    assert [b["worker"].tolist() for b in batches] == [[k % 3] * 2 for k in range(6)]
    assert [b["tag"] for b in batches] == [[f"init{k % 3}"] * 2 for k in range(6)]
    assert batches[0]["bf16"].dtype is flow.bfloat16
    noise = [b["noise"].numpy() for b in batches]
    assert not np.array_equal(noise[0], noise[1])  # workers are seeded differently
    g.manual_seed(1)
    again = [b["noise"].numpy() for b in fdata.DataLoader(
        _WorkerProbe(), batch_size=2, num_workers=3, generator=g)]
    np.testing.assert_array_equal(np.stack(noise), np.stack(again))  # ...and reproducibly


class _Failing(fdata.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError(f"no sample {i}")
        return i


def test_worker_error_is_raised_in_the_main_process():
    loader = fdata.DataLoader(_Failing(), batch_size=2, num_workers=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    assert next(it).tolist() == [2, 3]
    with pytest.raises(KeyError, match="Caught KeyError in DataLoader worker process 0"):
        next(it)


class _Shards(fdata.IterableDataset):
    """0..n-1, each worker yielding its interleaved share."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = fdata.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))

    def __len__(self):
        return self.n


class _TorchShards(tdata.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = tdata.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


@pytest.mark.parametrize("workers,batch_size,drop_last", [(0, 3, False), (2, 3, False),
                                                          (2, 2, True), (2, None, False)])
def test_iterable_dataset_matches_torch(workers, batch_size, drop_last):
    ours = fdata.DataLoader(_Shards(11), batch_size=batch_size, num_workers=workers,
                            drop_last=drop_last)
    theirs = tdata.DataLoader(_TorchShards(11), batch_size=batch_size, num_workers=workers,
                              drop_last=drop_last)
    _assert_same(list(ours), list(theirs))
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        fdata.DataLoader(_Shards(3), shuffle=True)


def test_dataloader_argument_errors():
    ds = list(range(6))
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        fdata.DataLoader(ds, sampler=fdata.SequentialSampler(ds), shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive"):
        fdata.DataLoader(ds, batch_size=2, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        fdata.DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        fdata.DataLoader(ds, persistent_workers=True)
    with pytest.raises(ValueError, match="prefetch_factor option could only be specified"):
        fdata.DataLoader(ds, prefetch_factor=2)
    with pytest.raises(ValueError, match="mutually exclusive with drop_last"):
        fdata.DataLoader(ds, batch_size=None, drop_last=True)


def test_custom_batch_sampler_and_collate_fn():
    ds = list(range(10))
    loader = fdata.DataLoader(ds, batch_sampler=[[9, 1], [4], [2, 3, 5]],
                              collate_fn=lambda batch: sum(batch))
    assert list(loader) == [10, 4, 10] and len(loader) == 3
    with_workers = fdata.DataLoader(ds, batch_sampler=[[9, 1], [4], [2, 3, 5]], num_workers=2,
                                    collate_fn=lambda batch: {"sum": flow.tensor(sum(batch))})
    assert [b["sum"].item() for b in with_workers] == [10, 4, 10]


class _Dying(fdata.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 4:
            os._exit(3)  # the worker process dies without a word
        return i


def test_dead_worker_is_reported():
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited"):
        list(fdata.DataLoader(_Dying(), batch_size=2, num_workers=2))


def test_collate_rejects_ragged_arrays():
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        fdata.default_collate([np.zeros(2), np.zeros(3)])
