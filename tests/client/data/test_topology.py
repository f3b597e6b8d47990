"""client/data/topology.py: parties with roles over one universal record index, on the synthetic dataset."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from silofl.client.data.loaders import load_dataset
from silofl.client.data.partition import partition_dataset
from silofl.client.data.tabular import DataError
from silofl.client.data.topology import check_parties, record_ids, split_parties


@pytest.fixture(scope="module")
def ds():
    return load_dataset("synthetic", seed=0)


def _all(parties, split: str) -> np.ndarray:
    return np.sort(np.concatenate([getattr(p, f"{split}_ids") for p in parties]))


@pytest.mark.parametrize(
    ("topology", "p", "s"), [("divided", 3, 3), ("central-sensitive", 3, 1), ("general", 4, 2), ("general", 2, 5)]
)
def test_both_roles_partition_every_record_and_s_is_only_at_sensitive_parties(ds, topology, p, s) -> None:
    features, sensitive = split_parties(ds, topology, feature_parties=p, sensitive_parties=s, seed=1)
    assert (len(features), len(sensitive)) == (p, s)
    train_ids, test_ids = record_ids(ds)
    for parties in (features, sensitive):
        np.testing.assert_array_equal(_all(parties, "train"), train_ids)
        np.testing.assert_array_equal(_all(parties, "test"), test_ids)
    assert not set(train_ids) & set(test_ids)  # train and test ids never collide
    for party in features:  # a feature party's fields: ids, features, labels; no group anywhere
        assert {f.name for f in dataclasses.fields(party)} == {
            "info",
            "party_id",
            "train_ids",
            "train",
            "test_ids",
            "test",
        }
        np.testing.assert_array_equal(party.train.features, ds.train.nonsensitive.features[party.train_ids])
        np.testing.assert_array_equal(party.train.labels, ds.train.nonsensitive.labels[party.train_ids])
    for party in sensitive:
        np.testing.assert_array_equal(party.train_groups, ds.train.sensitive.groups[party.train_ids])
        np.testing.assert_array_equal(party.test_groups, ds.test.sensitive.groups[party.test_ids - len(ds.train)])


def test_feature_parties_are_the_silo_split_so_heterogeneity_applies_to_them(ds) -> None:
    options = dict(partition="attribute", heterogeneity=0.75, seed=2)
    features, sensitive = split_parties(ds, "central-sensitive", feature_parties=3, **options)
    silos = partition_dataset(ds, 3, method="attribute", heterogeneity=0.75, seed=2)
    for party, silo in zip(features, silos, strict=True):
        np.testing.assert_array_equal(party.train.features, silo.train.nonsensitive.features)
        np.testing.assert_array_equal(party.test.labels, silo.test.nonsensitive.labels)
    assert len(sensitive) == 1 and len(sensitive[0].train_ids) == len(ds.train)


def test_divided_pairs_each_feature_party_with_the_sensitive_party_of_the_same_ids(ds) -> None:
    features, sensitive = split_parties(ds, "divided", feature_parties=3, sensitive_parties=3)
    for f, s in zip(features, sensitive, strict=True):
        np.testing.assert_array_equal(f.train_ids, s.train_ids)
        np.testing.assert_array_equal(f.test_ids, s.test_ids)


def test_general_deals_sensitive_ids_independently_of_the_feature_split(ds) -> None:
    features, sensitive = split_parties(ds, "general", feature_parties=3, sensitive_parties=3, seed=0)
    overlap = np.array([[len(np.intersect1d(f.train_ids, s.train_ids)) for s in sensitive] for f in features])
    assert (overlap > 0).all()  # every feature party's records are spread over every sensitive party
    again, _ = split_parties(ds, "general", feature_parties=3, sensitive_parties=3, seed=0)
    np.testing.assert_array_equal(again[0].train_ids, features[0].train_ids)  # seeded


def test_bad_topologies_and_party_sets_are_refused_naming_the_party(ds) -> None:
    with pytest.raises(DataError, match="not one of silos, divided"):
        split_parties(ds, "star", feature_parties=2)
    with pytest.raises(DataError, match="'central-sensitive' has one sensitive party"):
        split_parties(ds, "central-sensitive", feature_parties=2, sensitive_parties=2)
    with pytest.raises(DataError, match="use 'general'"):
        split_parties(ds, "divided", feature_parties=3, sensitive_parties=2)
    features, sensitive = split_parties(ds, "divided", feature_parties=2, sensitive_parties=2)
    with pytest.raises(DataError, match=r"feature party 1 has \d+ train record ids that no sensitive party holds"):
        check_parties(features, sensitive[:1])
    with pytest.raises(DataError, match="held by feature parties \\[0, 1\\]"):
        twice = dataclasses.replace(features[1], train_ids=features[1].train_ids.copy())
        object.__setattr__(twice, "train_ids", np.concatenate([twice.train_ids[:-1], features[0].train_ids[:1]]))
        check_parties([features[0], twice], sensitive)
    with pytest.raises(DataError, match="appears twice"):
        dataclasses.replace(sensitive[0], train_ids=np.zeros(len(sensitive[0].train_ids), dtype=np.int64))
    with pytest.raises(DataError, match="one id per record"):
        dataclasses.replace(features[0], train_ids=features[0].train_ids[:-1])


def test_general_deals_ids_by_a_numeric_column_in_equal_frequency_bins(ds) -> None:
    features, sensitive = split_parties(
        ds, "general", feature_parties=2, sensitive_parties=3, seed=0, sensitive_by="age"
    )
    age = ds.train.nonsensitive.features[:, ds.info.feature_names.index("age")]
    sizes = [len(s.train_ids) for s in sensitive]
    assert max(sizes) - min(sizes) <= 0.05 * len(age)  # equal-frequency bins (ages tie, so not exactly equal)
    ranges = [(age[s.train_ids].min(), age[s.train_ids].max()) for s in sensitive]
    assert ranges[0][1] <= ranges[1][0] and ranges[1][1] <= ranges[2][0]  # party c holds the c-th age bin
    assert sum(len(s.test_ids) for s in sensitive) == len(ds.test)
    check_parties(features, sensitive)


def test_general_deals_ids_by_a_categorical_column_one_value_per_party(data_dir) -> None:
    adult = load_dataset("adult", data_dir=data_dir, seed=0)
    races = [n for n in adult.info.feature_names if n.startswith("race=")]
    _, sensitive = split_parties(
        adult, "general", feature_parties=3, sensitive_parties=len(races), seed=0, sensitive_by="race"
    )
    x = adult.train.nonsensitive.features
    for party, race in zip(sensitive, races, strict=True):
        column = x[:, adult.info.feature_names.index(race)]
        np.testing.assert_array_equal(party.train_ids, np.flatnonzero(column > 0), err_msg=race)  # one per race


def test_dealing_by_a_column_names_the_columns_when_it_is_not_one(ds) -> None:
    with pytest.raises(DataError, match=r"'zip' is not a feature column of synthetic; choose one of age, x1"):
        split_parties(ds, "general", feature_parties=2, sensitive_parties=2, sensitive_by="zip")
    with pytest.raises(DataError, match="topology 'general', not 'divided'"):
        split_parties(ds, "divided", feature_parties=2, sensitive_parties=2, sensitive_by="age")
