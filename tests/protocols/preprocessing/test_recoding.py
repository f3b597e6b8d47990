"""The built-in datasets' reader-level recoding as data (issue 32).

credit's reader reads SEX 1/2 as Male/Female and merges undocumented EDUCATION and MARRIAGE codes; parkinsons' reads
sex 0/1; adult's drops the '.' of adult.test's labels. These are `protocols.preprocessing.Recoding` tables, applied by
the loaders and recorded in the preprocessing (JSON), so `silofl predict | evaluate` on raw rows of the original file
give what they give on the loader's rows; an artifact written before the field still works on cleaned rows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from silofl.client.data import loaders
from silofl.client.data.generic import recording_preprocessing
from silofl.client.data.sources import ensure_file
from silofl.protocols.preprocessing import (
    CategoricalFeature,
    LabelMapping,
    Preprocessing,
    PreprocessingError,
    Recoding,
    SensitiveColumn,
    ValueMap,
)
from silofl.server.cli import main
from silofl.server.model_artifact import MANIFEST_FILE
from silofl.server.trained_model import load_model

SEX = ValueMap("SEX", ((1, "Male"), (2, "Female")), others="error")
EDUCATION = ValueMap("EDUCATION", ((0, 4), (5, 4), (6, 4)))


# --- the table ----------------------------------------------------------------------------------------------------


def test_a_value_map_recodes_by_value_then_by_text_and_leaves_its_own_output_alone() -> None:
    out = SEX.apply(pd.Series([1, 2, 2, 1], name="SEX"))
    assert out.tolist() == ["Male", "Female", "Female", "Male"] and out.name == "SEX"
    assert SEX.apply(out).tolist() == out.tolist()  # the reader's rows: applied twice is applied once
    mixed = SEX.apply(pd.Series(["2", 1.0, "Male", None], dtype=object))  # text, float, already recoded, missing
    assert mixed[:3].tolist() == ["Female", "Male", "Male"] and pd.isna(mixed[3])
    codes = EDUCATION.apply(pd.Series([0, 1, 5, 6, 4, 3]))
    assert codes.tolist() == [4, 1, 4, 4, 4, 3] and codes.dtype == np.int64  # codes stay integers
    untouched = pd.Series([1, 2, 3])
    assert EDUCATION.apply(untouched) is untouched


def test_a_value_map_refuses_unknown_values_and_maps_that_are_not_idempotent() -> None:
    with pytest.raises(PreprocessingError, match=r"'SEX' has 2 row\(s\) with values \['3'\].*reads 1 as 'Male'"):
        SEX.apply(pd.Series([1, 3, 3]))
    assert EDUCATION.apply(pd.Series([7])).tolist() == [7]  # others "keep": left for the encoder to judge
    with pytest.raises(PreprocessingError, match="applied twice"):
        ValueMap("x", ((1, 2), (2, 3)))
    with pytest.raises(PreprocessingError, match="others must be 'keep' or 'error'"):
        ValueMap("x", ((1, 2),), others="drop")  # type: ignore[arg-type]
    with pytest.raises(PreprocessingError, match="recoded twice, or recoded and dropped"):
        Recoding(drop=("SEX",), values=(SEX,))


def _toy(recoding: Recoding) -> Preprocessing:
    return Preprocessing(
        dataset="toy",
        features=(CategoricalFeature("EDUCATION", (1, 2, 3, 4)),),
        target=LabelMapping("y", ("no", "yes"), "classes", classes=(0, 1)),
        sensitive=(SensitiveColumn("SEX", ("Female", "Male")),),
        recoding=recoding,
    )


def test_the_recoding_travels_in_the_preprocessings_json_and_encode_applies_it() -> None:
    recoded = _toy(Recoding(drop=("ID",), values=(SEX, EDUCATION)))
    document = json.loads(json.dumps(recoded.to_json()))
    assert document["format_version"] == 2  # an older silofl refuses it rather than encode raw rows wrongly
    sex = {"column": "SEX", "values": [[1, "Male"], [2, "Female"]], "others": "error"}
    assert document["recoding"] == {"drop": ["ID"], "values": [sex, EDUCATION.to_json()]}
    again = Preprocessing.from_json(document)
    assert again == recoded
    raw = pd.DataFrame({"ID": [7, 8], "EDUCATION": [0, 2], "y": [1, 0], "SEX": [2, 1]})
    clean = pd.DataFrame({"EDUCATION": [4, 2], "y": [1, 0], "SEX": ["Female", "Male"]})
    for name, got in zip(("features", "labels", "groups"), again.encode(raw), strict=True):
        np.testing.assert_array_equal(got, getattr(again.encode(clean), name))
    assert again.encode(raw).groups.tolist() == [0, 1]
    assert again.recoding.apply(raw).columns.tolist() == ["EDUCATION", "y", "SEX"]  # the reader drops ID
    assert again.recode(raw).to_dict("list") == {
        "ID": [7, 8],
        "EDUCATION": [4, 2],
        "y": [1, 0],
        "SEX": ["Female", "Male"],
    }
    plain = _toy(Recoding())
    assert plain.to_json()["format_version"] == 1 and "recoding" not in plain.to_json()  # as before recodings
    with pytest.raises(PreprocessingError, match=r"'EDUCATION'.*\['0'\]"):
        plain.encode_features(raw)  # without the recoding, a raw code is an unseen category
    with pytest.raises(PreprocessingError, match="dropped by the reader but used"):
        _toy(Recoding(drop=("EDUCATION",)))


def test_builtin_loaders_record_their_readers_recoding(data_dir) -> None:
    records = {}
    for name in ("adult", "credit", "parkinsons"):
        with recording_preprocessing() as recorded:
            loaders.load_dataset(name, data_dir=data_dir, download=False)
        (records[name],) = recorded
    assert records["credit"].recoding == loaders._BUILTINS["credit"].recoding
    assert records["credit"].recoding.drop == ("ID",)
    assert {v.column for v in records["credit"].recoding.values} == {"SEX", "EDUCATION", "MARRIAGE"}
    assert [v.column for v in records["parkinsons"].recoding.values] == ["sex"]
    assert [v.column for v in records["adult"].recoding.values] == ["income"]
    # adult.test's labels as the file writes them
    income = records["adult"].encode_labels(pd.DataFrame({"income": ["<=50K.", ">50K.", ">50K", "<=50K"]}))
    assert income.tolist() == [0, 1, 1, 0]


# --- predict and evaluate on the original file ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def credit_run(tmp_path_factory, data_dir) -> Path:
    run = tmp_path_factory.mktemp("runs") / "credit"
    argv = ["run", "fedavg", "--dataset", "credit", "--data-dir", str(data_dir), "--silos", "2", "--rounds", "2"]
    assert main([*argv, "--max-train-records", "200", "--no-progress", "--out", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def credit_rows(tmp_path_factory, data_dir) -> tuple[Path, Path]:
    """The same 400 records twice: as the original CSV holds them (ID, SEX 1/2, EDUCATION 0..6, MARRIAGE 0..3) and as
    the loader cleans them; every record with a code the reader merges is among them."""
    spec = loaders._BUILTINS["credit"]
    paths = [ensure_file(f, data_dir, download=False) for f in spec.files]
    raw = pd.read_csv(paths[0]).dropna().reset_index(drop=True)  # the reader drops the 2 rows with a missing AGE
    clean = loaders.builtin_table("credit", paths)
    merged = raw.index[raw["EDUCATION"].isin([0, 5, 6]) | (raw["MARRIAGE"] == 0)]
    rows = np.union1d(merged, np.arange(0, len(raw), 250))[:400]
    folder = tmp_path_factory.mktemp("credit_rows")
    raw.iloc[rows].to_csv(folder / "raw.csv", index=False)
    clean.iloc[rows].to_csv(folder / "clean.csv", index=False)
    assert raw.iloc[rows]["EDUCATION"].isin([0, 5, 6]).sum() > 100
    return folder / "raw.csv", folder / "clean.csv"


def _predict(run: Path, data: Path, out: Path) -> pd.DataFrame:
    assert main(["predict", str(run), "--data", str(data), "--out", str(out)]) == 0
    return pd.read_csv(out)


@pytest.mark.slow
def test_raw_rows_of_the_original_file_predict_and_evaluate_as_the_loaders_rows(
    credit_run, credit_rows, tmp_path, capsys
) -> None:
    raw, clean = credit_rows
    manifest = json.loads((credit_run / MANIFEST_FILE).read_text())
    assert manifest["preprocessing"]["recoding"]["drop"] == ["ID"]
    want = _predict(credit_run, clean, tmp_path / "clean.csv")
    pd.testing.assert_frame_equal(_predict(credit_run, raw, tmp_path / "raw.csv"), want)
    assert want["prediction"].nunique() == 2 or want["prob_default"].std() > 0  # not a constant answer
    for extra in ([], ["--sensitive", "EDUCATION"], ["--sensitive", "SEX,MARRIAGE"]):
        reports = []
        for data in (raw, clean):
            assert main(["evaluate", str(credit_run), "--data", str(data), "--json", *extra]) == 0
            reports.append({**json.loads(capsys.readouterr().out), "data": None})
        assert reports[0] == reports[1], extra
    assert [g["name"] for g in reports[0]["groups"]][:2] == ["Female|1", "Female|2"]  # SEX read as the reader does

    # An artifact from before the recoding was recorded: the reader's rows as before; raw rows a clear refusal.
    old = tmp_path / "old"
    shutil.copytree(credit_run, old)
    del manifest["preprocessing"]["recoding"]
    manifest["preprocessing"]["format_version"] = 1
    (old / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert load_model(old).preprocessing.recoding == Recoding()
    pd.testing.assert_frame_equal(_predict(old, clean, tmp_path / "old.csv"), want)
    assert main(["predict", str(old), "--data", str(raw)]) == 2
    assert "feature column 'EDUCATION'" in capsys.readouterr().err
