"""The silo data layer: datasets, preprocessing, partitioning among silos, and per-silo storage.

The data model (two divisions aligned by record index) is in `tabular`; `silo_store` saves and reloads one silo.
Both import only numpy, so `from client.data import load_silo` stays fast in a deployed silo. The loaders,
partitioners and the CLI import pandas (and flwr-datasets, lazily), so they are imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from client.data.silo_store import SiloStoreError, load_silo, save_silo
from client.data.tabular import (
    DataError,
    DatasetInfo,
    NonSensitiveDivision,
    SensitiveDivision,
    SiloData,
    Split,
    TabularDataset,
    make_split,
)

if TYPE_CHECKING:
    from client.data.loaders import BUILTIN_DATASETS, load_dataset
    from client.data.partition import PARTITIONS, partition_dataset, partition_indices
    from client.data.sources import ChecksumError, DataUnavailableError
    from client.data.split_cli import add_data_parser, split_command
    from client.data.synthetic import make_synthetic

_LAZY = {
    "BUILTIN_DATASETS": "client.data.loaders",
    "load_dataset": "client.data.loaders",
    "PARTITIONS": "client.data.partition",
    "partition_dataset": "client.data.partition",
    "partition_indices": "client.data.partition",
    "ChecksumError": "client.data.sources",
    "DataUnavailableError": "client.data.sources",
    "add_data_parser": "client.data.split_cli",
    "split_command": "client.data.split_cli",
    "make_synthetic": "client.data.synthetic",
}

__all__ = [
    "BUILTIN_DATASETS",
    "PARTITIONS",
    "ChecksumError",
    "DataError",
    "DataUnavailableError",
    "DatasetInfo",
    "NonSensitiveDivision",
    "SensitiveDivision",
    "SiloData",
    "SiloStoreError",
    "Split",
    "TabularDataset",
    "add_data_parser",
    "load_dataset",
    "load_silo",
    "make_split",
    "make_synthetic",
    "partition_dataset",
    "partition_indices",
    "save_silo",
    "split_command",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'client.data' has no attribute {name!r}")
