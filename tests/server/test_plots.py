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
from matplotlib.text import Text

from silofl.server.cli import main
from silofl.server.plots.fairness import fairness_figures
from silofl.server.plots.figures import build_figures
from silofl.server.plots.files import save_figures
from silofl.server.plots.labels import ROUND_METRICS, distinguishing_labels
from silofl.server.plots.layout import LEGEND_WRAP
from silofl.server.plots.rounds import run_figures
from silofl.server.plots.runs import (
    RunRecord,
    config_defaults,
    default_method,
    filter_runs,
    load_runs,
    mean_sd,
    varied_keys,
)
from silofl.server.sweep import load_sweep, run_sweep
from tests.factories import every_algorithms_keys

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


def _assert_legends_fit(fig) -> None:
    """Every legend of `fig` lies inside the figure once drawn (none clipped at the figure's edge), and so inside
    what `savefig(bbox_inches="tight")` writes."""
    fig.canvas.draw()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    renderer = fig.canvas.get_renderer()
    figure_box = fig.bbox
    tight = fig.get_tightbbox(renderer)  # inches: what bbox_inches="tight" saves
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert figure_box.x0 - 0.5 <= box.x0 and box.x1 <= figure_box.x1 + 0.5, (box, figure_box)
        assert figure_box.y0 - 0.5 <= box.y0 and box.y1 <= figure_box.y1 + 0.5, (box, figure_box)
        inches = box.transformed(fig.dpi_scale_trans.inverted())
        assert tight.x0 - 0.01 <= inches.x0 and inches.x1 <= tight.x1 + 0.01
        assert tight.y0 - 0.01 <= inches.y0 and inches.y1 <= tight.y1 + 0.01


def _texts(fig) -> list[str]:
    """Every text drawn in `fig` (titles, tick labels, legend entries, bar labels)."""
    fig.canvas.draw()
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


@pytest.mark.slow
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
    _assert_legends_fit(fig)


@pytest.mark.slow
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
    _assert_legends_fit(fig)


@pytest.mark.slow
def test_plot_command_writes_png_and_svg(tabular: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "figures"
    assert main(["plot", "fairness", str(tabular), "--out", str(out)]) == 0
    png, svg = out / "fairness-synthetic-dp.png", out / "fairness-synthetic-dp.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = svg.read_text()
    assert "<svg" in text and "test error" in text and "steffle" in text
    assert main(["plot", "privacy", str(tabular), "--out", str(out), "--where", "lambda=0"]) == 0
    assert (out / "privacy-synthetic-dp-error__lambda=0.png").stat().st_size > 10_000
    capsys.readouterr()
    # no mu2 runs here: a clear error, no file
    assert main(["plot", "mu2", str(tabular), "--out", str(out)]) == 2
    assert "none of the 14 runs fits a mu2 figure" in capsys.readouterr().err
    assert main(["plot", "fairness", str(tmp_path / "nothing")]) == 2


@pytest.mark.slow
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


@pytest.mark.slow
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


def _figure_data(figures) -> list:
    """What a figure shows: its stem, and per panel its title and every curve's label and points."""
    return [
        (stem, [(ax.get_title(), sorted((k, *map(list, _xy(c))) for k, c in _curves(ax).items())) for ax in fig.axes])
        for stem, fig in figures
    ]


@pytest.mark.slow
def test_result_files_with_every_algorithms_keys_plot_as_this_versions(tabular: Path, tmp_path: Path) -> None:
    """result.json files of older versions hold every key of every algorithm (FedAvg's a fairness notion, lambda and
    epsilon, SteFFLe's FedSC's alpha-start): they read as this version's configs (with the same method names, also
    without run.json) and draw the same figures."""
    for path in tabular.glob("*/result.json"):
        result = json.loads(path.read_text())
        result["config"] = every_algorithms_keys(result["config"])
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


@pytest.mark.slow
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
    _assert_legends_fit(fig)


@pytest.mark.slow
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
    _assert_legends_fit(fig)


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
    _assert_legends_fit(fig)


# -- labels, grouping, file names, legends, per-round curves (issue 32) ------------------------------------------------


def _write_result(folder: Path, config: dict, final: dict, rounds=(), completed: bool = True) -> None:
    folder.mkdir(parents=True)
    result = {"config": config, "status": {"completed": completed}, "rounds": list(rounds), "final": final}
    (folder / "result.json").write_text(json.dumps(result))


def _fedsc_config(algorithm: str, seed: int, **values) -> dict:
    """A FedSC / FedAvg+SC run's config as its result.json holds it (every key of its algorithm), `values` set."""
    return config_defaults(algorithm) | {"dataset": "digits", "seed": seed} | values


def _bars(ax) -> dict[str, BarContainer]:
    return {c.get_label(): c for c in ax.containers if isinstance(c, BarContainer)}


def test_fedsc_never_averages_a_private_run_with_a_non_private_one(tmp_path: Path) -> None:
    """A non-private and an epsilon-6 FedSC configuration (two seeds each, no run.json: both named `fedsc`): two bars,
    labelled by privacy level, each the mean of its own seeds; with the FedAvg+SC baseline (no epsilon, none of
    FedSC's keys) a third bar, and no label or tick says None."""
    runs = tmp_path / "runs"
    accuracy = {("inf", 0): 0.80, ("inf", 1): 0.82, (6.0, 0): 0.74, (6.0, 1): 0.78}
    for (eps, seed), acc in accuracy.items():
        config = _fedsc_config("fedsc", seed, epsilon=eps, delta=0.0 if eps == "inf" else 0.01)
        _write_result(runs / f"fedsc-{eps}-{seed}", config, {"accuracy": acc})
    out = tmp_path / "figures"
    assert main(["plot", "fedsc", str(runs), "--out", str(out)]) == 0
    assert (out / "fedsc-digits-accuracy.png").stat().st_size > 5_000
    ((_, fig),) = build_figures("fedsc", load_runs([runs])[0])
    (ax,) = fig.axes
    bars = _bars(ax)
    assert list(bars) == ["fedsc (non-private)", "fedsc (eps 6)"]
    assert [p.get_height() for p in bars["fedsc (non-private)"].patches] == pytest.approx([81.0])
    assert [p.get_height() for p in bars["fedsc (eps 6)"].patches] == pytest.approx([76.0])
    assert "mean ± sd over 2 seeds" in fig.get_suptitle()
    assert not [t for t in _texts(fig) if "None" in t]
    _assert_legends_fit(fig)

    for seed in (0, 1):
        _write_result(runs / f"fedavg-sc-{seed}", _fedsc_config("fedavg-sc", seed), {"accuracy": 0.70 + seed / 100})
    ((_, fig),) = build_figures("fedsc", load_runs([runs])[0])
    (ax,) = fig.axes
    bars = _bars(ax)
    assert list(bars) == ["fedavg-sc (non-private)", "fedsc (non-private)", "fedsc (eps 6)"]
    assert [p.get_height() for p in bars["fedavg-sc (non-private)"].patches] == pytest.approx([70.5])
    assert [p.get_height() for p in bars["fedsc (eps 6)"].patches] == pytest.approx([76.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == [""]  # one configuration: nothing else differs
    texts = _texts(fig)
    assert not [t for t in texts if "None" in t] and not [t for t in texts if "alpha-start" in t]
    _assert_legends_fit(fig)


def test_fedsc_bars_by_configuration_keep_the_baseline_beside_each_fedsc_setting() -> None:
    """FedSC at two alpha-start values and two round counts, FedSC-DP, FedAvg+SC (which has no alpha-start): x groups
    name rounds and alpha-start, the baseline stands in each group of its rounds, never "alpha-start None"."""
    runs = []
    for rounds, alpha in ((20, 0.1), (60, 0.1), (60, 1.0)):
        for method, algorithm, eps in (
            ("fedavg-sc", "fedavg-sc", None),
            ("fedsc", "fedsc", "inf"),
            ("fedsc-dp", "fedsc", 6),
        ):
            if algorithm == "fedavg-sc" and alpha == 1.0:
                continue
            for seed in (0, 1):
                extra = {"alpha-start": alpha, "epsilon": eps} if algorithm == "fedsc" else {}
                config = _fedsc_config(algorithm, seed, rounds=rounds, **extra)
                acc = 0.7 + rounds / 1000 + (0.02 if method == "fedsc" else 0) + alpha / 10 * (algorithm == "fedsc")
                runs.append(RunRecord(Path(f"{method}-{rounds}-{alpha}-{seed}"), method, config, {"accuracy": acc}))
    ((_, fig),) = build_figures("fedsc", runs)
    (ax,) = fig.axes
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["rounds 20\nalpha-start 0.1", "rounds 60\nalpha-start 0.1", "rounds 60\nalpha-start 1"]
    bars = _bars(ax)
    assert list(bars) == ["fedavg-sc (non-private)", "fedsc (non-private)", "fedsc-dp (eps 6)"]
    assert [p.get_height() for p in bars["fedavg-sc (non-private)"].patches] == pytest.approx([72.0, 76.0, 76.0])
    assert [p.get_height() for p in bars["fedsc (non-private)"].patches] == pytest.approx([75.0, 79.0, 88.0])
    assert [p.get_height() for p in bars["fedsc-dp (eps 6)"].patches] == pytest.approx([73.0, 77.0, 86.0])
    assert not [t for t in _texts(fig) if "None" in t]
    _assert_legends_fit(fig)


def test_labels_name_only_what_differs_and_never_none() -> None:
    def config(algorithm: str, **values) -> dict:
        return _fedsc_config(algorithm, 0, **values)

    methods = ["fedsc", "fedsc", "fedsc", "fedavg-sc", "fedsc"]
    configs = [
        config("fedsc", epsilon="inf"),
        config("fedsc", epsilon=6, delta=0.01),
        config("fedsc", epsilon=6, delta=1e-5),
        config("fedavg-sc"),
        config("fedsc", epsilon="inf", views=3),
    ]
    assert distinguishing_labels(methods, configs) == [
        "fedsc (non-private, views 2)",
        "fedsc (eps 6, views 2, delta 0.01)",  # delta: only where it tells two labels apart
        "fedsc (eps 6, views 2, delta 1e-05)",
        "fedavg-sc (non-private)",
        "fedsc (non-private, views 3)",
    ]
    # one privacy level: not shown; the seed is a difference like any other (per-run labels); a missing key: "no"
    assert distinguishing_labels(["fedavg", "fedavg"], [{"seed": 0, "lr": 0.1}, {"seed": 1, "lr": 0.1}]) == [
        "fedavg (seed 0)",
        "fedavg (seed 1)",
    ]
    assert distinguishing_labels(["x", "x"], [{"views": 2}, {}]) == ["x (views 2)", "x (no views)"]
    # the papers' names that already say it are not repeated
    assert distinguishing_labels(["steffle (non-private)", "steffle"], [{"epsilon": "inf"}, {"epsilon": 1.0}]) == [
        "steffle (non-private)",
        "steffle (eps 1)",
    ]


@pytest.mark.slow
def test_a_sliced_figure_never_replaces_the_unsliced_one(tabular: Path, tmp_path: Path, capsys) -> None:
    """`silofl plot privacy RUN_DIR` then `--where lambda=0` into the same default folder: two files; a rerun says
    it replaced its own file; `--out FILE` writes that file only."""
    folder = tabular / "plots"
    try:
        assert main(["plot", "privacy", str(tabular)]) == 0
        assert main(["plot", "privacy", str(tabular), "--where", "lambda=0"]) == 0
        assert main(["plot", "privacy", str(tabular), "--where", "lambda=0", "--where", "seed=1"]) == 0
        names = sorted(p.name for p in folder.iterdir())
        assert names == [
            f"privacy-synthetic-dp-error{suffix}.{fmt}"
            for suffix in ("", "__lambda=0", "__lambda=0_seed=1")
            for fmt in ("png", "svg")
        ]
        unsliced = (folder / "privacy-synthetic-dp-error.svg").read_text()
        sliced = (folder / "privacy-synthetic-dp-error__lambda=0.svg").read_text()
        assert "lambda 2" in unsliced and "lambda 2" not in sliced and "lambda = 0" in sliced
        capsys.readouterr()
        assert main(["plot", "privacy", str(tabular)]) == 0
        assert "privacy-synthetic-dp-error.png  (replaced the file there before)" in capsys.readouterr().out
        mine = tmp_path / "mine.png"
        assert main(["plot", "privacy", str(tabular), "--where", "lambda=2", "--out", str(mine)]) == 0
        assert sorted(tmp_path.iterdir()) == [mine] and mine.read_bytes()[:4] == b"\x89PNG"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _long_name_records() -> list[RunRecord]:
    """Six methods with long names, in memory: SteFFLe (fairness, privacy figures), DP-mu2-FL (mu2), FedSC."""
    long = "a-method-name-much-longer-than-a-legend-column-{}-with-its-variant"
    runs = []
    for m in range(6):
        for eps in (1.0, 3.0):
            config = {"algorithm": "steffle", "dataset": "synthetic", "fairness": "dp", "num-silos": 3}
            config |= {"heterogeneity": 0.0, "epsilon": eps, "lambda": 1.0, "seed": 0}
            runs.append(RunRecord(Path("."), long.format(m), config, {"error": 0.2 + m / 100, "dp_violation": 0.1}))
        config = {"algorithm": "mu2fl", "dataset": "digits", "partition": "iid", "num-silos": 2, "trust": "untrusted"}
        runs.append(RunRecord(Path("."), long.format(m), config | {"rho": 4.0}, {"accuracy": 0.8}))
        runs.append(
            RunRecord(Path("."), long.format(m), {"algorithm": "fedsc", "dataset": "digits"}, {"accuracy": 0.8})
        )
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fairness", "privacy", "mu2", "fedsc"])
def test_long_legend_labels_are_wrapped_and_fit_the_figure(kind: str, tmp_path: Path) -> None:
    runs = _long_name_records()
    ((stem, fig),) = build_figures(kind, runs)
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert len(texts) == 6
    assert all("\n" in t and max(map(len, t.split("\n"))) <= LEGEND_WRAP for t in texts)
    names = {c for r in runs for c in (r.method, f"{r.method}, M = 2")}
    assert {"".join(t.split()) for t in texts} <= {"".join(name.split()) for name in names}  # wrapped, not cut
    _assert_legends_fit(fig)
    (path,) = save_figures([(stem, fig)], tmp_path, ("png",))
    assert path.stat().st_size > 5_000


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real 3-round runs with the CLI: FedAvg (non-private) and SteFFLe at epsilon 1, evaluated every round."""
    root = tmp_path_factory.mktemp("single")
    main(["run", "fedavg", "--rounds", "3", "--out", str(root / "fedavg"), "--no-progress"])
    args = ["--rounds", "3", "--epsilon", "1", "--eval-every", "1", "--out", str(root / "steffle"), "--no-progress"]
    main(["run", "steffle", *args])
    assert (root / "fedavg" / "result.json").is_file() and (root / "steffle" / "result.json").is_file()
    return root


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


@pytest.mark.slow
def test_plot_run_draws_each_runs_rounds_one_panel_per_metric(single_runs: Path, tmp_path: Path, capsys) -> None:
    fedavg, steffle = single_runs / "fedavg", single_runs / "steffle"
    out = tmp_path / "curves.png"
    assert main(["plot", "run", str(fedavg), str(steffle), "--out", str(out)]) == 0
    assert sorted(tmp_path.iterdir()) == [out] and out.read_bytes()[:4] == b"\x89PNG" and out.stat().st_size > 20_000
    assert main(["plot", "run", str(steffle)]) == 0  # default: RUN_DIR/plots/rounds.png and .svg
    assert sorted(p.name for p in (steffle / "plots").iterdir()) == ["rounds.png", "rounds.svg"]

    runs, _ = load_runs([fedavg, steffle], with_rounds=True)
    ((stem, fig),) = build_figures("run", runs)
    assert stem == "rounds"
    metrics = ["accuracy", "loss", "dp_violation", "eo_violation", "eopp_violation", "epsilon_spent"]
    assert [ax.get_title() for ax in fig.axes] == [ROUND_METRICS[m] for m in metrics]
    labels = {"fedavg": "fedavg (non-private)", "steffle": "steffle (eps 1)"}
    rounds = {name: json.loads((single_runs / name / "result.json").read_text())["rounds"] for name in labels}
    for ax, metric in zip(fig.axes, metrics, strict=True):
        lines = {line.get_label(): line for line in ax.get_lines()}
        expected = {}
        for name, entries in rounds.items():
            points = [(e["round"], e[metric]) for e in entries if _finite(e.get(metric))]
            if points:
                expected[labels[name]] = points
        assert sorted(lines) == sorted(expected), metric  # one line per run that recorded the metric
        for label, points in expected.items():
            assert list(lines[label].get_xdata()) == [x for x, _ in points]
            assert list(lines[label].get_ydata()) == pytest.approx([y for _, y in points])
    accuracy = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert len(accuracy["fedavg (non-private)"]) == 3 and len(accuracy["steffle (eps 1)"]) == 3
    (epsilon,) = fig.axes[-1].get_lines()  # FedAvg spends no epsilon ("inf": no line)
    spent = list(epsilon.get_ydata())
    assert epsilon.get_label() == "steffle (eps 1)" and spent == sorted(spent) and 0 < spent[-1] <= 1 + 1e-9
    _assert_legends_fit(fig)

    # a stopped run is drawn too, said to be incomplete; --metric picks panels; two identical runs: their folders
    stopped = tmp_path / "stopped"
    shutil.copytree(steffle, stopped, ignore=shutil.ignore_patterns("plots", "checkpoint"))
    result = json.loads((stopped / "result.json").read_text())
    result["status"]["completed"] = False
    (stopped / "result.json").write_text(json.dumps(result))
    runs, incomplete = load_runs([steffle, stopped], with_rounds=True, keep_incomplete=True)
    assert incomplete == 1
    ((_, fig),) = run_figures(runs, metrics=["loss"])
    (ax,) = fig.axes
    assert sorted(line.get_label() for line in ax.get_lines()) == [
        "steffle: steffle",
        "steffle: stopped (incomplete)",
    ]
    capsys.readouterr()
    assert main(["plot", "run", str(stopped), "--metric", "nope"]) == 2
    assert "--metric 'nope'" in capsys.readouterr().err


def test_a_methods_non_private_runs_are_a_curve_of_their_own() -> None:
    """A sweep method run at epsilon 1 and without noise (epsilon inf): its non-private runs are never averaged into
    the private points (fairness figure: a curve of their own in each column; privacy figure: a dashed line)."""

    def record(eps: float, lam: float, seed: int) -> RunRecord:
        config = {"algorithm": "steffle", "dataset": "synthetic", "fairness": "dp", "num-silos": 3}
        config |= {"heterogeneity": 0.0, "epsilon": eps, "lambda": lam, "seed": seed}
        error = (0.10 if math.isinf(eps) else 0.30) + lam / 100 + seed / 1000
        return RunRecord(Path("."), "steffle", config, {"error": error, "dp_violation": 0.1 - lam / 40})

    runs = [record(eps, lam, seed) for eps in (1.0, math.inf) for lam in (0.0, 2.0) for seed in (0, 1)]
    ((_, fig),) = build_figures("fairness", runs)
    (ax,) = fig.axes
    curves = _curves(ax)
    assert sorted(curves) == ["steffle", "steffle (non-private)"]
    assert list(_xy(curves["steffle"])[0]) == pytest.approx([0.3005, 0.3205])
    assert list(_xy(curves["steffle (non-private)"])[0]) == pytest.approx([0.1005, 0.1205])
    ((_, fig),) = build_figures("privacy", runs)
    (ax,) = fig.axes
    assert sorted(_curves(ax)) == ["steffle (lambda 0)", "steffle (lambda 2)"]
    dashed = sorted(line.get_label() for line in ax.get_lines() if line.get_linestyle() == "--")
    assert dashed == ["steffle (lambda 0, non-private)", "steffle (lambda 2, non-private)"]
    assert not [t for t in _texts(fig) if "None" in t]
    _assert_legends_fit(fig)


def test_a_key_added_since_takes_its_default_unless_earlier_runs_did_otherwise() -> None:
    """A FedSC result stored before `--stale-shares` existed ran the paper's stale cache: its config reads "keep",
    not the default "drop"; a config that stores the key keeps its value, and other new keys take their defaults."""
    from silofl.protocols.config import RunConfig
    from silofl.server.plots.runs import normalized_config

    written = RunConfig.parse({"algorithm": "fedsc", "participation": 0.5}).to_json()
    assert written["stale-shares"] == "drop"
    before = {k: v for k, v in written.items() if k not in ("stale-shares", "probe-epochs")}
    read = normalized_config(before)
    assert read["stale-shares"] == "keep" and read["probe-epochs"] == written["probe-epochs"]
    assert normalized_config(written)["stale-shares"] == "drop"
