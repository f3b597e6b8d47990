"""client/data/party_store.py and `silofl data split --topology`: one directory per feature and sensitive party."""

from __future__ import annotations

import contextlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from silofl.client.data.loaders import load_dataset
from silofl.client.data.party_store import INFO_FILE, load_party, read_party_info, save_party
from silofl.client.data.silo_store import SiloStoreError
from silofl.client.data.topology import FeaturePartyData, SensitivePartyData, split_parties
from silofl.server.cli import main


@pytest.fixture(scope="module")
def parties():
    return split_parties(load_dataset("synthetic", seed=0), "general", feature_parties=2, sensitive_parties=3, seed=5)


def _same(a, b) -> None:
    assert type(a) is type(b) and a.info == b.info and a.party_id == b.party_id
    for name in ("train_ids", "test_ids"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    if isinstance(a, FeaturePartyData):
        for split in ("train", "test"):
            np.testing.assert_array_equal(getattr(a, split).features, getattr(b, split).features)
            np.testing.assert_array_equal(getattr(a, split).labels, getattr(b, split).labels)
    else:
        np.testing.assert_array_equal(a.train_groups, b.train_groups)
        np.testing.assert_array_equal(a.test_groups, b.test_groups)


def test_parties_roundtrip_and_a_feature_directory_holds_no_sensitive_value(parties, tmp_path: Path) -> None:
    features, sensitive = parties
    for party, role in [(features[1], "features"), (sensitive[2], "sensitive")]:
        folder = tmp_path / f"{role}_{party.party_id}"
        save_party(party, folder, num_parties=3)
        _same(party, load_party(folder, role=role))
        assert read_party_info(folder)["role"] == role
    files = sorted(p.name for p in (tmp_path / "features_1").iterdir())
    assert files == ["features.npz", "info.json"]
    with zipfile.ZipFile(tmp_path / "features_1" / "features.npz") as archive:
        assert not any("group" in name for name in archive.namelist())
    info = json.loads((tmp_path / "features_1" / INFO_FILE).read_text())  # public metadata only: counts and names
    assert set(info) == {
        *("format", "version", "role", "party_id", "num_parties", "num_train", "num_test", "name"),
        *("feature_names", "label_names", "sensitive_columns", "group_names"),
    }


def test_a_node_with_the_wrong_role_or_a_bad_directory_is_refused(parties, tmp_path: Path) -> None:
    features, _ = parties
    save_party(features[0], tmp_path / "f", num_parties=2)
    with pytest.raises(SiloStoreError, match="holds a features party's data but this node's role is 'sensitive'"):
        load_party(tmp_path / "f", role="sensitive")
    with pytest.raises(SiloStoreError, match="not a party directory"):
        load_party(tmp_path / "nothing")
    info = json.loads((tmp_path / "f" / INFO_FILE).read_text())
    (tmp_path / "f" / INFO_FILE).write_text(json.dumps({**info, "num_train": info["num_train"] + 1}))
    with pytest.raises(SiloStoreError, match="inconsistent"):
        load_party(tmp_path / "f")
    (tmp_path / "f" / "features.npz").write_bytes(b"not a zip")
    with pytest.raises(SiloStoreError, match="corrupt"):
        load_party(tmp_path / "f")


@pytest.mark.parametrize(
    ("argv", "dirs"),
    [
        (
            ["--topology", "divided"],
            ["features_0", "features_1", "features_2", "sensitive_0", "sensitive_1", "sensitive_2"],
        ),
        (["--topology", "central-sensitive"], ["features_0", "features_1", "features_2", "sensitive_0"]),
        (
            ["--topology", "general", "--sensitive-parties", "2"],
            ["features_0", "features_1", "features_2", "sensitive_0", "sensitive_1"],
        ),
        (
            ["--topology", "general", "--sensitive-parties", "2", "--sensitive-by", "age"],
            ["features_0", "features_1", "features_2", "sensitive_0", "sensitive_1"],
        ),
    ],
)
def test_silofl_data_split_writes_one_directory_per_party(argv, dirs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    common = ["data", "split", "synthetic", "--silos", "3", "--partition", "attribute", "--heterogeneity", "0.75"]
    assert main([*common, *argv, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == dirs
    assert (out / "preprocessing.json").is_file()  # beside the folders: how a raw record is encoded
    loaded = [load_party(out / d) for d in dirs]
    features = [p for p in loaded if isinstance(p, FeaturePartyData)]
    sensitive = [p for p in loaded if isinstance(p, SensitivePartyData)]
    ids = np.sort(np.concatenate([p.train_ids for p in features]))
    np.testing.assert_array_equal(ids, np.sort(np.concatenate([p.train_ids for p in sensitive])))
    assert "feature and" in capsys.readouterr().out
    # the old silos of an earlier split in the same folder are replaced with --overwrite only
    assert main([*common, "--out", str(out)]) == 2
    assert main([*common, "--out", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["silo_0", "silo_1", "silo_2"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--topology", "general"], "needs --sensitive-parties"),
        (["--topology", "divided", "--sensitive-parties", "2"], "--sensitive-parties is for --topology general"),
        (["--sensitive-parties", "2"], "--sensitive-parties is for --topology general"),
        (["--sensitive-by", "age"], "--sensitive-by is for --topology general"),
        (["--topology", "central-sensitive", "--sensitive-by", "age"], "--sensitive-by is for --topology general"),
        (["--topology", "general", "--sensitive-parties", "2", "--sensitive-by", "zip"], "'zip' is not a feature"),
        (["--topology", "star"], "invalid choice"),
    ],
)
def test_bad_topology_options_are_clear_errors(argv, needle, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) if "star" in argv else contextlib.nullcontext():
        code = main(["data", "split", "synthetic", "--silos", "2", *argv, "--out", str(tmp_path / "o")])
        assert code == 2
    captured = capsys.readouterr()
    assert needle in captured.err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())  # nothing written
