"""Datasets, samplers and the DataLoader (torch.utils.data's API)."""

from .dataloader import DataLoader, WorkerInfo, default_collate, default_convert, get_worker_info
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset",
    "DistributedSampler", "IterableDataset", "RandomSampler", "Sampler", "SequentialSampler",
    "StackDataset", "Subset", "SubsetRandomSampler", "TensorDataset", "WeightedRandomSampler",
    "WorkerInfo", "default_collate", "default_convert", "get_worker_info", "random_split",
]
