"""Tests for client/data/generic.py (preprocessing of arbitrary tables), client/data/table_files.py (CSV/Parquet
loading) and client/data/numeric_columns.py (numeric columns read as text): clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from silofl.client.data.generic import (
    above_train_median,
    build_dataset,
    categorical_labels,
    load_table_dataset,
    split_indices,
)
from silofl.client.data.loaders import load_dataset
from silofl.client.data.numeric_columns import mostly_numeric_columns
from silofl.client.data.table_files import read_table, read_table_with_format, sniff_separator
from silofl.client.data.tabular import DataError


def toy_frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "Age": rng.integers(18, 80, size=n),
            "income": rng.normal(50_000, 20_000, size=n),
            "city": rng.choice(["north", "south", "east"], size=n),
            "sex": rng.choice(["F", "M"], size=n),
            "race": rng.choice(["A", "B", "C"], size=n),
            "approved": rng.choice(["yes", "no"], size=n),
        }
    )


def test_split_indices_sizes_disjoint_deterministic() -> None:
    train, test = split_indices(101, 0.25, seed=3)
    assert (train.size, test.size) == (76, 25)
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(101))
    np.testing.assert_array_equal(split_indices(101, 0.25, seed=3)[1], test)
    assert not np.array_equal(split_indices(101, 0.25, seed=4)[1], test)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 0.999])
def test_split_indices_rejects_bad_fraction(fraction: float) -> None:
    """In the command line's words (the flag, not the argument's name)."""
    with pytest.raises(DataError, match="--test-fraction") as info:
        split_indices(10, fraction, seed=0)
    assert "test_fraction" not in str(info.value)


@pytest.mark.parametrize(
    ("n", "empty"),
    [(0, "the training and the test split empty"), (1, "the test split empty"), (3, None)],
)
def test_split_indices_names_the_empty_split(n: int, empty: str | None) -> None:
    """A table too small says which split would be empty, training or test (3 records: 1 test, 2 training)."""
    if empty is None:
        assert [part.size for part in split_indices(n, 0.25, seed=0)] == [2, 1]
        return
    with pytest.raises(DataError, match=empty):
        split_indices(n, 0.25, seed=0)
    with pytest.raises(DataError, match="leave the training split empty"):
        split_indices(4, 0.9, seed=0)


def test_build_dataset_layout_and_sensitive_excluded() -> None:
    ds = build_dataset(toy_frame(), name="toy", target="approved", sensitive=["sex"], sort_key="Age", seed=0)
    names = ds.info.feature_names
    # Column order kept; categoricals expanded in place with sorted categories; sensitive column absent.
    assert names == ("Age", "income", "city=east", "city=north", "city=south", "race=A", "race=B", "race=C")
    assert not any(n.startswith("sex") for n in names)
    assert ds.info.label_names == ("no", "yes")
    assert ds.info.group_names == ("F", "M")
    assert len(ds.train) == 150 and len(ds.test) == 50
    x = ds.train.nonsensitive.features
    np.testing.assert_array_equal(x[:, 2:5].sum(axis=1), 1.0)  # exactly one city per record
    assert set(np.unique(x[:, 2:])) == {0.0, 1.0}


def test_zscore_uses_train_statistics_only() -> None:
    frame = toy_frame()
    ds = build_dataset(frame, name="toy", target="approved", sensitive=["sex"], seed=1)
    train_x, test_x = ds.train.nonsensitive.features, ds.test.nonsensitive.features
    np.testing.assert_allclose(train_x[:, :2].mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train_x[:, :2].std(axis=0), 1.0, atol=1e-5)
    assert np.abs(test_x[:, :2].mean(axis=0)).max() > 1e-3  # test is standardized with train stats, not its own

    # Changing the test rows' values must not move any training feature.
    _, test_rows = split_indices(len(frame), 0.25, seed=1)
    changed = frame.copy()
    changed.loc[test_rows, "income"] = 1e9
    changed.loc[test_rows, "Age"] = 5
    ds2 = build_dataset(changed, name="toy", target="approved", sensitive=["sex"], seed=1)
    np.testing.assert_array_equal(ds2.train.nonsensitive.features, train_x)
    assert not np.array_equal(ds2.test.nonsensitive.features, test_x)


def test_constant_column_maps_to_zero() -> None:
    frame = toy_frame()
    frame["const"] = 7.0
    ds = build_dataset(frame, name="toy", target="approved", sensitive=["sex"])
    column = ds.info.feature_names.index("const")
    assert np.all(ds.train.nonsensitive.features[:, column] == 0.0)


def test_joint_categories_of_two_sensitive_columns() -> None:
    frame = toy_frame(300)
    ds = build_dataset(frame, name="toy", target="approved", sensitive=["race", "sex"], seed=0)
    assert ds.info.sensitive_columns == ("race", "sex")
    assert ds.info.group_names == ("A|F", "A|M", "B|F", "B|M", "C|F", "C|M")
    assert not any(n.startswith(("race", "sex")) for n in ds.info.feature_names)
    # Every training record's group index decodes to its own (race, sex).
    train_rows, _ = split_indices(len(frame), 0.25, seed=0)
    expected = [f"{r}|{s}" for r, s in zip(frame.race[train_rows], frame.sex[train_rows], strict=True)]
    got = [ds.info.group_names[g] for g in ds.train.sensitive.groups]
    assert got == expected


def test_three_sensitive_columns_any_number_of_values() -> None:
    frame = toy_frame(300)
    ds = build_dataset(frame, name="toy", target="approved", sensitive=["race", "sex", "city"])
    assert ds.info.num_groups == 3 * 2 * 3
    assert ds.info.group_names[0] == "A|F|east"


def test_numeric_categorical_and_explicit_label_order() -> None:
    frame = toy_frame()
    frame["grade"] = np.tile([1, 2, 10], len(frame))[: len(frame)]
    ds = build_dataset(
        frame,
        name="toy",
        target="approved",
        sensitive=["sex"],
        categorical=["grade"],
        label_encoder=categorical_labels(classes=["yes", "no"], names=["approved", "rejected"]),
    )
    assert tuple(n for n in ds.info.feature_names if n.startswith("grade")) == ("grade=1", "grade=2", "grade=10")
    assert ds.info.label_names == ("approved", "rejected")
    train_rows, _ = split_indices(len(frame), 0.25, seed=0)
    np.testing.assert_array_equal(ds.train.nonsensitive.labels, (frame.approved[train_rows] == "no").astype(int))


def test_above_train_median_uses_training_rows() -> None:
    values = pd.Series(np.arange(10.0), name="score")
    labels, names = above_train_median()(values, np.array([0, 1, 2, 3, 4]))  # train median 2
    np.testing.assert_array_equal(labels, (np.arange(10) > 2).astype(int))
    assert names == ("<=median", ">median")


def test_bad_targets_are_clear() -> None:
    frame = toy_frame()
    with pytest.raises(DataError, match="single value"):
        build_dataset(frame.assign(approved="yes"), name="t", target="approved", sensitive=["sex"])
    with pytest.raises(DataError, match="looks continuous"):
        build_dataset(frame, name="t", target="income", sensitive=["sex"])
    with pytest.raises(DataError, match=r"outside the expected classes"):
        build_dataset(
            frame,
            name="t",
            target="approved",
            sensitive=["sex"],
            label_encoder=categorical_labels(classes=["yes", "maybe"]),
        )
    with pytest.raises(DataError, match="must be numeric to threshold"):
        build_dataset(frame, name="t", target="approved", sensitive=["sex"], label_encoder=above_train_median())


def test_column_errors_name_the_argument() -> None:
    frame = toy_frame()
    with pytest.raises(DataError, match=r"target: column\(s\) \['nope'\] not in the table"):
        build_dataset(frame, name="t", target="nope", sensitive=["sex"])
    with pytest.raises(DataError, match=r"sensitive: column\(s\) \['gender'\]"):
        build_dataset(frame, name="t", target="approved", sensitive=["gender"])
    with pytest.raises(DataError, match="sensitive attributes live only in the sensitive division"):
        build_dataset(frame, name="t", target="approved", sensitive=["sex"], features=["income", "sex"])
    with pytest.raises(DataError, match="cannot also be a sensitive column"):
        build_dataset(frame, name="t", target="sex", sensitive=["sex"])
    with pytest.raises(DataError, match="sort_key column 'city' must be numeric"):
        build_dataset(frame, name="t", target="approved", sensitive=["sex"], sort_key="city")
    with pytest.raises(DataError, match="name at least one sensitive column"):
        build_dataset(frame, name="t", target="approved", sensitive=[])


def test_missing_values_are_reported_by_column() -> None:
    frame = toy_frame()
    frame.loc[[3, 7], "income"] = np.nan
    with pytest.raises(DataError, match=r"missing values in columns \{'income': 2\}"):
        build_dataset(frame, name="t", target="approved", sensitive=["sex"])
    # ... unless the column is not used.
    ds = build_dataset(frame, name="t", target="approved", sensitive=["sex"], features=["Age", "city"])
    assert ds.info.feature_names[0] == "Age"


def test_missing_drop_drops_only_the_rows_missing_a_used_value() -> None:
    """missing='drop' (--missing drop): the rows with a gap in a used column go, the others all stay."""
    frame = toy_frame(120)
    frame.loc[[3, 7], "income"] = np.nan
    with pytest.raises(DataError, match="--missing drop"):  # the refusal names the way out
        build_dataset(frame, name="t", target="approved", sensitive=["sex"])
    ds = build_dataset(frame, name="t", target="approved", sensitive=["sex"], missing="drop")
    assert len(ds.train) + len(ds.test) == 118
    # a gap in an unused column drops nothing
    kept = build_dataset(frame, name="t", target="approved", sensitive=["sex"], features=["Age"], missing="drop")
    assert len(kept.train) + len(kept.test) == 120
    frame["income"] = np.nan
    with pytest.raises(DataError, match="left no rows"):
        build_dataset(frame, name="t", target="approved", sensitive=["sex"], missing="drop")
    with pytest.raises(DataError, match="missing must be one of"):
        build_dataset(toy_frame(), name="t", target="approved", sensitive=["sex"], missing="impute")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_generic_file_loader_roundtrip(tmp_path: Path, suffix: str) -> None:
    frame = toy_frame(120)
    path = tmp_path / f"loans{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    ds = load_dataset(str(path), target="approved", sensitive=["sex", "race"], seed=2)
    direct = build_dataset(frame, name="loans", target="approved", sensitive=["sex", "race"], sort_key="Age", seed=2)
    assert ds.info == direct.info
    assert ds.info.name == "loans"
    np.testing.assert_array_equal(ds.train.nonsensitive.features, direct.train.nonsensitive.features)
    np.testing.assert_array_equal(ds.test.sensitive.groups, direct.test.sensitive.groups)
    np.testing.assert_array_equal(ds.train_sort_key, frame.Age.to_numpy(float)[split_indices(120, 0.25, 2)[0]])
    subset = load_dataset(path, target="approved", sensitive="sex", features=["income", "city"])
    assert subset.info.feature_names == ("income", "city=east", "city=north", "city=south")


def test_generic_loader_without_age_has_no_sort_key(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    toy_frame(50).drop(columns=["Age"]).to_csv(path, index=False)
    ds = load_table_dataset(path, target="approved", sensitive=["sex"])
    assert ds.train_sort_key is None and ds.test_sort_key is None


def test_generic_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_dataset(str(tmp_path / "missing.csv"), target="y", sensitive=["s"])
    with pytest.raises(DataError, match=r"unsupported file type \.txt"):
        read_table(tmp_path / "table.txt")
    path = tmp_path / "t.csv"
    toy_frame(30).to_csv(path, index=False)
    with pytest.raises(DataError, match="needs target=COLUMN"):
        load_dataset(str(path), sensitive=["sex"])
    with pytest.raises(DataError, match="needs sensitive="):
        load_dataset(str(path), target="approved")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(DataError, match="cannot read it as parquet"):
        read_table(broken)


@pytest.mark.parametrize("sep", [",", ";", "\t", "|"])
def test_csv_separator_and_encoding_are_detected(tmp_path: Path, sep: str) -> None:
    """Every candidate separator, in a Latin-1 file with a quoted field holding the other separators."""
    frame = toy_frame(40).assign(city="Zürich, Genève; Basel|Bern")
    path = tmp_path / "t.csv"
    frame.to_csv(path, sep=sep, index=False, encoding="latin-1")
    read, fmt = read_table_with_format(path)
    assert (fmt.sep, fmt.encoding) == (sep, "latin-1") and fmt.sep_detected and fmt.encoding_detected
    pd.testing.assert_frame_equal(read, frame, check_dtype=False)
    note = fmt.note(path)
    assert note is not None and "latin-1" in note and "\n" not in note
    assert (sep == ",") == ("--csv-sep" not in note)  # a comma is the default: not worth a word
    given = read_table_with_format(path, csv_sep=sep, csv_encoding="latin-1")[1]
    assert given.note(path) is None


def test_utf8_with_a_byte_order_mark_reads_as_plain_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffsex;y\nF;1\nM;0\n".encode())
    frame, fmt = read_table_with_format(path)
    assert list(frame.columns) == ["sex", "y"] and fmt.encoding == "utf-8" and fmt.note(path) is not None
    assert sniff_separator("a\n1\n2\n") is None  # one column: nothing splits it (read with ',')


def test_csv_options_errors(tmp_path: Path) -> None:
    parquet = tmp_path / "t.parquet"
    toy_frame(10).to_parquet(parquet, index=False)
    with pytest.raises(DataError, match=r"apply to a \.csv file"):
        read_table(parquet, csv_sep=";")
    with pytest.raises(DataError, match="--csv-sep and --csv-encoding"):
        load_dataset("synthetic", csv_encoding="latin-1")
    path = tmp_path / "t.csv"
    toy_frame(10).to_csv(path, index=False)
    with pytest.raises(DataError, match="not an encoding Python knows"):
        read_table(path, csv_encoding="klingon")
    path.write_bytes(b"")
    with pytest.raises(DataError, match="is empty: it has no header row"):
        read_table(path)


def test_mostly_numeric_columns() -> None:
    frame = pd.DataFrame(
        {
            "age": ["30", "41", "?", "52"] * 5,  # 15 of 20 numbers: below 90%
            "income": ["1.5", "2.5", "3.5", "x"] + ["4.5"] * 16,  # 19 of 20
            "rate": ["1,5", "2,25"] * 10,  # decimal commas
            "city": ["a", "b"] * 10,
        }
    )
    found = {m.column: m for m in mostly_numeric_columns(frame, list(frame.columns))}
    assert set(found) == {"income", "rate"}
    assert (found["income"].numbers, found["income"].values, found["income"].offending) == (19, 20, ("x",))
    assert found["rate"].decimal_comma and found["rate"].records == 0
    assert [m.column for m in mostly_numeric_columns(frame, ["age"], threshold=0.75)] == ["age"]
