"""`silofl plot`: figures from real run folders (small sweeps on the synthetic and digits datasets), checked on the
matplotlib Figure objects (curves, points, bars, error bars against the result.json files) and on the files."""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

from server.cli import main
from server.plots import (
    RunRecord,
    build_figures,
    default_method,
    fairness_figures,
    filter_runs,
    load_runs,
    mean_sd,
    save_figures,
    varied_keys,
)
from server.sweep import load_sweep, run_sweep

TABULAR = """
[base]
dataset = "synthetic"
rounds = 10
eval-every = 10
batch-size = 64
fairness = "dp"

[grid]
seed = [0, 1]

[[methods]]
name = "steffle"
algorithm = "steffle"
[methods.grid]
lambda = [0, 2]
epsilon = [1, 3]

[[methods]]
name = "dp-fermi"
algorithm = "steffle"
num-silos = 1
epsilon = 3
[methods.grid]
lambda = [0, 2]

[[methods]]
name = "fedavg"
algorithm = "fedavg"
"""

MU2 = """
[base]
algorithm = "mu2fl"
dataset = "digits"
epochs = 1
batch-size = 16
eval-every = 10000000

[grid]
num-silos = [1, 2]

[[methods]]
name = "mu2fl"
algorithm = "mu2fl"
[methods.grid]
trust = ["untrusted", "trusted"]
rho = [4, 8]
"""

FEDSC = """
[base]
dataset = "digits"
model = "cnn"
num-silos = 2
partition = "iid"
max-train-records = 24
rounds = 2
batch-size = 12
projection-dim = 16
probe-epochs = 2
knn-k = 5

[grid]
seed = [0, 1]

[[methods]]
name = "fedavg-sc"
algorithm = "fedavg-sc"

[[methods]]
name = "fedsc"
algorithm = "fedsc"
"""


def _sweep(tmp_path_factory: pytest.TempPathFactory, name: str, text: str) -> Path:
    folder = tmp_path_factory.mktemp(name)
    path = folder / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    out = folder / "runs"
    report = run_sweep(load_sweep(path, out=out), workers=1, progress=False)
    assert report.ok, report.failed
    return out


@pytest.fixture(scope="module")
def tabular(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """14 real runs: SteFFLe (lambda 0, 2 x epsilon 1, 3), DP-FERMI (one silo, epsilon 3), FedAvg; seeds 0 and 1."""
    return _sweep(tmp_path_factory, "tabular", TABULAR)


def _finals(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text())["final"] for p in out.glob("*/result.json")}


def _curves(ax) -> dict[str, ErrorbarContainer]:
    return {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}


def _xy(container: ErrorbarContainer) -> tuple[np.ndarray, np.ndarray]:
    line = container.lines[0]
    return np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)


def _half_widths(container: ErrorbarContainer, axis: int) -> list[float]:
    """Half-lengths of a curve's error bars along x (axis 0: drawn first) or y (axis 1)."""
    return [abs(seg[1][axis] - seg[0][axis]) / 2 for seg in container.lines[2][axis].get_segments()]


def test_fairness_figure_has_one_curve_per_method_traced_by_lambda_with_seed_means(tabular: Path) -> None:
    runs, incomplete = load_runs([tabular])
    assert (len(runs), incomplete) == (14, 0)
    figures = build_figures("fairness", runs)
    assert [stem for stem, _ in figures] == ["fairness-synthetic-dp"]
    fig = figures[0][1]
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["epsilon = 1, h = 0", "epsilon = 3, h = 0"]
    for ax in axes:
        assert ax.get_xlabel() == "test error"
        assert ax.get_ylabel() == "demographic parity violation"
    # FedAvg is non-private: in both columns; DP-FERMI ran at epsilon 3 only
    assert sorted(_curves(axes[0])) == ["fedavg", "steffle"]
    assert sorted(_curves(axes[1])) == ["dp-fermi", "fedavg", "steffle"]
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["dp-fermi", "fedavg", "steffle"]
    finals = _finals(tabular)
    for ax, eps in zip(axes, (1, 3), strict=True):
        curve = _curves(ax)["steffle"]
        x, y = _xy(curve)
        assert len(x) == 2  # lambda 0 then lambda 2, each the mean over seeds 0 and 1
        for i, lam in enumerate((0, 2)):
            point = [finals[f"steffle__lambda={lam}_epsilon={eps}_seed={s}"] for s in (0, 1)]
            errors = [f["error"] for f in point]
            violations = [f["dp_violation"] for f in point]
            assert x[i] == pytest.approx(mean_sd(errors)[0])
            assert y[i] == pytest.approx(mean_sd(violations)[0])
        assert sorted(_half_widths(curve, 0)) == pytest.approx(
            sorted(
                mean_sd([finals[f"steffle__lambda={lam}_epsilon={eps}_seed={s}"]["error"] for s in (0, 1)])[1]
                for lam in (0, 2)
            )
        )
        fedavg_x, _ = _xy(_curves(ax)["fedavg"])
        assert fedavg_x == pytest.approx([np.mean([finals[f"fedavg__seed={s}"]["error"] for s in (0, 1)])])
    # the fairness term works in these real runs: lambda 2 lowers the violation at epsilon 3
    _, y = _xy(_curves(axes[1])["steffle"])
    assert y[1] < y[0]


def test_privacy_figure_has_one_curve_per_method_and_lambda_and_lines_for_non_private_runs(tabular: Path) -> None:
    runs, _ = load_runs([tabular])
    ((stem, fig),) = build_figures("privacy", runs)
    assert stem == "privacy-synthetic-dp-error"
    (ax,) = fig.axes
    assert ax.get_xlabel() == "epsilon (per silo)" and ax.get_ylabel() == "test error"
    curves = _curves(ax)
    assert sorted(curves) == ["dp-fermi (lambda 0)", "dp-fermi (lambda 2)", "steffle (lambda 0)", "steffle (lambda 2)"]
    x, y = _xy(curves["steffle (lambda 2)"])
    assert list(x) == [1.0, 3.0]
    finals = _finals(tabular)
    assert y[0] == pytest.approx(np.mean([finals[f"steffle__lambda=2_epsilon=1_seed={s}"]["error"] for s in (0, 1)]))
    assert len(_xy(curves["dp-fermi (lambda 0)"])[0]) == 1
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_label() for line in dashed] == ["fedavg, non-private"]
    # a slice: lambda = 2 keeps FedAvg (it has no lambda) and leaves one curve per method
    sliced = filter_runs(runs, {"lambda": "2"})
    assert len(sliced) == 4 + 2 + 2
    ((_, fig2),) = build_figures("privacy", sliced, note="lambda = 2")
    assert sorted(_curves(fig2.axes[0])) == ["dp-fermi", "steffle"]
    assert fig2.get_suptitle().endswith("; lambda = 2")


def test_plot_command_writes_png_and_svg(tabular: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "figures"
    assert main(["plot", "fairness", str(tabular), "--out", str(out)]) == 0
    png, svg = out / "fairness-synthetic-dp.png", out / "fairness-synthetic-dp.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = svg.read_text()
    assert "<svg" in text and "test error" in text and "steffle" in text
    assert main(["plot", "privacy", str(tabular), "--out", str(out), "--where", "lambda=0"]) == 0
    assert (out / "privacy-synthetic-dp-error.png").stat().st_size > 10_000
    capsys.readouterr()
    # no mu2 runs here: a clear error, no file
    assert main(["plot", "mu2", str(tabular), "--out", str(out)]) == 2
    assert "none of the 14 runs fits a mu2 figure" in capsys.readouterr().err
    assert main(["plot", "fairness", str(tmp_path / "nothing")]) == 2


def test_runs_without_a_sweep_get_the_papers_names_and_incomplete_runs_are_skipped(
    tabular: Path, tmp_path: Path
) -> None:
    src = tabular / "dp-fermi__lambda=2_seed=0" / "result.json"
    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copy(src, plain / "result.json")  # as `silofl run --out plain` leaves it: no run.json
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    result = json.loads(src.read_text())
    result["status"]["completed"] = False
    (stopped / "result.json").write_text(json.dumps(result))
    runs, incomplete = load_runs([plain, stopped])
    assert incomplete == 1
    assert [run.method for run in runs] == ["dp-fermi"]
    assert default_method({"algorithm": "steffle", "num-silos": 1, "epsilon": "inf"}) == "fermi"
    assert default_method({"algorithm": "steffle", "num-silos": 3, "epsilon": 1.0}) == "steffle"


def test_a_run_folder_older_than_a_config_key_reads_as_that_keys_default(tabular: Path, tmp_path: Path) -> None:
    """A key added later (e.g. counts-share) is missing from older result.json files: it must not split a curve; a
    key of another algorithm that older versions stored (alpha-start, FedSC's) is dropped."""
    src = json.loads((tabular / "dp-fermi__lambda=2_seed=0" / "result.json").read_text())
    for name, drop in (("old", True), ("new", False)):
        result = json.loads(json.dumps(src))
        if drop:
            del result["config"]["counts-share"]
            result["config"]["alpha-start"] = 1.0  # older versions stored every algorithm's keys
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps(result))
    runs, _ = load_runs([tmp_path / "old", tmp_path / "new"])
    assert [run.config["counts-share"] for run in runs] == [0.1, 0.1]
    assert all("alpha-start" not in run.config for run in runs)
    assert varied_keys(runs) == {"dp-fermi": []}
    newer = json.loads(json.dumps(src))
    newer["config"]["counts-share"] = 0.5  # a real difference still shows
    (tmp_path / "changed").mkdir()
    (tmp_path / "changed" / "result.json").write_text(json.dumps(newer))
    runs, _ = load_runs([tmp_path / "old", tmp_path / "changed"])
    assert varied_keys(runs) == {"dp-fermi": ["counts-share"]}


def _every_algorithms_keys(config: dict) -> dict:
    """`config` as result.json files of versions before the algorithm registry stored it: every key of every
    algorithm (here each algorithm's default), the run's own values over them."""
    from protocols import algorithms
    from server.plots import config_defaults

    return {k: v for name in algorithms.names() for k, v in config_defaults(name).items()} | config


def _figure_data(figures) -> list:
    """What a figure shows: its stem, and per panel its title and every curve's label and points."""
    return [
        (stem, [(ax.get_title(), sorted((k, *map(list, _xy(c))) for k, c in _curves(ax).items())) for ax in fig.axes])
        for stem, fig in figures
    ]


def test_result_files_with_every_algorithms_keys_plot_as_this_versions(tabular: Path, tmp_path: Path) -> None:
    """result.json files of older versions hold every key of every algorithm (FedAvg's a fairness notion, lambda and
    epsilon, SteFFLe's FedSC's alpha-start): they read as this version's configs (with the same method names, also
    without run.json) and draw the same figures."""
    for path in tabular.glob("*/result.json"):
        result = json.loads(path.read_text())
        result["config"] = _every_algorithms_keys(result["config"])
        (tmp_path / path.parent.name).mkdir()
        (tmp_path / path.parent.name / "result.json").write_text(json.dumps(result))
        if path.parent.name not in ("dp-fermi__lambda=2_seed=0", "fedavg__seed=1"):  # those two: named by config
            shutil.copy(path.parent / "run.json", tmp_path / path.parent.name / "run.json")
    fedavg = json.loads((tmp_path / "fedavg__seed=0" / "result.json").read_text())["config"]
    assert {"fairness", "lambda", "epsilon", "alpha-start", "rho"} <= set(fedavg)  # as older versions wrote it
    new, _ = load_runs([tabular])
    old, incomplete = load_runs([tmp_path])
    assert (len(old), incomplete) == (14, 0)
    assert {r.folder.name: (r.method, r.config) for r in old} == {r.folder.name: (r.method, r.config) for r in new}
    for kind in ("fairness", "privacy"):
        assert _figure_data(build_figures(kind, old)) == _figure_data(build_figures(kind, new))
    assert [stem for stem, _ in build_figures("fairness", old)] == ["fairness-synthetic-dp"]
    assert sorted(_curves(build_figures("fairness", old)[0][1].axes[1])) == ["dp-fermi", "fedavg", "steffle"]


def test_one_silo_runs_appear_in_every_heterogeneity_row() -> None:
    """Layout rule, on records built in memory: rows by h for federated runs, a one-silo run in every row."""

    def record(method: str, silos: int, h: float, lam: float, seed: int, error: float) -> RunRecord:
        config = {
            "algorithm": "steffle",
            "dataset": "synthetic",
            "fairness": "eo",
            "num-silos": silos,
            "heterogeneity": h,
            "epsilon": 1.0,
            "lambda": lam,
            "seed": seed,
        }
        return RunRecord(Path("."), method, config, {"error": error, "eo_violation": 0.1 - lam / 40})

    runs = [
        record("steffle", 3, h, lam, seed, 0.2 + lam / 100 + seed / 1000)
        for h in (0.0, 0.75)
        for lam in (0.0, 1.0, 2.0)
        for seed in (0, 1, 2)
    ]
    runs += [record("dp-fermi", 1, 0.0, lam, seed, 0.21) for lam in (0.0, 2.0) for seed in (0, 1, 2)]
    ((stem, fig),) = fairness_figures(runs)
    assert stem == "fairness-synthetic-eo"
    assert [ax.get_title() for ax in fig.axes] == ["epsilon = 1, h = 0", "epsilon = 1, h = 0.75"]
    for ax in fig.axes:
        curves = _curves(ax)
        assert sorted(curves) == ["dp-fermi", "steffle"]
        assert len(_xy(curves["steffle"])[0]) == 3 and len(_xy(curves["dp-fermi"])[0]) == 2
        assert ax.get_ylabel() == "equalized odds violation"
        x, _ = _xy(curves["steffle"])
        assert x == pytest.approx([0.201, 0.211, 0.221])  # ordered by lambda, mean over seeds (0, 1, 2)/1000
    assert "3 seeds" in fig.get_suptitle()


def test_mu2_figure_groups_bars_by_rho_with_one_bar_per_number_of_silos(tmp_path_factory, tmp_path: Path) -> None:
    out = _sweep(tmp_path_factory, "mu2", MU2)
    runs, _ = load_runs([out])
    assert len(runs) == 8
    ((stem, fig),) = build_figures("mu2", runs)
    assert stem == "mu2-digits-iid"
    assert [ax.get_title() for ax in fig.axes] == ["untrusted server", "trusted server"]
    finals = _finals(out)
    for ax, trust in zip(fig.axes, ("untrusted", "trusted"), strict=True):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["rho 4", "rho 8"]
        assert ax.get_ylabel() == "test accuracy (%)"
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert [c.get_label() for c in bars] == ["mu2fl, M = 1", "mu2fl, M = 2"]
        for container, silos in zip(bars, (1, 2), strict=True):
            heights = [patch.get_height() for patch in container.patches]
            expected = [100 * finals[f"mu2fl__trust={trust}_rho={rho}_num-silos={silos}"]["accuracy"] for rho in (4, 8)]
            assert heights == pytest.approx(expected)
    paths = save_figures([(stem, fig)], tmp_path)
    assert [p.suffix for p in paths] == [".png", ".svg"] and all(p.stat().st_size > 5_000 for p in paths)


def test_fedsc_figure_has_one_bar_per_method_with_the_seed_spread(tmp_path_factory) -> None:
    out = _sweep(tmp_path_factory, "fedsc", FEDSC)
    runs, _ = load_runs([out])
    ((stem, fig),) = build_figures("fedsc", runs)
    assert stem == "fedsc-digits-accuracy"
    (ax,) = fig.axes
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [c.get_label() for c in bars] == ["fedavg-sc", "fedsc"]
    finals = _finals(out)
    for container in bars:
        method = container.get_label()
        accuracies = [100 * finals[f"{method}__seed={s}"]["accuracy"] for s in (0, 1)]
        (patch,) = container.patches
        assert patch.get_height() == pytest.approx(np.mean(accuracies))
        err = container.errorbar.lines[2][0].get_segments()[0]
        assert abs(err[1][1] - err[0][1]) / 2 == pytest.approx(mean_sd(accuracies)[1])
    assert ax.get_ylabel() == "linear-probe accuracy (%)"
    assert not math.isnan(patch.get_height())


def test_fedsc_figure_groups_bars_by_configuration() -> None:
    """Runs of two configurations (rounds 20 and 60): one bar per method and configuration, ticks naming them."""
    runs = [
        RunRecord(
            Path(f"{method}-{rounds}-{seed}"),
            method,
            {"algorithm": method.removesuffix("-dp"), "dataset": "digits", "rounds": rounds, "seed": seed},
            {"accuracy": accuracy + 0.01 * seed},
        )
        for rounds, offset in ((20, 0.0), (60, 0.05))
        for method, accuracy in (("fedavg-sc", 0.70 + offset), ("fedsc", 0.72 + offset))
        for seed in (0, 1)
    ]
    ((_, fig),) = build_figures("fedsc", runs)
    (ax,) = fig.axes
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, BarContainer)}
    assert sorted(bars) == ["fedavg-sc", "fedsc"]
    assert [p.get_height() for p in bars["fedsc"].patches] == pytest.approx([72.5, 77.5])
    assert [p.get_height() for p in bars["fedavg-sc"].patches] == pytest.approx([70.5, 75.5])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rounds 20", "rounds 60"]
