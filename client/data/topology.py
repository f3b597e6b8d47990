"""Parties with roles over one universal record index (SteFFLe: Gupta et al. 2024,
Section 4 and Appendix F, "General Case"): who holds which record's features and label, and who holds its sensitive
attribute.

* A *feature party* holds (id, x, y) for its ids P_j; the P_j partition the records.
* A *sensitive party* holds (id, s) for its ids S_c; the S_c partition the records too, independently of the P_j.

Topology presets (the modes of SteFFLe Section 4; `silofl data split --topology`):

* ``silos``: today's silo, both divisions on the same ids in one party (p = s = N, S_c = P_c, same node);
* ``divided``: each silo's two divisions on two nodes (p = s = N, S_c = P_c);
* ``central-sensitive``: one sensitive party holding every record's s (a census bureau) and N feature parties;
* ``general``: p feature parties and s sensitive parties, ids dealt to the sensitive parties at random (seeded),
  independently of the feature split.

The feature split is the silo split of `client.data.partition` (iid, attribute with heterogeneity h, classes,
dirichlet), so the heterogeneity options apply to the feature parties. A record's universal id is its position in
the dataset's train split, and ``n_train + position`` in its test split (so train and test ids never collide);
`silofl data split` writes it as the ``record_id`` column when the source has none. Ids are not secret; s is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from silofl.client.data.partition import partition_dataset_indices
from silofl.client.data.tabular import DataError, DatasetInfo, NonSensitiveDivision, TabularDataset

TOPOLOGIES = ("silos", "divided", "central-sensitive", "general")


@dataclass(frozen=True)
class FeaturePartyData:
    """Feature party j: its record ids and their features and labels (never a sensitive attribute)."""

    info: DatasetInfo
    party_id: int
    train_ids: np.ndarray
    train: NonSensitiveDivision
    test_ids: np.ndarray
    test: NonSensitiveDivision

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            _check_ids(getattr(self, f"{split}_ids"), f"feature party {self.party_id} {split}_ids")
            if len(getattr(self, f"{split}_ids")) != len(getattr(self, split)):
                raise DataError(
                    f"feature party {self.party_id}: {len(getattr(self, f'{split}_ids'))} {split} ids for "
                    f"{len(getattr(self, split))} {split} records; give one id per record"
                )


@dataclass(frozen=True)
class SensitivePartyData:
    """Sensitive party c: its record ids and their sensitive group indices (the only place s is held)."""

    info: DatasetInfo
    party_id: int
    train_ids: np.ndarray
    train_groups: np.ndarray
    test_ids: np.ndarray
    test_groups: np.ndarray

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            ids, groups = getattr(self, f"{split}_ids"), getattr(self, f"{split}_groups")
            _check_ids(ids, f"sensitive party {self.party_id} {split}_ids")
            if groups.shape != ids.shape or groups.dtype != np.int64:
                raise DataError(
                    f"sensitive party {self.party_id}: {split}_groups must be int64 aligned with {split}_ids "
                    f"({ids.shape}), got {groups.dtype} {groups.shape}"
                )
            if groups.size and (groups.min() < 0 or groups.max() >= self.info.num_groups):
                raise DataError(
                    f"sensitive party {self.party_id}: {split} group {int(groups.max())} out of range; the dataset "
                    f"has {self.info.num_groups} groups"
                )


def _check_ids(ids: np.ndarray, what: str) -> None:
    if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
        raise DataError(f"{what} must be a 1-D int64 array of record ids")
    if ids.size and ids.min() < 0:
        raise DataError(f"{what}: record ids must be >= 0, found {int(ids.min())}")
    unique, counts = np.unique(ids, return_counts=True)
    if unique.size != ids.size:
        raise DataError(f"{what}: record id {int(unique[counts > 1][0])} appears twice; every record has one id")


def record_ids(ds: TabularDataset) -> tuple[np.ndarray, np.ndarray]:
    """The universal ids of `ds`'s train and test records (positions; test ids offset by the train size)."""
    n_train = len(ds.train)
    return np.arange(n_train, dtype=np.int64), np.arange(n_train, n_train + len(ds.test), dtype=np.int64)


def split_parties(
    ds: TabularDataset,
    topology: str,
    *,
    feature_parties: int,
    sensitive_parties: int = 1,
    partition: str = "iid",
    heterogeneity: float = 0.0,
    classes_per_silo: int = 2,
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
    sensitive_by: str = "",
) -> tuple[list[FeaturePartyData], list[SensitivePartyData]]:
    """The parties of `topology` over `ds`: feature parties by the silo split, sensitive parties by the preset
    (``divided``: party k holds the ids of feature party k; ``central-sensitive``: one party holds every id;
    ``general``: `sensitive_parties` parties, ids dealt at random with `seed`, or by the column `sensitive_by`:
    :func:`deal_by_column`). ``silos`` has no separate parties: use :func:`client.data.partition.partition_dataset`."""
    if topology not in TOPOLOGIES:
        raise DataError(f"topology {topology!r} is not one of {', '.join(TOPOLOGIES)}")
    if topology == "silos":
        raise DataError("topology 'silos' keeps both divisions in one party: use partition_dataset for it")
    if topology == "divided" and sensitive_parties not in (1, feature_parties):
        raise DataError(
            f"topology 'divided' has one sensitive party per feature party ({feature_parties}), "
            f"got sensitive_parties={sensitive_parties}; use 'general' for another number"
        )
    if topology == "central-sensitive" and sensitive_parties != 1:
        raise DataError(f"topology 'central-sensitive' has one sensitive party, got {sensitive_parties}")
    if sensitive_parties < 1:
        raise DataError(f"sensitive_parties must be >= 1, got {sensitive_parties}")
    if sensitive_by and topology != "general":
        raise DataError(f"sensitive_by deals ids to the sensitive parties of topology 'general', not {topology!r}")
    parts = partition_dataset_indices(
        ds,
        feature_parties,
        method=partition,
        seed=seed,
        heterogeneity=heterogeneity,
        classes_per_silo=classes_per_silo,
        dirichlet_alpha=dirichlet_alpha,
    )
    train_ids, test_ids = record_ids(ds)
    features = [
        FeaturePartyData(
            ds.info,
            j,
            train_ids[tr],
            _nonsensitive(ds.train.nonsensitive, tr),
            test_ids[te],
            _nonsensitive(ds.test.nonsensitive, te),
        )
        for j, (tr, te) in enumerate(parts)
    ]
    train_groups, test_groups = ds.train.sensitive.groups, ds.test.sensitive.groups
    if topology == "divided":
        deal = [(tr, te) for tr, te in parts]
    elif topology == "central-sensitive":
        deal = [(np.arange(len(train_ids)), np.arange(len(test_ids)))]
    else:  # general: independent of the feature split
        if sensitive_by:
            to_train, to_test = deal_by_column(ds, sensitive_by, sensitive_parties)
        else:
            rng = np.random.default_rng([seed, 18])
            to_train, to_test = (
                rng.integers(0, sensitive_parties, len(train_ids)),
                rng.integers(0, sensitive_parties, len(test_ids)),
            )
        deal = [(np.flatnonzero(to_train == c), np.flatnonzero(to_test == c)) for c in range(sensitive_parties)]
    sensitive = [
        SensitivePartyData(
            ds.info, c, train_ids[tr], train_groups[tr].astype(np.int64), test_ids[te], test_groups[te].astype(np.int64)
        )
        for c, (tr, te) in enumerate(deal)
    ]
    check_parties(features, sensitive)
    return features, sensitive


def deal_by_column(ds: TabularDataset, column: str, parties: int) -> tuple[np.ndarray, np.ndarray]:
    """The sensitive party of each train and test record by a feature column (e.g. one census office per region):
    for a categorical column (one-hot features ``COLUMN=value``) the k-th value, in the order of the features, goes to
    party k mod `parties` (a record with none of the values, to the party after the last value's); for a numeric
    column, `parties` equal-frequency bins of its training values (the first bin to party 0). Raises DataError
    naming the column and the dataset's columns if it is neither."""
    names = ds.info.feature_names
    onehot = [i for i, name in enumerate(names) if name.startswith(f"{column}=")]
    if onehot:

        def party(features: np.ndarray) -> np.ndarray:
            block = features[:, onehot]
            value = np.where(block.max(axis=1) > 0, block.argmax(axis=1), len(onehot))
            return (value % parties).astype(np.int64)

        return party(ds.train.nonsensitive.features), party(ds.test.nonsensitive.features)
    if column in names:
        at = names.index(column)
        train, test = ds.train.nonsensitive.features[:, at], ds.test.nonsensitive.features[:, at]
        edges = np.quantile(train, np.linspace(0, 1, parties + 1)[1:-1])
        return np.searchsorted(edges, train, side="right").astype(np.int64), np.searchsorted(
            edges, test, side="right"
        ).astype(np.int64)
    columns = sorted({name.split("=", 1)[0] for name in names})
    raise DataError(
        f"sensitive_by {column!r} is not a feature column of {ds.info.name}; choose one of {', '.join(columns)}"
    )


def _nonsensitive(division: NonSensitiveDivision, idx: np.ndarray) -> NonSensitiveDivision:
    return NonSensitiveDivision(
        np.ascontiguousarray(division.features[idx]), np.ascontiguousarray(division.labels[idx])
    )


def check_parties(features: Sequence[FeaturePartyData], sensitive: Sequence[SensitivePartyData]) -> None:
    """Refuse a set of parties that cannot run, naming the party and the ids: a record id held by two feature
    parties or by two sensitive parties, or a feature party's id that no sensitive party holds (its s is unknown).
    Sensitive ids no feature party holds are allowed (a census holds more people than the banks' customers)."""
    if not features or not sensitive:
        raise DataError(f"need at least one feature and one sensitive party, got {len(features)} and {len(sensitive)}")
    infos = {p.info for p in [*features, *sensitive]}
    if len(infos) != 1:
        raise DataError("the parties describe different datasets (feature, label or group names differ)")
    for split in ("train", "test"):
        for role, parties in (("feature", features), ("sensitive", sensitive)):
            ids = np.concatenate([getattr(p, f"{split}_ids") for p in parties])
            unique, counts = np.unique(ids, return_counts=True)
            if unique.size != ids.size:
                twice = int(unique[counts > 1][0])
                owners = [p.party_id for p in parties if twice in getattr(p, f"{split}_ids")]
                raise DataError(
                    f"{split} record id {twice} is held by {role} parties {owners}; each record belongs to one "
                    f"{role} party"
                )
        held = np.concatenate([getattr(p, f"{split}_ids") for p in sensitive])
        for party in features:
            missing = np.setdiff1d(getattr(party, f"{split}_ids"), held)
            if missing.size:
                raise DataError(
                    f"feature party {party.party_id} has {missing.size} {split} record ids that no sensitive party "
                    f"holds (e.g. {missing[:5].tolist()}); give every record's sensitive attribute to a sensitive party"
                )
