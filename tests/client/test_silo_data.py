"""client/silo_data.py: a deployed node's folder is loaded once per process and read again when its files change."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from flwr.app import Context, RecordDict

from silofl.client import silo_data
from silofl.client.data.federate import load_federation
from silofl.client.data.silo_store import save_silo
from silofl.protocols.messages import DataSpec


def _deployed_context(folder: Path) -> Context:
    return Context(run_id=1, node_id=7, node_config={"data-path": str(folder)}, state=RecordDict(), run_config={})


def test_a_deployed_silo_is_loaded_once_and_again_when_its_files_change(tmp_path: Path, monkeypatch) -> None:
    _, silos = load_federation("synthetic", 2)
    folder = tmp_path / "silo_0"
    save_silo(silos[0], folder)
    context = _deployed_context(folder)
    spec = DataSpec(dataset="synthetic", num_silos=2)
    silo_data._load_folder_cached.cache_clear()
    loads: list[Path] = []
    from silofl.client.data import silo_store

    real = silo_store.load_silo
    monkeypatch.setattr(silo_store, "load_silo", lambda d: loads.append(d) or real(d))

    first = silo_data.load_silo_data(context, spec)
    again = silo_data.load_silo_data(context, spec)
    assert again is first and len(loads) == 1  # the second message reads nothing
    np.testing.assert_array_equal(first.train.nonsensitive.features, silos[0].train.nonsensitive.features)

    save_silo(silos[1], folder)  # the site rewrites its folder (`silofl data split --overwrite`)
    later = os.stat(folder / "info.json").st_mtime_ns + 1_000_000
    for name in os.listdir(folder):  # a distinct modification time even on a coarse clock
        os.utime(folder / name, ns=(later, later))
    reloaded = silo_data.load_silo_data(context, spec)
    assert len(loads) == 2 and reloaded is not first
    np.testing.assert_array_equal(reloaded.train.nonsensitive.features, silos[1].train.nonsensitive.features)


def test_the_silos_read_a_csv_file_with_the_runs_separator(tmp_path) -> None:
    """A ';'-separated file that also splits on ',' into as many fields: detection picks ',' (the first of a tie);
    `csv-sep = ";"` must reach the simulated silos through the setup round's DataSpec."""
    from silofl.client.data.table_files import csv_format

    rows = ["f,1,2;sex;y"] + [f"{i},5,7;{'FM'[i % 2]};{i % 3 == 0:d}" for i in range(200)]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    assert csv_format(path).sep == ","  # what a silo reads without the option
    spec = DataSpec(dataset=str(path), target="y", sensitive="sex", num_silos=2, csv_sep=";")
    info = silo_data._partitioned(spec)[0].info
    assert info.sensitive_columns == ("sex",) and info.group_names == ("F", "M")
