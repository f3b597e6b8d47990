"""The preprocessing a run's data load records, kept for its model artifact (issue 32: no second load after a run).

`silofl run`'s checks load the data for the silos inside `client.data.preprocessing_cache.recording`; the artifact
takes the record from there. Counted here by the reads of the table (`read_table` where `generic.load_table_dataset`
looks it up): one per run, where the artifact used to read it a second time; a sweep's worker reads it once per data
spec.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from silofl.client.data import generic, preprocessing_cache
from silofl.client.data.loaders import load_dataset
from silofl.client.data.preprocessing_cache import preprocessing_of, recording
from silofl.client.data.preprocessing_file import load_preprocessing
from silofl.protocols.messages import DataSpec
from silofl.protocols.preprocessing import PreprocessingError


def _table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "age": rng.integers(18, 80, n),
            "city": rng.choice(["Lyon", "Nice", "Paris"], n),
            "sex": rng.choice(["F", "M"], n),
            "ok": rng.choice(["no", "yes"], n),
        }
    )


@pytest.fixture()
def csv(tmp_path: Path) -> Path:
    path = tmp_path / "people.csv"
    _table(120, seed=1).to_csv(path, index=False)
    return path


@pytest.fixture(autouse=True)
def nothing_kept():
    preprocessing_cache.forget()
    yield
    preprocessing_cache.forget()


def _spec(path: Path, **kwargs) -> DataSpec:
    return DataSpec(dataset=str(path), target="ok", sensitive="sex", num_silos=2, **kwargs)


def _load(path: Path):
    return load_dataset(str(path), target="ok", sensitive=["sex"])


def _no_load():
    raise AssertionError("loaded again")


@pytest.fixture()
def reads(monkeypatch) -> list[str]:
    """The tables read by the loaders (`table_files.read_table` as `generic.load_table_dataset` calls it: the silos'
    load, the artifact's; not the column check)."""
    calls: list[str] = []
    real = generic.read_table

    def counting(path, **kwargs):
        calls.append(str(path))
        return real(path, **kwargs)

    monkeypatch.setattr(generic, "read_table", counting)
    return calls


def test_a_recorded_load_is_kept_and_taken_instead_of_a_second_load(csv) -> None:
    spec = _spec(csv)
    with recording(spec):
        _load(csv)
    kept = preprocessing_of(spec, _no_load)
    assert kept.to_json() == load_preprocessing(str(csv), target="ok", sensitive=["sex"]).to_json()
    assert preprocessing_of(_spec(csv, seed=1), lambda: kept) is kept  # another spec: loaded (here: given) and kept
    assert preprocessing_of(_spec(csv, seed=1), _no_load) is kept


def test_a_rewritten_file_or_a_block_that_loads_nothing_is_loaded_again(csv) -> None:
    spec = _spec(csv)
    with recording(spec):
        pass  # e.g. the silos' cache answered: nothing was loaded, nothing is kept
    loads = []
    first = preprocessing_of(
        spec, lambda: loads.append(1) or load_preprocessing(str(csv), target="ok", sensitive=["sex"])
    )
    assert loads == [1] and preprocessing_of(spec, _no_load) is first
    _table(200, seed=2).to_csv(csv, index=False)  # the same path, other records: its statistics change
    again = preprocessing_of(spec, lambda: load_preprocessing(str(csv), target="ok", sensitive=["sex"]))
    assert again.features[0].mean != first.features[0].mean


def test_a_record_that_could_not_be_made_is_kept_as_its_error(csv) -> None:
    spec = _spec(csv)
    frame = _table(40, seed=3).assign(city=[Decimal(k % 3) for k in range(40)])  # JSON cannot hold a Decimal
    with recording(spec):
        generic.build_dataset(frame, name="people", target="ok", sensitive=["sex"])
    with pytest.raises(PreprocessingError, match="cannot be recorded"):
        preprocessing_of(spec, _no_load)


def test_at_most_kept_specs_are_kept(csv) -> None:
    record = load_preprocessing(str(csv), target="ok", sensitive=["sex"])
    for seed in range(preprocessing_cache.KEPT + 1):
        preprocessing_of(_spec(csv, seed=seed), lambda: record)
    with pytest.raises(AssertionError, match="loaded again"):
        preprocessing_of(_spec(csv, seed=0), _no_load)  # the oldest went first
    assert preprocessing_of(_spec(csv, seed=preprocessing_cache.KEPT), _no_load) is record


@pytest.mark.slow
def test_silofl_run_reads_its_table_once_for_the_silos_and_the_artifact(csv, reads, tmp_path) -> None:
    from silofl.server.cli import main

    run = tmp_path / "run"
    argv = ["run", "fedavg", "--dataset", str(csv), "--target", "ok", "--sensitive", "sex", "--silos", "2"]
    assert main([*argv, "--rounds", "2", "--no-progress", "--out", str(run)]) == 0
    assert reads == [str(csv)]  # the artifact used to read it a second time
    manifest = json.loads((run / "model.json").read_text())
    fresh = load_preprocessing(str(csv), target="ok", sensitive=["sex"])
    assert manifest["preprocessing"] == fresh.to_json()


@pytest.mark.slow
def test_a_sweep_worker_reads_a_table_once_per_data_spec(csv, reads, tmp_path) -> None:
    from silofl.client import silo_data
    from silofl.protocols.config import RunConfig
    from silofl.server.sweep import execute_run

    def config(name: str, lr: float) -> dict:
        values = {"algorithm": "fedavg", "dataset": str(csv), "target": "ok", "sensitive": "sex", "num-silos": 2}
        return RunConfig.parse({**values, "rounds": 2, "lr": lr, "out-dir": str(tmp_path / name)}).to_json()

    silo_data._partitioned.cache_clear()
    for name, lr in (("a", 0.1), ("b", 0.5)):  # two runs of one data spec, as a worker gets them from a grid
        assert execute_run(config(name, lr), {"method": "fedavg"})["ok"]
    assert reads == [str(csv)]
    for name in ("a", "b"):
        manifest = json.loads((tmp_path / name / "model.json").read_text())
        assert manifest["preprocessing"]["feature_names"] == ["age", "city=Lyon", "city=Nice", "city=Paris"]
    silo_data._partitioned.cache_clear()
