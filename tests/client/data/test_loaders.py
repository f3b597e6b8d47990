"""Tests for client/data/loaders.py and client/data/sources.py on the real files (no network is used).

Row counts are the exact numbers the raw files give (see the loaders' docstring for the cleaning decisions).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from silofl.client.data import loaders
from silofl.client.data.images import load_digits
from silofl.client.data.loaders import BUILTIN_DATASETS, load_dataset
from silofl.client.data.sources import (
    DATA_DIR_ENV,
    FILES,
    MIRROR_ENV,
    ChecksumError,
    DataUnavailableError,
    ensure_file,
    resolve_data_dir,
    sha256_file,
)
from silofl.client.data.tabular import DataError, TabularDataset


@pytest.fixture(scope="module")
def adult(data_dir: Path) -> TabularDataset:
    return load_dataset("adult", data_dir=data_dir, download=False)


def assert_standardized(ds: TabularDataset, continuous: list[str]) -> None:
    columns = [ds.info.feature_names.index(c) for c in continuous]
    train = ds.train.nonsensitive.features[:, columns].astype(np.float64)
    test = ds.test.nonsensitive.features[:, columns].astype(np.float64)
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(train.std(axis=0), 1.0, atol=1e-4)
    assert np.abs(test.mean(axis=0)).max() > 1e-4  # the test split uses the training statistics, not its own


def test_adult(adult: TabularDataset) -> None:
    # 32,561 + 16,281 = 48,842 pooled rows; 3,620 have a '?' and are dropped; 45,222 split 3:1.
    assert (len(adult.train), len(adult.test)) == (33_916, 11_306)
    assert adult.info.num_features == 102
    assert adult.info.label_names == ("<=50K", ">50K")
    assert adult.info.sensitive_columns == ("sex",)
    assert adult.info.group_names == ("Female", "Male")
    assert not any(name.startswith("sex") for name in adult.info.feature_names)
    assert not any(name.endswith("=?") for name in adult.info.feature_names)
    labels = np.concatenate([adult.train.nonsensitive.labels, adult.test.nonsensitive.labels])
    assert set(np.unique(labels)) == {0, 1}
    assert np.count_nonzero(labels) == 11_208  # >50K among the 45,222 complete rows
    groups = np.concatenate([adult.train.sensitive.groups, adult.test.sensitive.groups])
    assert np.bincount(groups).tolist() == [14_695, 30_527]
    assert_standardized(adult, ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"])
    one_hot = [i for i, n in enumerate(adult.info.feature_names) if "=" in n]
    assert len(one_hot) == 96
    assert set(np.unique(adult.train.nonsensitive.features[:, one_hot])) == {0.0, 1.0}
    # Sort key: raw age in years, aligned with the records.
    assert adult.train_sort_key is not None and adult.test_sort_key is not None
    assert adult.train_sort_key.min() == 17 and adult.train_sort_key.max() == 90
    age = adult.train.nonsensitive.features[:, adult.info.feature_names.index("age")]
    assert np.corrcoef(age, adult.train_sort_key)[0, 1] > 0.9999


def test_adult_split_is_seeded(data_dir: Path, adult: TabularDataset) -> None:
    again = load_dataset("adult", data_dir=data_dir, seed=0)
    np.testing.assert_array_equal(again.test.nonsensitive.features, adult.test.nonsensitive.features)
    other = load_dataset("adult", data_dir=data_dir, seed=1)
    assert len(other.train) == len(adult.train)
    assert not np.array_equal(other.train_sort_key, adult.train_sort_key)


def test_adult_two_sensitive_columns(data_dir: Path) -> None:
    ds = load_dataset("adult", data_dir=data_dir, sensitive=["race", "sex"])
    assert ds.info.num_groups == 10
    assert ds.info.group_names[:2] == ("Amer-Indian-Eskimo|Female", "Amer-Indian-Eskimo|Male")
    assert ds.info.group_names[-1] == "White|Male"
    assert ds.info.num_features == 102 - 5  # race's five one-hot columns left the features
    assert not any(n.startswith(("race", "sex")) for n in ds.info.feature_names)
    groups = np.concatenate([ds.train.sensitive.groups, ds.test.sensitive.groups])
    assert np.bincount(groups, minlength=10).min() > 0
    # The labels do not depend on which columns are sensitive.
    np.testing.assert_array_equal(
        ds.train.nonsensitive.labels, load_dataset("adult", data_dir=data_dir).train.nonsensitive.labels
    )


def test_adult_sensitive_override_makes_sex_a_feature(data_dir: Path) -> None:
    ds = load_dataset("adult", data_dir=data_dir, sensitive=["race"])
    assert "sex=Female" in ds.info.feature_names and "race=White" not in ds.info.feature_names


def test_credit(data_dir: Path) -> None:
    ds = load_dataset("credit", data_dir=data_dir)
    # 30,000 rows, 2 with AGE 'nan' in this CSV copy dropped.
    assert (len(ds.train), len(ds.test)) == (22_498, 7_500)
    assert ds.info.num_features == 85
    assert ds.info.group_names == ("Female", "Male")
    assert ds.info.label_names == ("no default", "default")
    assert "ID" not in ds.info.feature_names and "SEX" not in ds.info.feature_names
    assert [n for n in ds.info.feature_names if n.startswith(("EDUCATION", "MARRIAGE"))] == [
        "EDUCATION=1",
        "EDUCATION=2",
        "EDUCATION=3",
        "EDUCATION=4",
        "MARRIAGE=1",
        "MARRIAGE=2",
        "MARRIAGE=3",
    ]
    labels = np.concatenate([ds.train.nonsensitive.labels, ds.test.nonsensitive.labels])
    assert np.count_nonzero(labels) == 6_636
    assert_standardized(ds, ["LIMIT_BAL", "AGE", "BILL_AMT1", "PAY_AMT6"])
    assert ds.train_sort_key is not None and ds.train_sort_key.min() >= 21


def test_parkinsons(data_dir: Path) -> None:
    ds = load_dataset("parkinsons", data_dir=data_dir)
    assert (len(ds.train), len(ds.test)) == (4_406, 1_469)
    assert ds.info.num_features == 18
    for dropped in ("subject#", "motor_UPDRS", "total_UPDRS", "sex"):
        assert dropped not in ds.info.feature_names
    assert ds.info.group_names == ("Female", "Male")
    # Threshold at the TRAINING median: the training labels split (almost) exactly in half.
    counts = np.bincount(ds.train.nonsensitive.labels)
    assert abs(int(counts[0]) - int(counts[1])) <= 2
    assert_standardized(ds, ["age", "test_time", "PPE"])


def test_synthetic_via_load_dataset() -> None:
    ds = load_dataset("synthetic", seed=3)
    assert (len(ds.train), len(ds.test)) == (4_500, 1_500)
    assert ds.info.name == "synthetic" and ds.info.group_names == ("g0", "g1")
    assert load_dataset("synthetic", features=["age", "x1"]).info.feature_names == ("age", "x1")


def test_loader_argument_errors(data_dir: Path) -> None:
    with pytest.raises(DataError, match="unknown dataset 'adlt'"):
        load_dataset("adlt")
    with pytest.raises(DataError, match="target is fixed for the built-in dataset 'adult'"):
        load_dataset("adult", data_dir=data_dir, target="sex")
    with pytest.raises(DataError, match=r"sensitive: column\(s\) \['gender'\]"):
        load_dataset("adult", data_dir=data_dir, sensitive=["gender"])
    assert BUILTIN_DATASETS == (
        "adult",
        "credit",
        "parkinsons",
        "synthetic",
        "mnist",
        "fashion-mnist",
        "digits",
        "cifar10",
    )


@pytest.mark.slow
def test_image_datasets_via_load_dataset(data_dir: Path) -> None:
    mnist = load_dataset("MNIST", data_dir=data_dir, download=False, seed=5)  # seed does not re-split MNIST
    assert (len(mnist.train), len(mnist.test)) == (60_000, 10_000)
    assert mnist.info.num_features == 784 and mnist.info.group_names == ("all",)
    fashion = load_dataset("fashion-mnist", data_dir=data_dir, download=False)
    assert fashion.info.label_names[0] == "T-shirt/top"
    digits = load_dataset("digits", seed=2, test_fraction=0.5)
    assert (len(digits.train), len(digits.test)) == (898, 899)
    np.testing.assert_array_equal(
        digits.test.nonsensitive.features, load_digits(seed=2, test_fraction=0.5).test.nonsensitive.features
    )


def test_image_dataset_argument_errors(data_dir: Path) -> None:
    with pytest.raises(DataError, match="no sensitive attribute"):
        load_dataset("mnist", data_dir=data_dir, sensitive=["sex"])
    with pytest.raises(DataError, match="features cannot be chosen for the image dataset 'digits'"):
        load_dataset("digits", features=["pixel_0_0"])
    with pytest.raises(DataError, match="keeps its official 60,000 / 10,000 train/test split"):
        load_dataset("fashion-mnist", data_dir=data_dir, test_fraction=0.3)
    with pytest.raises(DataError, match="target is fixed for the built-in dataset 'mnist'"):
        load_dataset("mnist", data_dir=data_dir, target="label")


def test_missing_file_without_download_says_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError) as info:
        load_dataset("adult", data_dir=tmp_path, download=False)
    message = str(info.value)
    assert str(tmp_path / "adult" / "adult.data") in message
    assert "--data-dir" in message and DATA_DIR_ENV in message
    assert FILES["adult/adult.data"].sha256 in message


def test_credit_has_no_verifiable_download(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError, match="no verifiable download") as info:
        load_dataset("credit", data_dir=tmp_path)
    assert str(tmp_path / "credit_default_taiwan" / "UCI_Credit_Card.csv") in str(info.value)


def test_data_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert resolve_data_dir() == tmp_path
    assert resolve_data_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv(DATA_DIR_ENV)
    assert resolve_data_dir() == Path("~/.cache/silofl/data").expanduser()


def make_mirror(data_dir: Path, root: Path, relpaths: list[str]) -> Path:
    for rel in relpaths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data_dir / rel, root / rel)
    return root


def test_download_from_file_url_mirror(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = make_mirror(data_dir, tmp_path / "mirror", list(loaders._BUILTINS["parkinsons"].files))
    target = tmp_path / "data"
    monkeypatch.setenv(MIRROR_ENV, mirror.as_uri())
    ds = load_dataset("parkinsons", data_dir=target)  # downloads through urllib from the file:// mirror
    assert len(ds.train) == 4_406
    fetched = target / "parkinsons_telemonitoring" / "parkinsons_updrs.data"
    assert sha256_file(fetched) == FILES["parkinsons_telemonitoring/parkinsons_updrs.data"].sha256
    assert not list(target.rglob("*.part"))
    # A second load finds the local copy and does not fetch again.
    (mirror / "parkinsons_telemonitoring" / "parkinsons_updrs.data").unlink()
    assert len(load_dataset("parkinsons", data_dir=target).test) == 1_469


def test_checksum_mismatch_deletes_the_download(data_dir: Path, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    (mirror / "adult").mkdir(parents=True)
    (mirror / "adult" / "adult.data").write_bytes((data_dir / "adult" / "adult.data").read_bytes() + b"tampered")
    target = tmp_path / "data"
    with pytest.raises(ChecksumError, match="expected 5b00264637dbfec3"):
        ensure_file("adult/adult.data", target, mirror=mirror.as_uri())
    assert not (target / "adult" / "adult.data").exists()
    assert not list(target.rglob("*.part"))


def test_injected_fetch_and_failure(data_dir: Path, tmp_path: Path) -> None:
    calls: list[str] = []

    def fetch(url: str, dest: Path) -> None:
        calls.append(url)
        shutil.copyfile(data_dir / "adult" / "adult.test", dest)

    path = ensure_file("adult/adult.test", tmp_path, fetch=fetch)
    assert calls == ["https://archive.ics.uci.edu/ml/machine-learning-databases/adult/adult.test"]
    assert path.read_bytes() == (data_dir / "adult" / "adult.test").read_bytes()

    def offline(url: str, dest: Path) -> None:
        raise OSError("network is unreachable")

    with pytest.raises(DataUnavailableError, match=r"downloading .*adult\.data failed.*network is unreachable"):
        ensure_file("adult/adult.data", tmp_path, fetch=offline)
    with pytest.raises(DataError, match="unknown data file"):
        ensure_file("adult/adult.names", tmp_path)


def _credit_file(data_dir: Path, text: str) -> Path:
    """A local credit CSV holding `text` (a local file is read as it is: only a download is checked)."""
    path = data_dir / "credit_default_taiwan" / "UCI_Credit_Card.csv"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_code_the_reader_does_not_know_names_the_file_and_the_column(tmp_path: Path) -> None:
    """credit's SEX recoding (1 Male, 2 Female, `loaders._CREDIT`) refuses another code, as the reader did."""
    header = "ID,SEX,EDUCATION,MARRIAGE,AGE,default.payment.next.month"
    path = _credit_file(tmp_path, f"{header}\n1,1,2,1,30,0\n2,3,2,1,40,1\n")
    with pytest.raises(DataError, match=r"UCI_Credit_Card.csv: column 'SEX' has 1 row\(s\) with values \['3'\]"):
        load_dataset("credit", data_dir=tmp_path)
    path.write_text(path.read_text().replace("2,3,2,1", "2,2,0,0"))  # EDUCATION 0 -> 4, MARRIAGE 0 -> 3
    table = loaders.builtin_table("credit", [path])
    assert table.columns.tolist() == ["SEX", "EDUCATION", "MARRIAGE", "AGE", "default.payment.next.month"]
    assert table[["SEX", "EDUCATION", "MARRIAGE"]].values.tolist() == [["Male", 2, 1], ["Female", 4, 3]]


def test_damaged_file_is_a_clear_error(tmp_path: Path) -> None:
    _credit_file(tmp_path, "a,b\n1,2\n")
    with pytest.raises(DataError, match=r"UCI_Credit_Card.csv: columns \['ID', 'SEX'"):
        load_dataset("credit", data_dir=tmp_path)
