"""Tests for client/data/silo_store.py and the `data split` command that writes silo stores (split_cli.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from silofl.client.data.loaders import load_dataset
from silofl.client.data.partition import partition_dataset
from silofl.client.data.silo_store import (
    INFO_FILE,
    NONSENSITIVE_FILE,
    SENSITIVE_FILE,
    SiloStoreError,
    load_silo,
    save_silo,
)
from silofl.client.data.split_cli import add_data_parser, split_command
from silofl.client.data.synthetic import make_synthetic
from silofl.client.data.tabular import SiloData


def assert_same_silo(a: SiloData, b: SiloData) -> None:
    assert a.info == b.info
    assert (a.silo_id, a.num_silos) == (b.silo_id, b.num_silos)
    for split_a, split_b in ((a.train, b.train), (a.test, b.test)):
        for x, y in (
            (split_a.nonsensitive.features, split_b.nonsensitive.features),
            (split_a.nonsensitive.labels, split_b.nonsensitive.labels),
            (split_a.sensitive.groups, split_b.sensitive.groups),
        ):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


@pytest.fixture
def silo() -> SiloData:
    return partition_dataset(make_synthetic(600, seed=1), 3, seed=0)[2]


def test_roundtrip(silo: SiloData, tmp_path: Path) -> None:
    save_silo(silo, tmp_path / "s")
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [INFO_FILE, NONSENSITIVE_FILE, SENSITIVE_FILE]
    loaded = load_silo(tmp_path / "s")
    assert_same_silo(silo, loaded)
    assert loaded.train.nonsensitive.features.flags.c_contiguous
    # The protected attribute is only in the sensitive file.
    with np.load(tmp_path / "s" / NONSENSITIVE_FILE) as archive:
        assert sorted(archive.files) == ["test_features", "test_labels", "train_features", "train_labels"]
    # Saving again replaces the files in place.
    other = partition_dataset(make_synthetic(600, seed=1), 3, seed=0)[0]
    save_silo(other, tmp_path / "s")
    assert_same_silo(other, load_silo(tmp_path / "s"))


def test_adult_silo_loads_from_its_arrays_alone(data_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """A stored silo loads from its own arrays: no table is read or encoded again (that is what makes it fast;
    the time itself is a benchmark's, not a test's), and the loaded silo is the saved one."""
    import pandas as pd

    silos = partition_dataset(load_dataset("adult", data_dir=data_dir), 3, seed=0)
    save_silo(silos[0], tmp_path / "adult0")

    def no_table(*args, **kwargs):
        raise AssertionError("load_silo read a table")

    for reader in ("read_csv", "read_parquet", "read_table"):
        monkeypatch.setattr(pd, reader, no_table)
    assert_same_silo(silos[0], load_silo(tmp_path / "adult0"))


def test_missing_files_are_named(silo: SiloData, tmp_path: Path) -> None:
    with pytest.raises(SiloStoreError, match="no such silo directory"):
        load_silo(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SiloStoreError, match=r"info\.json: missing; this is not a silo directory"):
        load_silo(tmp_path / "empty")
    save_silo(silo, tmp_path / "s")
    (tmp_path / "s" / SENSITIVE_FILE).unlink()
    with pytest.raises(SiloStoreError, match=r"sensitive\.npz: missing"):
        load_silo(tmp_path / "s")


def test_corrupt_files_are_named(silo: SiloData, tmp_path: Path) -> None:
    save_silo(silo, tmp_path / "s")
    good = (tmp_path / "s" / NONSENSITIVE_FILE).read_bytes()
    (tmp_path / "s" / NONSENSITIVE_FILE).write_bytes(good[: len(good) // 2])
    with pytest.raises(SiloStoreError, match=r"nonsensitive\.npz: corrupt"):
        load_silo(tmp_path / "s")
    (tmp_path / "s" / NONSENSITIVE_FILE).write_bytes(good)
    (tmp_path / "s" / INFO_FILE).write_text("{not json")
    with pytest.raises(SiloStoreError, match=r"info\.json: corrupt JSON"):
        load_silo(tmp_path / "s")


def test_wrong_version_and_inconsistent_files(silo: SiloData, tmp_path: Path) -> None:
    save_silo(silo, tmp_path / "s")
    info_path = tmp_path / "s" / INFO_FILE
    meta = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(SiloStoreError, match="format version 99"):
        load_silo(tmp_path / "s")
    info_path.write_text(json.dumps({**meta, "num_train": meta["num_train"] + 1}))
    with pytest.raises(SiloStoreError, match=r"inconsistent.*train split has"):
        load_silo(tmp_path / "s")
    info_path.write_text(json.dumps({**meta, "group_names": ["only"]}))
    with pytest.raises(SiloStoreError, match="group 1 out of range"):
        load_silo(tmp_path / "s")
    # A sensitive archive with wrong-length groups breaks the alignment of the divisions.
    np.savez(tmp_path / "s" / SENSITIVE_FILE, train_groups=np.zeros(3, np.int64), test_groups=np.zeros(3, np.int64))
    info_path.write_text(json.dumps(meta))
    with pytest.raises(SiloStoreError, match="aligned by record index"):
        load_silo(tmp_path / "s")


# --- `silofl data split` ----------------------------------------------------------------------------------------------


def split_args(*argv: str) -> argparse.Namespace:
    """`silofl data split ARGV...` as the CLI parses it."""
    parser = argparse.ArgumentParser(prog="silofl")
    add_data_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["data", "split", *argv])


def test_split_command_writes_silos_and_prints_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    args = split_args(
        "synthetic",
        "--silos",
        "3",
        "--partition",
        "attribute",
        "--heterogeneity",
        "0.75",
        "--seed",
        "4",
        "--out",
        str(out),
    )
    assert args.func is split_command
    assert split_command(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["preprocessing.json", "silo_0", "silo_1", "silo_2"]
    expected = partition_dataset(load_dataset("synthetic", seed=4), 3, method="attribute", heterogeneity=0.75, seed=4)
    for k in range(3):
        assert_same_silo(expected[k], load_silo(out / f"silo_{k}"))
    printed = capsys.readouterr().out
    assert "synthetic: 3 silos" in printed
    assert str(len(expected[1].train)) in printed and "g0" in printed


def test_split_command_refuses_to_clobber_and_cleans_stale_silos(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert split_command(split_args("synthetic", "--silos", "4", "--out", str(out))) == 0
    assert split_command(split_args("synthetic", "--silos", "2", "--out", str(out))) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert split_command(split_args("synthetic", "--silos", "2", "--out", str(out), "--overwrite")) == 0
    # silo_2, silo_3 of the old split removed; the encoding of the records written anew beside the folders
    assert sorted(p.name for p in out.iterdir()) == ["preprocessing.json", "silo_0", "silo_1"]
    assert load_silo(out / "silo_1").num_silos == 2


def test_split_command_generic_file(tmp_path: Path) -> None:
    import pandas as pd

    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {
            "age": rng.integers(20, 70, 200),
            "x": rng.normal(size=200),
            "race": rng.choice(["a", "b"], 200),
            "sex": rng.choice(["f", "m"], 200),
            "y": rng.choice(["no", "yes"], 200),
        }
    )
    table.to_csv(tmp_path / "t.csv", index=False)
    args = split_args(
        str(tmp_path / "t.csv"),
        "--silos",
        "2",
        "--target",
        "y",
        "--sensitive",
        "race,sex",
        "--features",
        "age,x",
        "--out",
        str(tmp_path / "o"),
    )
    assert split_command(args) == 0
    silo = load_silo(tmp_path / "o" / "silo_0")
    assert silo.info.group_names == ("a|f", "a|m", "b|f", "b|m")
    assert silo.info.feature_names == ("age", "x")


def test_split_command_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = split_args(
        "synthetic", "--silos", "3", "--partition", "iid", "--heterogeneity", "0.5", "--out", str(tmp_path / "o")
    )
    assert split_command(args) == 2
    assert "only applies to method='attribute'" in capsys.readouterr().err
    args = split_args(
        "adult", "--silos", "3", "--data-dir", str(tmp_path / "none"), "--no-download", "--out", str(tmp_path / "o")
    )
    assert split_command(args) == 2
    err = capsys.readouterr().err
    assert "adult/adult.data" in err and "SILOFL_DATA_DIR" in err
    assert not (tmp_path / "o").exists()
