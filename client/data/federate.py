"""One dataset, split across silos: the step `silofl data split` and every simulated silo share."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from silofl.client.data.loaders import load_dataset
from silofl.client.data.partition import partition_dataset
from silofl.client.data.tabular import SiloData, TabularDataset


def load_federation(
    dataset: str,
    num_silos: int,
    *,
    data_dir: str | Path | None = None,
    seed: int = 0,
    test_fraction: float = 0.25,
    target: str | None = None,
    sensitive: Sequence[str] | None = None,
    features: Sequence[str] | None = None,
    download: bool = True,
    missing: str = "error",
    partition: str = "iid",
    heterogeneity: float = 0.0,
    classes_per_silo: int = 2,
    dirichlet_alpha: float = 0.5,
    csv_sep: str = "",
    csv_encoding: str = "",
) -> tuple[TabularDataset, list[SiloData]]:
    """Load `dataset` (:func:`~client.data.loaders.load_dataset`) and partition it over `num_silos` silos
    (:func:`~client.data.partition.partition_dataset`), both deterministic in `seed`."""
    ds = load_dataset(
        dataset,
        data_dir=data_dir,
        seed=seed,
        test_fraction=test_fraction,
        target=target,
        sensitive=sensitive,
        features=features,
        download=download,
        missing=missing,
        csv_sep=csv_sep,
        csv_encoding=csv_encoding,
    )
    silos = partition_dataset(
        ds,
        num_silos,
        method=partition,
        seed=seed,
        heterogeneity=heterogeneity,
        classes_per_silo=classes_per_silo,
        dirichlet_alpha=dirichlet_alpha,
    )
    return ds, silos
