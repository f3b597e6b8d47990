"""A run's model artifact and `silofl predict | evaluate | export | model pack` (issue 32).

Trained through the real `silofl` entry point on a small loan table written here; the run's own test rows are rebuilt
from its seed (`split_indices`, the loader's split), so `silofl evaluate` must give exactly the accuracy and the
violations the run reported, and fairlearn must agree with them on the same predictions.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from silofl.client.data.generic import recording_preprocessing, split_indices
from silofl.client.data.loaders import load_dataset
from silofl.client.data.table_files import read_table
from silofl.protocols.preprocessing import (
    CategoricalFeature,
    ContinuousFeature,
    LabelMapping,
    Preprocessing,
    PreprocessingError,
    SensitiveColumn,
)
from silofl.server.cli import main
from silofl.server.model_artifact import MANIFEST_FILE, WEIGHTS_FILE
from silofl.server.trained_model import load_model

SEED = 0


def _loans(n: int, seed: int) -> pd.DataFrame:
    """A loan table: continuous age and income, categorical city and employed (boolean), sensitive sex and race, a
    yes/no target that depends on income, age, city and race."""
    rng = np.random.default_rng(seed)
    sex = rng.choice(["F", "M"], n, p=[0.45, 0.55])
    race = rng.choice(["a", "b", "c"], n, p=[0.6, 0.3, 0.1])
    city = rng.choice(["Lille", "Lyon", "Nice", "Paris"], n)
    employed = rng.random(n) < 0.7
    age = rng.integers(18, 80, n)
    income = np.round(rng.normal(3000, 900, n) + (sex == "M") * 400, 2)
    score = (
        0.002 * (income - 3000)
        + 0.03 * (age - 45)
        + (city == "Paris") * 0.8
        + employed * 0.7
        - (race == "c") * 0.5
        + rng.normal(0, 1, n)
    )
    return pd.DataFrame(
        {
            "age": age,
            "income": income,
            "city": city,
            "employed": employed,
            "sex": sex,
            "race": race,
            "approved": np.where(score > 0.3, "yes", "no"),
        }
    )


@pytest.fixture(scope="module")
def loans_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "loans.csv"
    _loans(800, seed=7).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, loans_csv) -> tuple[Path, dict]:
    """`silofl run fedavg` on the loan table (progress bar on, as a user runs it)."""
    run = tmp_path_factory.mktemp("runs") / "loans"
    argv = ["run", "fedavg", "--dataset", str(loans_csv), "--target", "approved", "--sensitive", "sex"]
    assert main([*argv, "--silos", "2", "--rounds", "4", "--seed", str(SEED), "--out", str(run)]) == 0
    return run, json.loads((run / "result.json").read_text())


@pytest.fixture(scope="module")
def test_rows(tmp_path_factory, loans_csv) -> tuple[Path, pd.DataFrame]:
    """The run's test split as raw rows (the loader's split: `split_indices` of the table by the run's seed)."""
    frame = read_table(loans_csv)
    _, test_idx = split_indices(len(frame), 0.25, SEED)
    rows = frame.iloc[test_idx].reset_index(drop=True)
    path = tmp_path_factory.mktemp("test") / "test.csv"
    rows.to_csv(path, index=False)
    return path, rows


def _json_out(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


# --- the artifact ---------------------------------------------------------------------------------------------------


def test_a_run_writes_its_model_artifact(trained) -> None:
    from safetensors.numpy import load_file

    run, result = trained
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    assert manifest["format"] == "silofl-model" and manifest["format_version"] == 1
    assert manifest["model"]["kind"] == "logreg" and manifest["model"]["hidden"] is None
    assert manifest["model"]["num_features"] == result["federation"]["num_features"]
    assert manifest["run"]["algorithm"] == "fedavg"
    assert manifest["run"]["test_metrics"] == result["final"]
    privacy = manifest["privacy"]
    assert privacy["epsilon_spent"] == result["privacy"]["epsilon_spent"] == "inf"
    assert privacy["delta"] == result["privacy"]["delta"]
    assert (
        privacy["mechanism"] == result["privacy"]["mechanism"]
        and "not differentially private" in privacy["preprocessing"]
    )
    assert manifest["label_names"] == ["no", "yes"] and manifest["group_names"] == ["F", "M"]
    assert manifest["sensitive_columns"] == ["sex"]
    assert "loaded by the command line with the silos' loader arguments" in manifest["preprocessing_source"]
    # age, income z-scored; city (4), employed (2) and race (3) one-hot; sex is sensitive, never a feature
    assert manifest["feature_names"] == [
        "age",
        "income",
        "city=Lille",
        "city=Lyon",
        "city=Nice",
        "city=Paris",
        "employed=False",
        "employed=True",
        "race=a",
        "race=b",
        "race=c",
    ]
    weights = load_file(run / WEIGHTS_FILE)
    assert [p["name"] for p in manifest["model"]["parameters"]] == list(result["model"])
    for name, values in result["model"].items():
        assert weights[name].dtype == np.float32
        assert np.array_equal(weights[name], np.asarray(values, dtype=np.float32)), name


def test_evaluate_on_the_runs_test_rows_gives_its_reported_metrics(trained, test_rows, capsys) -> None:
    run, result = trained
    path, _ = test_rows
    assert main(["evaluate", str(run), "--data", str(path), "--json"]) == 0
    report = _json_out(capsys)
    final = result["final"]
    assert report["n"] == sum(s["n_test"] for s in result["federation"]["silos"]) == 200
    assert report["accuracy"] == pytest.approx(final["accuracy"], abs=1e-12)
    assert report["demographic_parity_difference"] == pytest.approx(final["dp_violation"], abs=1e-12)
    assert report["equalized_odds_difference"] == pytest.approx(final["eo_violation"], abs=1e-12)
    assert report["equal_opportunity_difference"] == pytest.approx(final["eopp_violation"], abs=1e-12)
    by_name = {g["name"]: g for g in report["groups"]}
    for group in result["fairness_groups"]["groups"]:
        assert by_name[group["name"]]["support"] == group["support"]
        assert by_name[group["name"]]["counts"] == group["counts"]
    # the tables a person reads
    assert main(["evaluate", str(run), "--data", str(path)]) == 0
    out = capsys.readouterr().out
    assert "equalized_odds_difference" in out and f"{final['accuracy']:.4f}" in out


def test_predict_writes_predictions_consistent_with_evaluate(trained, test_rows, tmp_path, capsys) -> None:
    run, result = trained
    path, rows = test_rows
    out = tmp_path / "predictions.csv"
    assert main(["predict", str(run), "--data", str(path), "--out", str(out)]) == 0
    predictions = pd.read_csv(out)
    assert list(predictions.columns) == ["prediction", "prob_no", "prob_yes"]
    assert len(predictions) == len(rows)
    probabilities = predictions[["prob_no", "prob_yes"]].to_numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-6)
    assert (predictions["prediction"] == np.where(probabilities[:, 1] > probabilities[:, 0], "yes", "no")).all()
    accuracy = float((predictions["prediction"] == rows["approved"]).mean())
    assert accuracy == pytest.approx(result["final"]["accuracy"], abs=1e-12)
    # to stdout without --out: the same rows
    capsys.readouterr()
    assert main(["predict", str(run), "--data", str(path)]) == 0
    printed = pd.read_csv(io.StringIO(capsys.readouterr().out))
    pd.testing.assert_frame_equal(printed, predictions)
    # the Python API agrees
    model = load_model(run)
    assert (model.predict(rows) == predictions["prediction"].to_numpy()).all()
    np.testing.assert_allclose(model.predict_proba(rows), probabilities, atol=1e-7)


def test_a_semicolon_latin1_csv_is_read_as_silofl_run_reads_it(trained, test_rows, tmp_path, capsys) -> None:
    """The test rows as a ;-separated Latin-1 file (an extra column holds 'é', invalid UTF-8 there): detected and
    said on one line, or given with --csv-sep / --csv-encoding, they score exactly as the comma/UTF-8 file."""
    run, _ = trained
    path, rows = test_rows
    latin = tmp_path / "rows_latin1.csv"
    rows.assign(note="café crème").to_csv(latin, index=False, sep=";", encoding="latin-1")
    assert b"caf\xe9" in latin.read_bytes()

    def predictions(*argv: str) -> tuple[pd.DataFrame, str]:
        out = tmp_path / "p.csv"
        assert main(["predict", str(run), "--data", *argv, "--out", str(out)]) == 0
        return pd.read_csv(out), capsys.readouterr().err

    want, err = predictions(str(path))
    assert "detected" not in err  # a comma-separated UTF-8 file is not worth a line
    got, err = predictions(str(latin))
    pd.testing.assert_frame_equal(got, want)
    (line,) = [line for line in err.splitlines() if "detected" in line]
    assert line == (
        f"silofl: warning: {latin}: read with the detected separator ';' and encoding latin-1 (the file is not "
        "valid UTF-8); --csv-sep ';' --csv-encoding latin-1 sets it explicitly"
    )
    got, err = predictions(str(latin), "--csv-sep", ";", "--csv-encoding", "latin-1")
    pd.testing.assert_frame_equal(got, want)
    assert "detected" not in err
    assert main(["evaluate", str(run), "--data", str(path), "--json"]) == 0
    report = _json_out(capsys)
    assert main(["evaluate", str(run), "--data", str(latin), "--json"]) == 0
    assert {**_json_out(capsys), "data": None} == {**report, "data": None}
    # the flag is obeyed, not second-guessed: read at commas, the file has one column and the model's are missing
    assert main(["predict", str(run), "--data", str(latin), "--csv-sep", ","]) == 2
    assert "missing from the table" in capsys.readouterr().err
    assert main(["predict", str(run), "--data", str(latin), "--csv-sep", "ab"]) == 2  # refused as silofl run does
    assert "--csv-sep 'ab': give one character" in capsys.readouterr().err
    assert main(["predict", str(run), "--data", str(latin), "--csv-encoding", "klingon"]) == 2
    assert "--csv-encoding 'klingon': not an encoding Python knows" in capsys.readouterr().err
    tabbed = tmp_path / "rows.csv"
    rows.to_csv(tabbed, index=False, sep="\t")
    got, _ = predictions(str(tabbed), "--csv-sep", "tab")  # 'tab' is a tab, as in silofl run
    pd.testing.assert_frame_equal(got, want)
    parquet = tmp_path / "rows.parquet"
    rows.to_parquet(parquet)
    assert main(["predict", str(run), "--data", str(parquet), "--csv-sep", ";"]) == 2
    assert "apply to a .csv file" in capsys.readouterr().err


@pytest.mark.parametrize("sensitive", [None, "race", "sex,race"])
def test_violations_agree_with_fairlearn(trained, test_rows, capsys, sensitive) -> None:
    from fairlearn.metrics import (
        MetricFrame,
        demographic_parity_difference,
        equal_opportunity_difference,
        equalized_odds_difference,
        true_positive_rate,
    )

    run, _ = trained
    path, rows = test_rows
    argv = ["evaluate", str(run), "--data", str(path), "--json", *(["--sensitive", sensitive] if sensitive else [])]
    assert main(argv) == 0
    report = _json_out(capsys)
    columns = sensitive.split(",") if sensitive else ["sex"]
    assert report["sensitive_columns"] == columns
    y_true = (rows["approved"] == "yes").astype(int).to_numpy()  # label index 1 ("yes") is the positive label
    y_pred = (load_model(run).predict(rows) == "yes").astype(int)
    groups = rows[columns] if len(columns) > 1 else rows[columns[0]]
    kwargs = {"sensitive_features": groups}
    assert report["demographic_parity_difference"] == pytest.approx(
        demographic_parity_difference(y_true, y_pred, **kwargs), abs=1e-12
    )
    assert report["equalized_odds_difference"] == pytest.approx(
        equalized_odds_difference(y_true, y_pred, **kwargs), abs=1e-12
    )
    assert report["equal_opportunity_difference"] == pytest.approx(
        equal_opportunity_difference(y_true, y_pred, **kwargs), abs=1e-12
    )
    tpr = MetricFrame(metrics=true_positive_rate, y_true=y_true, y_pred=y_pred, **kwargs).by_group
    expected = {"|".join(k) if isinstance(k, tuple) else k: v for k, v in tpr.items()}
    got = {g["name"]: g["true_positive_rate"][1] for g in report["groups"]}
    assert got == pytest.approx(expected, abs=1e-12)
    assert report["equal_opportunity_difference"] > 0  # the comparison is not between zeros


# --- ONNX ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_onnx_export_matches_torch(trained, test_rows, tmp_path, capsys) -> None:
    import onnx
    import onnxruntime as ort

    run, result = trained
    _, rows = test_rows
    out = tmp_path / "loans.onnx"
    assert main(["export", str(run), "--format", "onnx", "--out", str(out)]) == 0
    assert "ENCODED row" in capsys.readouterr().out
    model = load_model(run)
    features = model.encode(rows).features
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["features"]
    logits, probabilities = session.run(["logits", "probabilities"], {"features": features})
    np.testing.assert_allclose(logits, model.logits_of(features), atol=1e-5, rtol=0)
    np.testing.assert_allclose(probabilities, model.predict_proba(rows), atol=1e-5, rtol=0)
    one = session.run(["logits"], {"features": features[:1]})[0]  # the batch dimension is dynamic
    np.testing.assert_allclose(one, logits[:1], atol=1e-5, rtol=0)
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert meta["silofl.algorithm"] == "fedavg" and json.loads(meta["silofl.label_names"]) == ["no", "yes"]
    assert meta["silofl.delta"] == str(result["privacy"]["delta"])
    assert "preprocessing" not in json.dumps(meta).replace("'preprocessing' says", "")  # statistics stay out


@pytest.mark.slow
def test_fedsc_run_exports_its_encoder(tmp_path, capsys) -> None:
    import onnxruntime as ort
    import torch

    from silofl.protocols.models import set_parameters
    from silofl.protocols.ssl_models import build_ssl_model, image_shape

    run = tmp_path / "sc"
    argv = ["run", "fedsc", "--silos", "2", "--partition", "iid", "--rounds", "1", "--eval-every", "1"]
    argv += ["--max-train-records", "30", "--eval-data", "none", "--projection-dim", "16"]
    assert main([*argv, "--no-progress", "--out", str(run)]) == 0
    assert not (run / MANIFEST_FILE).exists()  # no artifact for an image encoder: the hook left it alone
    assert main(["predict", str(run), "--data", str(tmp_path / "rows.csv")]) == 2
    assert "silofl export" in capsys.readouterr().err
    out = tmp_path / "encoder.onnx"
    assert main(["export", str(run), "--out", str(out)]) == 0
    result = json.loads((run / "result.json").read_text())
    width = result["federation"]["num_features"]
    model = build_ssl_model(
        result["config"]["model"], image_shape(width), projection_dim=result["config"]["projection-dim"]
    )
    with np.load(run / "model.npz") as stored:
        set_parameters(model, {k: stored[k] for k in stored.files})
    pixels = load_dataset("digits").test.nonsensitive.features[:32]
    features, z = ort.InferenceSession(str(out)).run(["features", "z"], {"pixels": pixels})
    with torch.no_grad():
        want = model.features(torch.from_numpy(pixels))
        np.testing.assert_allclose(features, want.numpy(), atol=1e-5, rtol=0)
        np.testing.assert_allclose(z, model.projector(want).numpy(), atol=1e-5, rtol=0)


def test_mu2fl_gets_an_artifact_of_its_float32_iterate_without_preprocessing(tmp_path) -> None:
    """mu2fl's server keeps x_T in float64 in the logistic regression's layout: the artifact holds the float32 cast
    its evaluation uses; digits is an image dataset, so no preprocessing, and the manifest says why."""
    from safetensors.numpy import load_file

    run = tmp_path / "mu"
    argv = ["run", "mu2fl", "--silos", "2", "--rounds", "2", "--batch-size", "32", "--no-progress", "--out", str(run)]
    assert main(argv) == 0
    result = json.loads((run / "result.json").read_text())
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    assert manifest["model"]["kind"] == "logreg" and manifest["preprocessing"] is None
    assert "image dataset" in manifest["preprocessing_source"]
    weights = load_file(run / WEIGHTS_FILE)
    for name, values in result["model"].items():
        assert np.array_equal(weights[name], np.asarray(values, dtype=np.float64).astype(np.float32)), name


# --- preprocessing ------------------------------------------------------------------------------------------------


def _recorded(dataset: str, **kwargs) -> tuple[Preprocessing, object]:
    with recording_preprocessing() as recorded:
        ds = load_dataset(dataset, **kwargs)
    (record,) = recorded
    assert isinstance(record, Preprocessing)
    return Preprocessing.from_json(json.loads(json.dumps(record.to_json()))), ds  # through JSON, as it is stored


def _assert_reencodes(preprocessing: Preprocessing, frame: pd.DataFrame, ds, seed: int = 0) -> None:
    """The record re-encodes the raw training and test rows bit for bit (features, labels, groups)."""
    assert preprocessing.feature_names == ds.info.feature_names
    assert preprocessing.label_names == ds.info.label_names and preprocessing.group_names == ds.info.group_names
    train_idx, test_idx = split_indices(len(frame), 0.25, seed)
    for idx, split in ((train_idx, ds.train), (test_idx, ds.test)):
        encoded = preprocessing.encode(frame.iloc[idx].reset_index(drop=True))
        assert encoded.features.dtype == np.float32 and encoded.features.flags.c_contiguous
        assert encoded.features.tobytes() == split.nonsensitive.features.tobytes()
        assert np.array_equal(encoded.labels, split.nonsensitive.labels)
        assert np.array_equal(encoded.groups, split.sensitive.groups)


def test_preprocessing_reencodes_a_csv_bit_for_bit(loans_csv) -> None:
    preprocessing, ds = _recorded(str(loans_csv), target="approved", sensitive=["sex", "race"], seed=3)
    assert isinstance(preprocessing.features[3], CategoricalFeature)
    assert preprocessing.features[3].categories == (False, True)  # booleans stay booleans through JSON
    assert preprocessing.target == LabelMapping("approved", ("no", "yes"), "classes", classes=("no", "yes"))
    assert preprocessing.group_names == ("F|a", "F|b", "F|c", "M|a", "M|b", "M|c")
    _assert_reencodes(preprocessing, read_table(loans_csv), ds, seed=3)


def test_preprocessing_reencodes_builtin_datasets_bit_for_bit(data_dir) -> None:
    """The built-ins' tables re-encoded, as their files hold them (the record's recoding reads credit's SEX 1/2 and
    merges its codes) and as their readers clean them (loaders.py): synthetic, credit (integer categories),
    parkinsons (a label thresholded at the training median)."""
    from silofl.client.data import loaders
    from silofl.client.data.sources import ensure_file
    from silofl.client.data.synthetic import synthetic_frame

    preprocessing, ds = _recorded("synthetic")
    _assert_reencodes(preprocessing, synthetic_frame(seed=0), ds)
    for name, kind in (("credit", "classes"), ("parkinsons", "above_threshold")):
        spec = loaders._BUILTINS[name]
        paths = [ensure_file(f, data_dir, download=False) for f in spec.files]
        preprocessing, ds = _recorded(name, data_dir=data_dir, download=False)
        assert preprocessing.target.kind == kind and preprocessing.recoding == spec.recoding
        _assert_reencodes(preprocessing, spec.read(paths), ds)
        _assert_reencodes(preprocessing, loaders.builtin_table(name, paths), ds)
        if name == "credit":
            education = next(f for f in preprocessing.features if f.column == "EDUCATION")
            assert education.categories == (1, 2, 3, 4)  # integer categories stay integers through JSON


def test_preprocessing_json_refuses_malformed_records(loans_csv) -> None:
    preprocessing, _ = _recorded(str(loans_csv), target="approved", sensitive=["sex"])
    good = preprocessing.to_json()
    with pytest.raises(PreprocessingError, match="not a silofl preprocessing record"):
        Preprocessing.from_json({**good, "format": "pickle"})
    with pytest.raises(PreprocessingError, match="format_version"):
        Preprocessing.from_json({**good, "format_version": 99})
    with pytest.raises(PreprocessingError, match="missing or wrong field"):
        Preprocessing.from_json({k: v for k, v in good.items() if k != "target"})
    with pytest.raises(PreprocessingError, match="feature_names does not follow"):
        Preprocessing.from_json({**good, "feature_names": ["x"]})
    with pytest.raises(PreprocessingError, match="std must be >= 0"):
        ContinuousFeature("age", 1.0, -2.0)


@pytest.fixture()
def small() -> Preprocessing:
    return Preprocessing(
        dataset="toy",
        features=(ContinuousFeature("age", 40.0, 10.0), CategoricalFeature("city", ("Lyon", "Paris"))),
        target=LabelMapping("ok", ("no", "yes"), "classes", classes=("no", "yes")),
        sensitive=(SensitiveColumn("sex", ("F", "M")),),
    )


_ROWS = pd.DataFrame({"age": [30, 50], "city": ["Lyon", "Paris"], "ok": ["yes", "no"], "sex": ["F", "M"]})


def test_encode_gives_features_labels_and_groups(small) -> None:
    encoded = small.encode(_ROWS)
    np.testing.assert_array_equal(encoded.features, [[-1, 1, 0], [1, 0, 1]])
    assert encoded.labels.tolist() == [1, 0] and encoded.groups.tolist() == [0, 1]
    without = small.encode(_ROWS.drop(columns=["ok", "sex"]))  # predict needs neither
    assert without.labels is None and without.groups is None


@pytest.mark.parametrize(
    ("frame", "pattern"),
    [
        (_ROWS.drop(columns=["city"]), r"\['city'\] missing .*add them"),
        (_ROWS.assign(city=["Lyon", "Nice"]), r"'city' has 1 row.*\['Nice'\].*--unseen zeros"),
        (_ROWS.assign(age=["30", "old"]), r"'age' has 1 non-numeric value.*\['old'\].*fix or drop"),
        (_ROWS.assign(age=[30, None]), r"'age' has 1 missing value.*does not impute"),
        (_ROWS.assign(age=[30, np.inf]), r"'age' has 1 infinite"),
        (_ROWS.assign(age=[True, False]), r"'age' holds booleans"),
    ],
    ids=["missing column", "unseen category", "non-numeric", "missing value", "infinite", "boolean"],
)
def test_encode_refuses_bad_features_naming_the_column_and_the_fix(small, frame, pattern) -> None:
    with pytest.raises(PreprocessingError, match=pattern):
        small.encode_features(frame)


def test_encode_refuses_unknown_labels_and_groups(small) -> None:
    with pytest.raises(PreprocessingError, match=r"'ok' has 1 row.*\['maybe'\] outside the run's labels"):
        small.encode_labels(_ROWS.assign(ok=["yes", "maybe"]))
    with pytest.raises(PreprocessingError, match=r"'sex' has 1 row.*\['X'\].*--sensitive sex"):
        small.encode_groups(_ROWS.assign(sex=["F", "X"]))


def test_unseen_zeros_warns_and_encodes_an_all_zeros_block(small) -> None:
    rows = pd.DataFrame({"age": [30, 50], "city": ["Lyon", "Nice"]})
    with pytest.warns(UserWarning, match=r"'city': 1 row\(s\) with unseen categories \['Nice'\]"):
        features = small.encode_features(rows, unseen="zeros")
    np.testing.assert_array_equal(features, [[-1, 1, 0], [1, 0, 0]])


def test_values_match_by_text_when_the_file_reads_another_type() -> None:
    preprocessing = Preprocessing(
        dataset="toy",
        features=(CategoricalFeature("level", (1, 2, 3)),),
        target=LabelMapping("y", ("0", "1"), "classes", classes=(0, 1)),
        sensitive=(SensitiveColumn("s", (0, 1)),),
    )
    as_text = pd.DataFrame({"level": ["3", "1"], "y": ["1", "0"], "s": ["0", "1"]})
    as_float = pd.DataFrame({"level": [3.0, 1.0], "y": [1.0, 0.0], "s": [0.0, 1.0]})
    for frame in (as_text, as_float):
        encoded = preprocessing.encode(frame)
        np.testing.assert_array_equal(encoded.features, [[0, 0, 1], [1, 0, 0]])
        assert encoded.labels.tolist() == [1, 0] and encoded.groups.tolist() == [0, 1]


# --- deployment: data split, model pack ---------------------------------------------------------------------------


def test_data_split_writes_the_preprocessing_and_model_pack_uses_it(trained, test_rows, loans_csv, tmp_path, capsys):
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    run, result = trained
    split = tmp_path / "split"
    argv = ["data", "split", str(loans_csv), "--silos", "2", "--target", "approved", "--sensitive", "sex"]
    assert main([*argv, "--seed", str(SEED), "--out", str(split)]) == 0
    assert "preprocessing.json" in capsys.readouterr().out
    written = Preprocessing.load(split / "preprocessing.json")
    assert written.to_json() == load_model(run).preprocessing.to_json()  # the simulation's record, from the split

    # A run whose silos read those folders (as deployed silos do) takes the split's file.
    config = RunConfig.parse(
        {"algorithm": "fedavg", "num-silos": 2, "rounds": 2, "out-dir": str(tmp_path / "folders"), "seed": SEED}
    )
    run_job(config, progress=False, node_configs=[{"data-path": str(split / f"silo_{k}")} for k in range(2)])
    manifest = json.loads((tmp_path / "folders" / MANIFEST_FILE).read_text())
    assert str(split / "preprocessing.json") in manifest["preprocessing_source"]
    assert manifest["preprocessing"] == written.to_json()

    # A deployed run's folder holds result.json only: evaluate says how to pack it; pack with the split's file.
    deployed = tmp_path / "deployed"
    deployed.mkdir()
    shutil.copy(run / "result.json", deployed / "result.json")
    path, _ = test_rows
    assert main(["evaluate", str(deployed), "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no model artifact" in err and f"silofl model pack {deployed} --preprocessing" in err
    assert main(["model", "pack", str(deployed), "--preprocessing", str(split / "preprocessing.json")]) == 0
    assert "model artifact:" in capsys.readouterr().out
    assert main(["evaluate", str(deployed), "--data", str(path), "--json"]) == 0
    assert _json_out(capsys)["accuracy"] == pytest.approx(result["final"]["accuracy"], abs=1e-12)
    assert (deployed / WEIGHTS_FILE).read_bytes() == (run / WEIGHTS_FILE).read_bytes()

    # A preprocessing file of other data is refused.
    other = tmp_path / "other"
    assert main([*argv, "--features", "age,city", "--out", str(other)]) == 0
    capsys.readouterr()
    assert main(["model", "pack", str(deployed), "--preprocessing", str(other / "preprocessing.json")]) == 2
    assert "encodes 5 features but the model takes 11" in capsys.readouterr().err


def test_an_image_split_writes_no_preprocessing(tmp_path, capsys) -> None:
    out = tmp_path / "digits"
    out.mkdir()
    (out / "preprocessing.json").write_text("{}")  # a stale one from an earlier split must not survive
    assert main(["data", "split", "digits", "--silos", "2", "--out", str(out)]) == 0
    assert "no preprocessing.json" in capsys.readouterr().out
    assert not (out / "preprocessing.json").exists()


# --- bad input ----------------------------------------------------------------------------------------------------


def test_bad_input_is_a_clear_error_with_exit_2(trained, test_rows, tmp_path, capsys) -> None:
    run, _ = trained
    path, rows = test_rows

    def fails(argv: list[str], *needles: str) -> None:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        for needle in needles:
            assert needle in err, (needle, err)

    fails(["predict", str(run), "--data", str(tmp_path / "nope.csv")], "nope.csv: no such file")
    fails(["predict", str(tmp_path / "norun"), "--data", str(path)], "norun: no such run folder")
    no_city = tmp_path / "no_city.csv"
    rows.drop(columns=["city"]).to_csv(no_city, index=False)
    fails(["predict", str(run), "--data", str(no_city)], "['city'] missing", "add them")
    unseen = tmp_path / "unseen.csv"
    rows.assign(city=rows["city"].where(rows.index != 3, "Bordeaux")).to_csv(unseen, index=False)
    fails(["evaluate", str(run), "--data", str(unseen)], "'city'", "['Bordeaux']", "--unseen zeros")
    assert (
        main(["predict", str(run), "--data", str(unseen), "--unseen", "zeros", "--out", str(tmp_path / "p.csv")]) == 0
    )
    assert (
        "silofl: warning: feature column 'city': 1 row(s) with unseen categories ['Bordeaux']"
        in capsys.readouterr().err
    )
    fails(["evaluate", str(run), "--data", str(no_city), "--sensitive", "nosuch"], "['city'] missing")
    no_target = tmp_path / "no_target.csv"
    rows.drop(columns=["approved"]).to_csv(no_target, index=False)
    fails(["evaluate", str(run), "--data", str(no_target)], "no target column 'approved'")
    fails(["export", str(run), "--out", str(tmp_path / "model.bin")], "ending in .onnx")
    old = tmp_path / "old_run"
    old.mkdir()
    shutil.copy(run / "result.json", old / "result.json")  # a run from before artifacts
    fails(["predict", str(old), "--data", str(path)], "no model artifact (model.json)", f"silofl model pack {old}")
    fails(["export", str(old), "--out", str(tmp_path / "m.onnx")], "no model artifact")
    deployed = json.loads((old / "result.json").read_text())
    (old / "result.json").write_text(json.dumps({**deployed, "engine": "flower"}))
    fails(["model", "pack", str(old)], "ran under Flower", "--preprocessing DIR/preprocessing.json")
    (old / "result.json").write_text(json.dumps(deployed))
    assert main(["model", "pack", str(old)]) == 0  # a simulated run: its dataset is loaded again
    assert (old / WEIGHTS_FILE).read_bytes() == (run / WEIGHTS_FILE).read_bytes()
    (old / WEIGHTS_FILE).write_bytes((old / WEIGHTS_FILE).read_bytes()[:-4] + b"\0\0\0\0")
    fails(["predict", str(old), "--data", str(path)], "sha256 differs", "silofl model pack")


def test_a_model_without_preprocessing_says_how_to_get_one(trained, test_rows, tmp_path, capsys) -> None:
    run, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    manifest["preprocessing"], manifest["preprocessing_source"] = None, "none: removed before sharing"
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert main(["predict", str(copy), "--data", str(test_rows[0])]) == 2
    err = capsys.readouterr().err
    assert "no preprocessing (none: removed before sharing)" in err and "--preprocessing" in err
    model = load_model(copy)  # the model itself still loads and scores encoded rows
    features = load_model(run).encode(test_rows[1]).features
    np.testing.assert_array_equal(model.logits_of(features), load_model(run).logits_of(features))


@pytest.mark.slow
def test_a_user_models_artifact_is_rebuilt_from_its_factory(tmp_path, loans_csv, test_rows, capsys, monkeypatch):
    """A run of a user's model (`--model module:factory`) gets the artifact too: predict, evaluate and export import
    the factory again, and say which module they could not import."""
    import onnxruntime as ort

    run = tmp_path / "user"
    argv = ["run", "fedavg", "--dataset", str(loans_csv), "--target", "approved", "--sensitive", "sex"]
    argv += ["--model", "tests.custom_models:tiny", "--silos", "2", "--rounds", "4", "--seed", str(SEED)]
    assert main([*argv, "--out", str(run)]) == 0
    result = json.loads((run / "result.json").read_text())
    assert (run / MANIFEST_FILE).is_file()
    path, rows = test_rows
    capsys.readouterr()
    assert main(["evaluate", str(run), "--data", str(path), "--json"]) == 0
    report = _json_out(capsys)
    assert report["accuracy"] == pytest.approx(result["final"]["accuracy"], abs=1e-12)
    assert report["demographic_parity_difference"] == pytest.approx(result["final"]["dp_violation"], abs=1e-12)
    out = tmp_path / "user.onnx"
    assert main(["export", str(run), "--format", "onnx", "--out", str(out)]) == 0
    model = load_model(run)
    features = model.encode(rows).features
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["logits"], {"features": features})[0], model.logits_of(features), atol=1e-5)
    # where the factory's module cannot be imported, the error names it
    import sys

    monkeypatch.setitem(sys.modules, "tests.custom_models", None)
    capsys.readouterr()
    assert main(["evaluate", str(run), "--data", str(path)]) == 2
    assert "tests.custom_models" in capsys.readouterr().err
