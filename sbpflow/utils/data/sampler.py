"""Samplers: the order in which a DataLoader visits a dataset's indices (torch's API).

Randomness comes from sbpflow generators (`sbpflow.randperm`/`randint` with `generator=`), so a
seeded `sbpflow.Generator` gives the same order on every run and in every process.  The
permutations are sbpflow's (Philox-based), not torch's: orders agree with torch only where no
randomness is involved.
"""

from __future__ import annotations

import itertools
import math
import os

import numpy as np

from ..._core import dtype as dt
from ...framework import functional as F
from ...framework.generator import Generator, default_generator
from ...framework.tensor import Tensor

__all__ = [
    "BatchSampler", "DistributedSampler", "RandomSampler", "Sampler", "SequentialSampler",
    "SubsetRandomSampler", "WeightedRandomSampler",
]


def _draw_seed(generator: Generator | None) -> int:
    """A fresh seed in [0, 2**63 - 1) from `generator` (the default generator when None)."""
    gen = default_generator if generator is None else generator
    return int(F.randint(2**63 - 1, (), generator=gen).item())


def randperm(n: int, generator: Generator | None = None) -> list[int]:
    """A random permutation of range(n) as a list, drawn from `generator`."""
    gen = default_generator if generator is None else generator
    return F.randperm(n, generator=gen).tolist()


def _randint_list(high: int, size: int, generator: Generator) -> list[int]:
    """`size` integers uniform in [0, high) from `generator`."""
    return F.randint(high, (size,), generator=generator).tolist()


class Sampler:
    """Base class: an iterable of dataset indices (or of index lists, for batch samplers)."""

    def __init__(self, data_source=None) -> None:
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random order of the indices; with replacement, `num_samples` independent draws.

    Without a generator, each pass draws a fresh seed from sbpflow's default generator (so
    `sbpflow.manual_seed` makes the order reproducible), as torch does.
    """

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None,
                 generator: Generator | None = None) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                "num_samples should be a positive integer value, but got "
                f"num_samples={self.num_samples}"
            )

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        if self.generator is None:
            gen = Generator().manual_seed(_draw_seed(None))
        else:
            gen = self.generator
        if self.replacement:
            # Draw in chunks of 32, as torch does, so early batches don't wait for all draws.
            for _ in range(self.num_samples // 32):
                yield from _randint_list(n, 32, gen)
            yield from _randint_list(n, self.num_samples % 32, gen)
        else:
            for _ in range(self.num_samples // n):
                yield from randperm(n, gen)
            yield from randperm(n, gen)[: self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order."""

    def __init__(self, indices, generator: Generator | None = None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self):
        for i in randperm(len(self.indices), self.generator):
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class BatchSampler(Sampler):
    """Group another sampler's indices into lists of batch_size (the last may be short)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(
                f"drop_last should be a boolean value, but got drop_last={drop_last}"
            )
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        it = iter(self.sampler)
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield batch

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


class WeightedRandomSampler(Sampler):
    """`num_samples` indices in [0, len(weights)), index i with probability proportional to
    weights[i]; without replacement each index at most once (torch.multinomial's draws).

    The draws come from sbpflow's generator (`generator`, else the default one), so they are
    reproducible but not torch's: with replacement an inverse-CDF lookup of uniform draws,
    without replacement the largest keys u**(1/w) (Efraimidis-Spirakis), which picks indices
    in the same order distribution as drawing one at a time; zero weights come last.
    """

    def __init__(self, weights, num_samples: int, replacement: bool = True,
                 generator: Generator | None = None) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(
                "num_samples should be a positive integer value, but got "
                f"num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        host = weights.numpy() if isinstance(weights, Tensor) else weights
        host = np.asarray(host, dtype=np.float64)
        if host.ndim != 1:
            raise ValueError(
                "weights should be a 1d sequence but given "
                f"weights have shape {tuple(host.shape)}"
            )
        self.weights = F.tensor(host, dtype=dt.float64)
        self._host_weights = host
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self):
        yield from _weighted_draws(self._host_weights, self.num_samples, self.replacement,
                                   self.generator)

    def __len__(self) -> int:
        return self.num_samples


def _weighted_draws(w: np.ndarray, n: int, replacement: bool, generator) -> list[int]:
    """torch.multinomial(w, n, replacement)'s checks (same errors), sbpflow's random draws."""
    if not replacement and n > w.shape[0]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if np.any(np.isnan(w)) or np.any(w < 0):
        raise RuntimeError("invalid multinomial distribution (encountering probability entry "
                           "< 0)")
    if np.any(np.isinf(w)):
        raise RuntimeError("invalid multinomial distribution (encountering probability entry "
                           "= infinity or NaN)")
    if w.shape[0] == 0 or not w.sum() > 0:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    gen = default_generator if generator is None else generator
    u = F.rand(n if replacement else w.shape[0], generator=gen,
               dtype=dt.float64).numpy()
    if replacement:
        cdf = np.cumsum(w)
        picks = np.searchsorted(cdf, u * cdf[-1], side="right")
        # Rounding may put a draw past the last positive weight: it belongs to that one.
        return np.minimum(picks, np.flatnonzero(w > 0)[-1]).tolist()
    with np.errstate(divide="ignore"):
        keys = np.log(u) / w  # log(u**(1/w)); -inf for zero weights
    keys[w == 0] = -np.inf
    # Ties (the zero weights) in a random order: sort a random permutation stably.
    perm = np.asarray(F.randperm(w.shape[0], generator=gen).tolist())
    order = perm[np.argsort(-keys[perm], kind="stable")]
    return order[:n].tolist()


def _world() -> tuple[int, int]:
    """(world size, rank) of this process from the launcher's environment (WORLD_SIZE/RANK,
    or MPI's variables), else (1, 0)."""
    for size_var, rank_var in (("WORLD_SIZE", "RANK"), ("OMPI_COMM_WORLD_SIZE",
                                                         "OMPI_COMM_WORLD_RANK"),
                               ("PMI_SIZE", "PMI_RANK")):
        if size_var in os.environ and rank_var in os.environ:
            return int(os.environ[size_var]), int(os.environ[rank_var])
    return 1, 0


class DistributedSampler(Sampler):
    """Each of num_replicas ranks gets an interleaved 1/num_replicas share of the indices.

    Without drop_last the index list is padded by repeating its start so every rank gets the
    same count; with drop_last the tail that doesn't divide evenly is dropped.  Rank r takes
    positions r, r + num_replicas, ....  With shuffle, the order is a permutation seeded with
    seed + epoch (call `set_epoch` each epoch), the same on every rank.
    """

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            world, my_rank = _world()
            num_replicas = world if num_replicas is None else num_replicas
            rank = my_rank if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            indices = randperm(n, Generator().manual_seed(self.seed + self.epoch))
        else:
            indices = list(range(n))
        if self.drop_last:
            indices = indices[: self.total_size]
        else:
            padding = self.total_size - len(indices)
            repeats = math.ceil(padding / len(indices)) if padding > 0 else 0
            indices += (indices * repeats)[:padding]
        if len(indices) != self.total_size:
            raise AssertionError(f"{len(indices)} indices, expected total_size {self.total_size}")
        mine = indices[self.rank : self.total_size : self.num_replicas]
        if len(mine) != self.num_samples:
            raise AssertionError(f"{len(mine)} indices, expected num_samples {self.num_samples}")
        return iter(mine)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use a different shuffle for each epoch (all ranks must pass the same epoch)."""
        self.epoch = epoch
