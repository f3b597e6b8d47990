"""The silo data layer: datasets, preprocessing, partitioning among silos, and per-silo storage.

The data model (two divisions aligned by record index) is in `tabular`; `silo_store` saves and reloads one silo.
Both import only numpy, so `from client.data import load_silo` stays fast in a deployed silo. The loaders,
partitioners and the CLI import pandas (and flwr-datasets, lazily), so they are imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from silofl.client.data.silo_store import SiloStoreError, load_silo, save_silo
from silofl.client.data.tabular import (
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
    from silofl.client.data.loaders import BUILTIN_DATASETS, load_dataset
    from silofl.client.data.partition import PARTITIONS, partition_dataset, partition_indices
    from silofl.client.data.sources import ChecksumError, DataUnavailableError
    from silofl.client.data.split_cli import add_data_parser, split_command
    from silofl.client.data.synthetic import make_synthetic

_LAZY = {
    "BUILTIN_DATASETS": "silofl.client.data.loaders",
    "load_dataset": "silofl.client.data.loaders",
    "PARTITIONS": "silofl.client.data.partition",
    "partition_dataset": "silofl.client.data.partition",
    "partition_indices": "silofl.client.data.partition",
    "ChecksumError": "silofl.client.data.sources",
    "DataUnavailableError": "silofl.client.data.sources",
    "add_data_parser": "silofl.client.data.split_cli",
    "split_command": "silofl.client.data.split_cli",
    "make_synthetic": "silofl.client.data.synthetic",
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
    raise AttributeError(f"module 'silofl.client.data' has no attribute {name!r}")
