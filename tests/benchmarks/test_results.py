"""benchmarks/results.py and its section modules: docs/RESULTS.md generated from run folders, synthetic result.json
files with known numbers and a tiny real sweep (SteFFLe, Tran et al. and FedAvg on the synthetic dataset) run through
`silofl sweep`. The reduction at matched test error itself is tested against hand-computed numbers in
tests/server/test_analysis.py."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from benchmarks import (
    results,
    results_document,
    results_dp_fermi,
    results_fedsc,
    results_fedsc_privacy,
    results_heterogeneity,
    results_record,
    results_runs,
    results_silos,
    results_steffle,
    results_text,
    results_topologies,
)
from silofl.server.analysis import matched_error_reduction
from silofl.server.run_result import RunResult
from tests.factories import every_algorithms_keys

# -- documents from synthetic run folders with known numbers ----------------------------------------------------------

#: (method, algorithm, trace key, trace value) -> (test error, dp violation), each the mean of two seeds (+-0.01).
KNOWN = {
    ("steffle", "steffle", "lambda", 0): (0.15, 0.20),
    ("steffle", "steffle", "lambda", 1): (0.16, 0.10),
    ("steffle", "steffle", "lambda", 0.5): (0.17, 0.12),
    ("steffle", "steffle", "lambda", 2): (0.18, 0.04),
    ("steffle", "steffle", "lambda", 0.25): (0.20, 0.06),
    ("tran", "tran", "dual-lr", 0.01): (0.155, 0.25),
    ("tran", "tran", "dual-lr", 0.05): (0.17, 0.14),
    ("tran", "tran", "dual-lr", 0.002): (0.14, 0.30),
    ("fedavg", "fedavg", None, None): (0.19, 0.05),
}


def _write_run(folder: Path, method: str, config: dict, final: dict, seconds: float) -> None:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"method": method, "config": config}))
    result = {
        "config": config,
        "final": final,
        "privacy": {"epsilon_spent": 1.0},
        "timing": {"total_seconds": seconds, "seconds_per_round": seconds / 10},
        "status": {"completed": True},
    }
    (folder / "result.json").write_text(json.dumps(result))


def _fake_sweep(root: Path, *, old_style: bool = False) -> Path:
    """runs/sweeps/steffle_adult_dp with KNOWN's points (h 0, epsilon 1, seeds 0 and 1), 10 s per run; each config
    as `silofl run` writes it (the algorithm's own keys), or with `old_style` as older versions did (every key)."""
    from silofl.protocols.config import RunConfig

    out = root / "sweeps" / "steffle_adult_dp"
    for (method, algorithm, key, value), (error, violation) in KNOWN.items():
        for seed, sign in ((0, -1), (1, 1)):
            name = f"{method}__{key}={value}_seed={seed}" if key else f"{method}__seed={seed}"
            values = {
                "algorithm": algorithm,
                "dataset": "adult",
                "num-silos": 3,
                "heterogeneity": 0.0,
                "seed": seed,
                "epochs": 40,
                "out-dir": str(out / name),
            }
            if algorithm != "fedavg":  # FedAvg has neither a fairness notion nor privacy
                values |= {"fairness": "dp", "epsilon": 1.0}
            if key:
                values[key] = value
            config = RunConfig.parse(values).to_json()
            if old_style:
                config = every_algorithms_keys(config)
            final = {"error": error + sign * 0.01, "dp_violation": violation + sign * 0.005, "accuracy": 1 - error}
            _write_run(out / name, method, config, final, 10.0)
    return out


def _build(root: Path, sweep_files: Path | None = None, **kwargs):
    return results_document.build_document(
        sweeps=root / "sweeps",
        sweep_files=sweep_files or root / "no-sweep-files",
        out=root / "docs" / "RESULTS.md",
        figures=root / "docs" / "figures",
        mu2_cache=kwargs.get("mu2_cache", root / "no-mu2"),
        fedsc_runs=root / "no-fedsc",
    )


def _section(make, root: Path, sweeps: str = "sweeps"):
    """A section module's (lines, run files) from the sweeps under `root`/`sweeps` (no sweep files; figures in
    `root`/docs/figures), and its text."""
    lines, files = make(root / sweeps, root / "no-sweep-files", root / "docs" / "figures", root / "docs")
    return lines, files, "\n".join(lines)


def _table_row(text: str, h: str, eps: str) -> list[str]:
    row = next(line for line in text.splitlines() if line.startswith(f"| {h} | {eps} | "))
    return [cell.strip() for cell in row.strip("|").split("|")]


@pytest.mark.parametrize("old_style", [False, True], ids=["own-keys", "every-algorithms-keys"])
def test_document_from_known_result_files(tmp_path: Path, old_style: bool):
    """The same document from result.json files as this version writes them and as older ones did (every key of
    every algorithm: FedAvg's with a fairness notion, epsilon and lambda of their own)."""
    out = _fake_sweep(tmp_path, old_style=old_style)
    fedavg = json.loads((out / "fedavg__seed=0" / "result.json").read_text())["config"]
    assert ("lambda" in fedavg and "alpha-start" in fedavg) == old_style
    text, sweeps = _build(tmp_path)
    # the reduction table: columns h, epsilon, vs tran, vs fedavg (no other baseline has runs)
    assert "| h | epsilon | vs tran | vs fedavg |" in text
    # tran: 1 - 0.15/0.25 = 0.4 and 1 - 0.07/0.14 = 0.5 -> 45.0%, 2 of 3 points; fedavg: 1 - 0.04/0.05 = 20%
    assert _table_row(text, "0", "1") == ["0", "1", "45.0% (2/3)", "20.0% (1/1)"]
    assert "| demographic parity | tran | 45.0% | 1 / 1 | Adult | 75.47% |" in text
    assert "| demographic parity | fedfdp | n/a | 0 / 0 | - | 52.93% |" in text  # a baseline without runs here
    # header: 18 runs, 10 s each, CPU time not recorded
    assert "Runs read: 18 (steffle_adult_dp 18)" in text
    assert "wall time summed over the runs: 3.0 min" in text
    # the figure exists, is a PNG, and the link is relative to the document
    link = re.search(r"!\[Adult, demographic parity[^\]]*\]\(([^)]+)\)", text)
    assert link and not Path(link.group(1)).is_absolute()
    png = tmp_path / "docs" / link.group(1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # missing sections say so and name the command
    for name in ("steffle_credit_dp", "steffle_adult_eo", "steffle_credit_eo", "steffle_parkinsons_dp"):
        assert f"silofl sweep {results_runs.rel(tmp_path / 'no-sweep-files' / name, results_runs.ROOT)}.toml" in text
    # five SteFFLe sweeps, the sealed-records sweep, the number-of-silos sweep, the two heterogeneity sweeps, DP-FERMI,
    # the two many-valued sweeps, mu2, FedSC, FedSC across epsilon and participation; the record section's two sweeps
    assert text.count("Not generated yet: run `") == 15
    assert "Adult: not generated yet: run `" in text and "Credit Card: not generated yet: run `" in text
    assert sweeps[0].panels[0].reductions["tran"].mean == pytest.approx(0.45)


def test_cpu_seconds_are_summed_when_recorded(tmp_path: Path):
    out = _fake_sweep(tmp_path)
    for i, folder in enumerate(sorted(out.iterdir())):
        meta = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**meta, "cpu_seconds": 5.0 if i % 2 else 7.0}))
    text, _ = _build(tmp_path)
    assert "total CPU time 1.8 min" in text  # 9 x 5 s + 9 x 7 s = 108 s


def test_mu2_section_from_cached_cells(tmp_path: Path):
    cache = tmp_path / "mu2"
    cache.mkdir()
    cells = {
        "mu2fl-untrusted-rho4-M1-b1-s0.json": (0.692, 2.2562),
        "mu2fl-untrusted-rho4-M1-b1-s1.json": (0.702, 2.2560),
        "mu2fl-untrusted-rho4-M10-b1-s0-classes-2.json": (0.1, 2.3),  # label skew: not in the tables
        "noisy-sgd-trusted-rho4-M1-b1-s0.json": (0.395, 2.298),
    }
    for name, (acc, loss) in cells.items():
        algorithm = "noisy-sgd" if name.startswith("noisy") else "mu2fl"
        trust = "trusted" if "-trusted-" in name else "untrusted"
        cell = {"algorithm": algorithm, "trust": trust, "rho": 4.0, "silos": int(re.search(r"-M(\d+)-", name)[1])}
        (cache / name).write_text(json.dumps({**cell, "loss": loss, "accuracy": acc, "epsilon": 24.4, "seconds": 60}))
    text, _ = _build(tmp_path, mu2_cache=cache)
    # mean of the two seeds: 69.7%, sd 0.7; the paper's cell 2.256 / 69.9%
    assert "| 4 | 2.256 / 69.7% (sd 0.7, 69.2-70.2, 2 seeds); paper 2.256 / 69.9%; +0.000, -0.2; eps 24.4 |" in text
    assert "| noisy SGD, 4 | 2.298 / 39.5% |" in text
    assert "within the target of the paper's: 1 of 1" in text  # Table 2's DP-mu2-FL cell is absent
    assert "Runs read: 3 (mu2 3)" in text
    assert (tmp_path / "docs" / "figures" / "mu2-mnist-iid.png").is_file()


# -- a tiny real sweep ------------------------------------------------------------------------------------------------

SWEEP = """
out = "unused"
[base]
dataset = "synthetic"
num-silos = 3
partition = "attribute"
fairness = "dp"
rounds = 8
eval-every = 8
batch-size = 64
lr = 0.5

[grid]
heterogeneity = [0, 0.75]
seed = [0, 1]

[[methods]]
name = "steffle"
algorithm = "steffle"
epsilon = 3
[methods.grid]
lambda = [0, 1, 4]

[[methods]]
name = "tran"
algorithm = "tran"
epsilon = 3
lambda = 0
[methods.grid]
dual-lr = [0.01, 0.5]

[[methods]]
name = "fedavg"
algorithm = "fedavg"
"""


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 real runs (SteFFLe x 3 lambdas, Tran x 2 dual steps, FedAvg; h 0 and 0.75; seeds 0, 1) as the
    steffle_adult_dp sweep of a temporary project."""
    from silofl.server.sweep import load_sweep, run_sweep

    root = tmp_path_factory.mktemp("results")
    files = root / "sweep-files"
    files.mkdir()
    (files / "steffle_adult_dp.toml").write_text(textwrap.dedent(SWEEP))
    sweep = load_sweep(files / "steffle_adult_dp.toml", out=root / "sweeps" / "steffle_adult_dp")
    report = run_sweep(sweep, workers=1, progress=False)
    assert report.ok, report.failed
    return root


@pytest.mark.slow
def test_document_from_a_real_sweep(real_sweep: Path):
    text, sweeps = _build(real_sweep, sweep_files=real_sweep / "sweep-files")
    result = sweeps[0]
    assert (result.expected, result.finished, len(result.records)) == (24, 24, 24)
    assert "the sweep file has 24 runs, 24 finished" in text
    assert "Runs read: 24 (steffle_adult_dp 24)" in text
    # recompute each panel's numbers from the result.json files directly
    finals: dict[tuple, list[dict]] = {}
    for path in (real_sweep / "sweeps" / "steffle_adult_dp").glob("*/result.json"):
        result_json = json.loads(path.read_text())
        config = result_json["config"]
        key = (config["algorithm"], config["heterogeneity"], config.get("lambda"), config.get("dual-lr"))
        finals.setdefault(key, []).append(result_json["final"])

    def points(algorithm: str, h: float) -> list[tuple[float, float]]:
        """One point per (lambda, dual-lr): the mean over the two seeds."""
        out = []
        for (alg, hh, _lam, _dual), runs in sorted(finals.items()):
            if alg == algorithm and hh == h:
                assert len(runs) == 2  # seeds 0 and 1
                out.append((sum(r["error"] for r in runs) / 2, sum(r["dp_violation"] for r in runs) / 2))
        return out

    assert [(p.h, p.epsilon) for p in result.panels] == [(0.0, 3.0), (0.75, 3.0)]
    for panel in result.panels:
        steffle = points("steffle", panel.h)
        assert len(steffle) == 3
        for baseline in ("tran", "fedavg"):
            expected = matched_error_reduction(steffle, points(baseline, panel.h))
            got = panel.reductions[baseline]
            assert (got.total, len(got.matched), got.below, got.above) == (
                expected.total,
                len(expected.matched),
                expected.below,
                expected.above,
            )
            if expected.mean is None:
                assert got.mean is None
            else:
                assert got.mean == pytest.approx(expected.mean)
            assert got.text() in _table_row(text, results_text.fmt(panel.h), "3")
    png = real_sweep / "docs" / "figures" / "fairness-synthetic-dp.png"
    assert png.stat().st_size > 10_000


@pytest.mark.slow
def test_main_writes_the_document(real_sweep: Path, tmp_path: Path):
    out = tmp_path / "RESULTS.md"
    code = results.main(
        [
            "--sweeps",
            str(real_sweep / "sweeps"),
            "--sweep-files",
            str(real_sweep / "sweep-files"),
            "--out",
            str(out),
            "--mu2-cells",
            str(tmp_path / "none"),
            "--fedsc-runs",
            str(tmp_path / "none"),
            "--allow-missing",  # the fixture has one sweep of the document's many
        ]
    )
    assert code == 0
    text = out.read_text()
    assert text.startswith("# silofl results")
    assert "(figures/fairness-synthetic-dp.png)" in text
    assert (tmp_path / "figures" / "fairness-synthetic-dp.png").is_file()
    assert "Runs read: 24 (steffle_adult_dp 24)" in text


def test_sweep_with_only_steffle_runs_says_there_is_no_reduction_yet(tmp_path: Path):
    out = _fake_sweep(tmp_path)
    for folder in out.iterdir():
        if not folder.name.startswith("steffle"):
            shutil.rmtree(folder)
    text, sweeps = _build(tmp_path)
    assert "No baseline runs in this sweep yet: no reduction to compute." in text
    assert sweeps[0].panels[0].reductions == {}
    assert "| 0 | 1 | steffle | lambda 2 | 2 | 0.1800 ± 0.0141 | 0.0400 ± 0.0071 | front |  |" in text


def test_fedsc_benchmark_runs_are_grouped_by_configuration_with_the_command_that_made_them():
    from silofl.server.plots.runs import RunRecord

    paper = {"rounds": 20, "max-train-records": 500, "local-epochs": 5, "batch-size": 128, "alpha-end": 0.2}
    exact = {"rounds": 60, "max-train-records": 300, "local-epochs": 1, "batch-size": 100}
    exact |= {"alpha-start": 0.1, "alpha-end": 0.1, "eval-every": 20}
    records = [
        RunRecord(Path(f"{m}-{i}"), m, {"algorithm": m.removesuffix("-dp"), "lr": 0.05, **config}, {})
        for i, config in enumerate([paper, exact])
        for m in ("fedavg-sc", "fedsc", "fedsc-dp")
    ]
    groups = results_fedsc.fedsc_configurations(records)
    assert [len(g) for g in groups.values()] == [3, 3]
    commands = [results_fedsc._fedsc_command(key) for key in groups]
    assert commands[0] == "SILOFL_DATA_DIR=../shared/data python benchmarks/fedsc_fmnist.py"  # all defaults
    assert commands[1].endswith(
        "fedsc_fmnist.py --rounds 60 --records 300 --local-epochs 1 --batch-size 100 --alpha-start 0.1 "
        "--alpha-end 0.1 --eval-every 20"
    )
    labels = [results_fedsc._fedsc_label(key) for key in groups]
    assert labels[1] == "60 rounds x 1 epochs, 300 img/silo, batch 100, alpha 0.1 -> 0.1"


def test_one_section_is_replaced_in_place_or_inserted_before_the_next_heading():
    doc = "# t\n\n## A\n\nold a\n\n### A.1\n\nold a1\n\n## B\n\nb\n"
    replaced = results_text.replace_section(doc, "## A", ["## A", "", "new a"], "## B")
    assert replaced == "# t\n\n## A\n\nnew a\n\n## B\n\nb\n"  # its subsections go with it
    inserted = results_text.replace_section("# t\n\n## B\n\nb\n", "## A", ["## A", "", "a"], "## B")
    assert inserted == "# t\n\n## A\n\na\n\n## B\n\nb\n"
    # several headings that follow: before the first the document has
    inserted = results_text.replace_section("# t\n\n## C\n\nc\n", "## A", ["## A", "", "a"], ["## B", "## C"])
    assert inserted == "# t\n\n## A\n\na\n\n## C\n\nc\n"


def _topology_result(folder: Path, config: dict, per_silo: dict, feature_parties: int) -> RunResult:
    folder.mkdir(parents=True)
    silos = [{"n_train": 1000} for _ in range(feature_parties)]
    result = {
        "config": {"lambda": 1.0, "clip": 2.0, "batch-size": 100, **config},
        "federation": {"silos": silos},
        "final": {},
        "privacy": {"epsilon_target": 1.0, "per_silo": per_silo},
    }
    (folder / "result.json").write_text(json.dumps(result))
    return RunResult.load(folder)


def test_noise_on_h_is_the_noise_std_on_the_servers_fairness_gradient(tmp_path: Path):
    silo = {"noise_multiplier": 10.0, "sampling_rate": 0.1, "n_train": 1000}
    silos = _topology_result(tmp_path / "s", {}, {"0": silo, "1": silo}, 2)
    # each silo: sigma C / (q n_j) = 10 * 2 / 100 = 0.2, weighted 1/2 each: sqrt(2 * 0.1^2)
    assert results_topologies.noise_on_h(silos) == pytest.approx(0.2 * math.sqrt(2) / 2)
    off = _topology_result(tmp_path / "o", {"lambda": 0.0}, {"0": silo}, 1)
    assert results_topologies.noise_on_h(off) is None
    # a census: its mean over its own sample at q = m / (n / N) = 0.1, over n = 2000 records; the same noise as two
    # silos of 1000 at q = 0.1 with the census's sigma (here one party: sigma C / (q n))
    census = {"noise_multiplier": 10.0, "sampling_rate": 0.1, "n_train": 2000}
    central = _topology_result(tmp_path / "z", {"topology": "central-sensitive"}, {"0": census}, 2)
    assert results_topologies.noise_on_h(central) == pytest.approx(10 * 2 / (0.1 * 2000))
    # divided: one sensitive party per silo, each at the silo's q over its 1000 records: sqrt(2) sigma C / (q n)
    divided = _topology_result(tmp_path / "d", {"topology": "divided"}, {"0": silo, "1": silo}, 2)
    assert results_topologies.noise_on_h(divided) == pytest.approx(math.sqrt(2) * 10 * 2 / (0.1 * 2000))
    assert results_topologies.noise_on_h(divided) == pytest.approx(
        results_topologies.noise_on_h(silos)
    )  # the silos' noise, as it must be


def test_the_first_versions_topology_section_is_history_copied_as_it_stands(tmp_path: Path):
    """Its runs used options removed in issue 31 (`share-rows`, `keep-rate`): a full regeneration copies the section
    from the existing document byte for byte (neither its sweep file nor its runs are read), and without one names the
    commit where it reruns."""
    history = [
        results_topologies.TOPOLOGY_HEADING,
        "",
        "frozen | numbers |",
        "",
        "### a subsection",
        "",
        "kept too",
        "",
    ]
    doc = tmp_path / "docs" / "RESULTS.md"
    doc.parent.mkdir(parents=True)
    doc.write_text("\n".join(["# silofl results", "", *history, results_topologies.SEALED_HEADING, "", "old", ""]))
    text, _ = _build(tmp_path)
    assert "\n".join(history) + "\n" + results_topologies.SEALED_HEADING in text
    assert results_text.section_lines(text, results_topologies.TOPOLOGY_HEADING) == history
    doc.unlink()
    text, _ = _build(tmp_path)
    assert (
        f"silofl commit `{results_topologies.HISTORY_COMMIT}`"
        in results_text.section_lines(text, results_topologies.TOPOLOGY_HEADING)[2]
    )


@pytest.mark.slow
def test_silos_section_tables_error_and_violation_against_the_number_of_silos(tmp_path: Path):
    """The number-of-silos section (the SteFFLe paper's Figure 2 c, d) from known runs: one silo (h does not apply)
    and 3 silos at h 0 and 0.75, lambda 0 and 1, two seeds each; means in the table, the lowest violation per (h, N)
    in the summary, and both figures written and linked."""
    from silofl.protocols.config import RunConfig

    out = tmp_path / "sweeps" / "steffle_credit_silos"
    known = {  # (N, h, lambda) -> (error, violation)
        (1, 0.0, 0.0): (0.18, 0.04),
        (1, 0.0, 1.0): (0.19, 0.02),
        (3, 0.0, 0.0): (0.20, 0.06),
        (3, 0.0, 1.0): (0.21, 0.03),
        (3, 0.75, 0.0): (0.22, 0.08),
        (3, 0.75, 1.0): (0.23, 0.05),
    }
    for (n, h, lam), (error, violation) in known.items():
        for seed, sign in ((0, -1), (1, 1)):
            name = f"steffle__n={n}_h={h}_lambda={lam}_seed={seed}"
            values = {
                "algorithm": "steffle",
                "dataset": "credit",
                "num-silos": n,
                "heterogeneity": h,
                "partition": "attribute",
                "fairness": "dp",
                "epsilon": 1.0,
                "lambda": lam,
                "seed": seed,
                "out-dir": str(out / name),
            }
            config = RunConfig.parse(values).to_json()
            final = {"error": error + sign * 0.01, "dp_violation": violation + sign * 0.005}
            _write_run(out / name, "steffle", config, final, 10.0)
    _lines, files, text = _section(results_silos.silos_section, tmp_path)
    assert files.runs == 12
    assert "| - | 1 | 1 | 2 | 0.1900 ± 0.0141 | 0.0200 ± 0.0071 | - | 1.0000 |" in text
    assert "| 0.75 | 3 | 0 | 2 | 0.2200 ± 0.0141 | 0.0800 ± 0.0071 | - | 1.0000 |" in text
    # summary: N = 1 appears under both h; the lowest violation is lambda 1's, with its error
    assert "| 0 | 1 | 0.1800 | 0.0400 | 0.0200 (1) | 0.1900 |" in text
    assert "| 0.75 | 1 | 0.1800 | 0.0400 | 0.0200 (1) | 0.1900 |" in text
    assert "| 0.75 | 3 | 0.2200 | 0.0800 | 0.0500 (1) | 0.2300 |" in text
    # the computed conclusion: error 0.18 -> 0.20 at h 0 (grows); violation 0.04 and 0.06, a range (0.02) beyond
    # the seeds' sd (0.0071)
    assert "h 0: error 0.1800 with 1 silo and 0.2000 with 3 (grows); violation between 0.0400 and 0.0600" in text
    assert "a range beyond the typical seed sd (0.0071)" in text
    links = re.findall(r"!\[SteFFLe against the number of silos\]\(([^)]+)\)", text)
    assert len(links) == 2
    for link in links:
        assert (tmp_path / "docs" / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_heterogeneity_section_finds_a_trend_only_beyond_the_seeds_spread(tmp_path: Path):
    """The heterogeneity section (the SteFFLe paper's Figure 2 a, b) from known runs: on Credit Card the error rises
    with h by the same amount for every seed (a trend, though smaller than the spread between seeds) while the
    violation moves by +-0.01 with the seed (flat); the table holds the means; Adult without runs says so."""
    from silofl.protocols.config import RunConfig

    out = tmp_path / "sweeps" / "steffle_credit_heterogeneity"
    for h, lam, eps, seed in itertools.product((0.0, 0.5, 0.9), (0.0, 1.0), (1.0, "inf"), (0, 1, 2)):
        name = f"steffle__h={h}_lambda={lam}_epsilon={eps}_seed={seed}"
        values = {
            "algorithm": "steffle",
            "dataset": "credit",
            "num-silos": 3,
            "heterogeneity": h,
            "partition": "attribute",
            "fairness": "dp",
            "epsilon": eps,
            "lambda": lam,
            "seed": seed,
            "out-dir": str(out / name),
        }
        config = RunConfig.parse(values).to_json()
        error = 0.15 + 0.05 * seed + 0.02 * h  # seeds far apart, the same rise with h for each
        violation = 0.05 + (0.01 if (seed + int(10 * h)) % 2 else -0.01)  # up or down with the seed
        _write_run(out / name, "steffle", config, {"error": error, "dp_violation": violation}, 10.0)
    _lines, files, text = _section(results_heterogeneity.heterogeneity_section, tmp_path)
    assert files["steffle_credit_heterogeneity"].runs == 36 and files["steffle_adult_heterogeneity"].runs == 0
    assert "silofl sweep" in text and "Not generated yet" in text  # Adult: no runs
    # the table: epsilon 1, lambda 1, means over the seeds at h 0, 0.5, 0.9 (errors 0.20, 0.21, 0.218)
    assert "| 1 | 1 | 3 | 0.2000 / 0.0467 | 0.2100 / 0.0533 | 0.2180 / 0.0533 |" in text
    assert "epsilon 1, lambda 1: error +0.0180 ± 0.0000 (rises), violation +0.0067 ± 0.0133 (flat)" in text
    assert "Here 4 of the 8 changes above are rises." in text
    links = re.findall(r"!\[SteFFLe against silo heterogeneity\]\(([^)]+)\)", text)
    assert len(links) == 2
    for link in links:
        assert (tmp_path / "docs" / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_record_section_compares_each_steffle_mode_with_fedfdp_at_their_matched_error(tmp_path: Path):
    """SteFFLe --protect record against FedFDP from known runs (Adult, epsilon 1, two seeds): the matched error is
    the best both reach (FedFDP's 0.165), SteFFLe-record's violation there is interpolated on its front (0.075 on the
    means) against FedFDP's 0.12: 37.5% lower; each seed's own rule gives 39.1% and 36.0%; Credit has no runs."""
    from silofl.protocols.config import RunConfig

    out = tmp_path / "sweeps" / "steffle_adult_record"
    known = {  # (method, lambda) -> (error, violation), the mean of two seeds (violation +-0.005)
        ("steffle-record", 0.0): (0.16, 0.10),
        ("steffle-record", 1.0): (0.17, 0.05),
        ("steffle", 0.0): (0.15, 0.12),
        ("steffle", 1.0): (0.155, 0.04),
        ("fedfdp", 0.1): (0.165, 0.12),
        ("fedfdp", 0.5): (0.18, 0.10),
    }
    for (method, lam), (error, violation) in known.items():
        for seed, sign in ((0, -1), (1, 1)):
            name = f"{method}__lambda={lam}_seed={seed}"
            values = {
                "algorithm": "fedfdp" if method == "fedfdp" else "steffle",
                "dataset": "adult",
                "num-silos": 3,
                "heterogeneity": 0.0,
                "fairness": "dp",
                "epsilon": 1.0,
                "lambda": lam,
                "seed": seed,
                "out-dir": str(out / name),
            }
            if method == "steffle-record":
                values["protect"] = "record"
            config = RunConfig.parse(values).to_json()
            final = {"error": error, "dp_violation": violation + sign * 0.005}
            _write_run(out / name, method, config, final, 10.0)
    _lines, files, text = _section(results_record.record_section, tmp_path)
    assert files["steffle_adult_record"].runs == 12 and files["steffle_credit_record"].runs == 0
    assert "Credit Card: not generated yet" in text
    assert (
        "| Adult | 1 | steffle-record (the whole record) | 0.1650 (fedfdp) | 0.0750 | 0.1200 | 37.5% | 39.1%, 36.0% |"
        in text
    )
    # SteFFLe protecting s: both reach 0.165; its front there is (0.155, 0.04): 1 - 0.04 / 0.12
    assert "| Adult | 1 | steffle (the sensitive attribute) | 0.1650 (fedfdp) | 0.0400 | 0.1200 | 66.7% |" in text
    assert "SteFFLe protecting the whole record against FedFDP: 37.5% lower violation" in text
    # each method's own reach: its most accurate and its fairest configuration
    assert "| Adult | 1 | fedfdp | 0.1650 / 0.1200 (lambda 0.1) | 0.1000 / 0.1800 (lambda 0.5) |" in text
    assert "| Adult | 1 | steffle-record | 0.1600 / 0.1000 (lambda 0) | 0.0500 / 0.1700 (lambda 1) |" in text
    links = re.findall(r"!\[SteFFLe protecting the whole record against FedFDP\]\(([^)]+)\)", text)
    assert len(links) == 1 and (tmp_path / "docs" / links[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: DP-FERMI's known runs: (epsilon, lambda) -> (test error, dp violation), each the mean of two seeds.
DP_FERMI_KNOWN = {
    (1.0, 0.0): (0.15, 0.10),
    (1.0, 1.0): (0.155, 0.06),  # within lambda 0's error + 0.01: the lowest violation in the budget
    (1.0, 2.0): (0.17, 0.03),  # lower violation, but over the budget
    (3.0, 0.0): (0.15, 0.10),
    (3.0, 1.0): (0.152, 0.05),
    (3.0, 2.0): (0.158, 0.04),
    ("inf", 0.0): (0.15, 0.10),
    ("inf", 1.0): (0.151, 0.03),
    ("inf", 2.0): (0.165, 0.01),
}


def _dp_fermi_runs(root: Path) -> None:
    """DP_FERMI_KNOWN as the dp_fermi_adult sweep's run folders (one silo, seeds 0 and 1: error +-0.01, violation
    +-0.005 around the means)."""
    from silofl.protocols.config import RunConfig

    out = root / "sweeps" / results_dp_fermi.DP_FERMI_SWEEP
    one_silo = {"algorithm": "steffle", "dataset": "adult", "num-silos": 1, "heterogeneity": 0.0, "fairness": "dp"}
    for (eps, lam), (error, violation) in DP_FERMI_KNOWN.items():
        for seed, sign in ((0, -1), (1, 1)):
            folder = out / f"dp-fermi__epsilon={eps}_lambda={lam}_seed={seed}"
            values = {**one_silo, "epsilon": eps, "lambda": lam, "seed": seed, "out-dir": str(folder)}
            final = {"error": error + sign * 0.01, "dp_violation": violation + sign * 0.005}
            _write_run(folder, "dp-fermi", RunConfig.parse(values).to_json(), final, 10.0)


def test_dp_fermi_section_tables_each_epsilon_and_finds_the_lowest_violation_within_the_error_budget(tmp_path: Path):
    """DP-FERMI at its paper's settings from known runs (epsilon 1, 3 and inf; lambda 0, 1, 2; two seeds): the table
    holds mean ± sd per (epsilon, lambda); the conclusion takes, per epsilon, the lowest mean violation among the
    lambdas within 0.01 of lambda 0's error (lambda 2 at epsilon 1 is lower but over it) and sees it fall from
    epsilon 1 to 3; the paper's claim is quoted beside it; the figure is written and linked."""
    _dp_fermi_runs(tmp_path)
    lines, files, text = _section(results_dp_fermi.dp_fermi_section, tmp_path)
    assert lines[0] == results_dp_fermi.DP_FERMI_HEADING and files.runs == 18
    assert "python benchmarks/results.py --only dp-fermi" in text
    assert "dp-fermi: 18 runs (lambda {0, 1, 2}; epsilon {1, 3, inf}; seeds 0, 1)" in text
    assert "| 1 | 1 | 2 | 0.1550 ± 0.0141 | 0.0600 ± 0.0071 |" in text
    assert "| inf | 2 | 2 | 0.1650 ± 0.0141 | 0.0100 ± 0.0071 |" in text
    assert (
        "- epsilon 1: lambda 0 error 0.1500, violation 0.1000; within the budget the lowest violation is 0.0600 "
        "(lambda 1, error 0.1550; -40% against lambda 0)." in text
    )
    assert "is 0.0400 (lambda 2, error 0.1580; -60% against lambda 0)." in text
    assert "- epsilon inf (no noise: FERMI): lambda 0 error 0.1500, violation 0.1000; within the budget" in text
    assert "That lowest violation falls at every step of epsilon (0.0600, 0.0400 at epsilon 1, 3)" in text
    assert "by a median sd of 0.0071." in text
    # at one error (the largest all three reach: epsilon 3's 0.158), each front interpolated; seeds paired
    assert (
        "the largest every epsilon reaches (0.1580), each epsilon's lowest violation at an error <= it (its Pareto "
        "front, interpolated as in the headline) is 0.0540 (epsilon 1), 0.0400 (epsilon 3), 0.0200 (epsilon inf)."
    ) in text
    assert (
        "From epsilon 1 to inf, each seed's runs alone (each its own matched error), the violation changes by -0.0340"
        in text
    )
    assert "[-0.0340, -0.0340]: falls)." in text
    assert "the grid's largest lambda" not in text  # epsilon 1's lowest within the budget is lambda 1, not 2
    assert "DP-FERMI offers superior fairness-accuracy tradeoffs at every privacy (ϵ) level." in text
    assert "this sweep has no Tran baseline at these settings" in text
    links = re.findall(r"!\[DP-FERMI on Adult[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 1 and (tmp_path / "docs" / links[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a lowest violation that rises with epsilon is named
    rising = {1.0: {0.0: (0.15, 0.1), 1.0: (0.155, 0.03)}, 3.0: {0.0: (0.15, 0.1), 1.0: (0.155, 0.05)}}
    assert (
        "does not fall at every step of epsilon (0.0300, 0.0500 at epsilon 1, 3): it does not fall from epsilon 1 "
        "to 3." in "\n".join(results_dp_fermi.dp_fermi_conclusion(rising))
    )
    # every epsilon's lowest violation within the budget at the grid's largest lambda: the grid, not the budget, binds
    assert "At every epsilon that lowest violation is the grid's largest lambda (1), still inside the budget" in (
        "\n".join(results_dp_fermi.dp_fermi_conclusion(rising))
    )
    # without the sweep's folder: not generated yet, with the command
    lines, files, _ = _section(results_dp_fermi.dp_fermi_section, tmp_path, "none")
    assert files.runs == 0 and "Not generated yet: run `SILOFL_DATA_DIR=../shared/data silofl sweep" in lines[-2]


#: FedSC's known runs: (epsilon, participation) -> (linear probe, kNN at round 50, final kNN, epsilon spent), each
#: the mean of two seeds (accuracies +-0.01 with the seed; seed 1 is always above seed 0).
FEDSC_KNOWN = {
    (1.0, 1.0): (0.70, 0.60, 0.66, 0.99),
    (3.0, 1.0): (0.72, 0.62, 0.68, 2.98),
    ("inf", 1.0): (0.73, 0.63, 0.69, "inf"),
    (1.0, 0.5): (0.66, 0.58, 0.64, 0.51),
    (3.0, 0.5): (0.69, 0.60, 0.66, 1.52),
    ("inf", 0.5): (0.72, 0.62, 0.68, "inf"),
}
#: The same at participation 0.5 with Rbar_{-j} from the latest shares only (method fedsc-fresh, silofl's default).
FEDSC_FRESH_KNOWN = {
    (1.0, 0.5): (0.69, 0.60, 0.655, 0.51),
    (3.0, 0.5): (0.705, 0.61, 0.67, 1.52),
    ("inf", 0.5): (0.725, 0.62, 0.685, "inf"),
}


def _fedsc_result(folder: Path, eps, part: float, seed: int, known: tuple, method: str = "fedsc") -> None:
    """A FedSC run's result.json with the blocks a real one has (config as `silofl run` writes it, federation,
    per-round entries with the kNN monitor at round 50 and the final evaluation at round 100, final metrics, the
    privacy block with FedSC's own report, timing, server state, status), validated and written as a RunResult."""
    from silofl.protocols.config import RunConfig
    from silofl.server.result import write_result

    probe, knn_mid, knn_final, spent = known
    shift = 0.01 if seed else -0.01
    values = {
        "algorithm": "fedsc",
        "dataset": "fashion-mnist",
        "model": "cnn",
        "num-silos": 10,
        "partition": "classes",
        "classes-per-silo": 1,
        "rounds": 100,
        "local-steps": 1,
        "eval-every": 50,
        "epsilon": eps,
        "delta": 1e-2,
        "participation": part,
        "seed": seed,
        "stale-shares": "drop" if method == "fedsc-fresh" else "keep",
        "out-dir": str(folder),
    }
    config = RunConfig.parse(values).to_json()
    private = spent != "inf"
    final = {
        "accuracy": probe + shift,
        "error": 1 - probe - shift,
        "probe_train_accuracy": probe + 0.05,
        "knn_accuracy": knn_final + shift,
    }
    rounds = []
    for t in range(1, 101):
        entry = {"round": t, "seconds": 0.5, "lr": 0.05, "epsilon_spent": spent if private else "inf"}
        if t == 50:
            entry["knn_accuracy"] = knn_mid + shift
        if t == 100:
            entry |= final
        rounds.append(entry)
    silo = {"epsilon_spent": spent, "noise_multiplier": 1.0, "sampling_rate": 1.0, "n_train": 6000}
    privacy = {
        "epsilon_target": eps,
        "epsilon_spent": spent,
        "delta": 1e-2,
        "per_silo": {str(j): {**silo, "rounds_answered": 100} for j in range(10)},
        "accountant": "rdp" if private else "none (no noise: epsilon = inf)",
        "mechanism": "DP-CalR (FedSC Algorithm 2)",
        "not_covered": "the model updates",
        "relation": "replace_one (Poisson rate q = 0.01)",
        "calr_sampling_rate": 0.01,
        "planned_shares": 100,
    }
    if private:
        privacy["correlation_shares"] = {str(j): {"shares": int(100 * part), "noise_std": 0.01} for j in range(10)}
    result = {
        "config": config,
        "engine": "inprocess",
        "federation": {"silos": [{"silo_id": j, "n_train": 6000, "n_test": 1000} for j in range(10)], "rounds": 100},
        "rounds": rounds,
        "final": {"loss": None, "dp_violation": None, "eo_violation": None, "eopp_violation": None, **final},
        "privacy": privacy,
        "timing": {"total_seconds": 60.0, "seconds_per_round": 0.6},
        "model": "in model.npz next to this file (too large for JSON)",
        "server_state": {"sharing": True, "participation": part, "server_optimizer": "adam"},
        "status": {"completed": True, "state": "completed", "rounds_completed": 100, "error": None},
    }
    write_result(result, folder)  # a RunResult: a field that drifts from the format fails here
    (folder / "run.json").write_text(json.dumps({"method": method, "config": config}))


def test_fedsc_privacy_section_from_known_runs(tmp_path: Path):
    """FedSC across epsilon and participation from known runs (epsilon 1, 3, inf x participation 1, 0.5 x two
    seeds, and participation 0.5 again with Rbar_{-j} from the latest shares): the table's means ± sd of the final
    linear probe and kNN, what Rbar_{-j} is made of, the accountant's epsilon spent and the rounds; the conclusion:
    accuracy rises with epsilon at each participation and for each Rbar_{-j} (paired by seed: the same rise for both
    seeds, a trend), participation 0.5's cost at each epsilon with each, the latest shares against the stale cache;
    the paper's Table 3 beside it; the kNN-over-rounds figure."""
    out = tmp_path / "sweeps" / results_fedsc_privacy.FEDSC_PRIVACY_SWEEP
    for method, table in (("fedsc", FEDSC_KNOWN), ("fedsc-fresh", FEDSC_FRESH_KNOWN)):
        for (eps, part), known in table.items():
            for seed in (0, 1):
                folder = out / f"{method}__epsilon={eps}_participation={part}_seed={seed}"
                _fedsc_result(folder, eps, part, seed, known, method)
    lines, files, text = _section(results_fedsc_privacy.fedsc_privacy_section, tmp_path)
    assert lines[0] == results_fedsc_privacy.FEDSC_PRIVACY_HEADING and files.runs == 18
    assert "python benchmarks/results.py --only fedsc-privacy" in text
    assert "| 1 | 1 | all fresh (participation 1) | 2 | 70.0% ± 1.4 | 66.0% ± 1.4 | 0.99 ± 0.00 | 100 |" in text
    assert "| 3 | 0.5 | the stale cache (the paper's) | 2 | 69.0% ± 1.4 | 66.0% ± 1.4 | 1.52 ± 0.00 | 100 |" in text
    assert "| inf | 1 | all fresh (participation 1) | 2 | 73.0% ± 1.4 | 69.0% ± 1.4 | inf (no noise) | 100 |" in text
    fresh_row = "| 3 | 0.5 | the latest shares (silofl's default) | 2 | 70.5% ± 1.4 | 67.0% ± 1.4 | 1.52 ± 0.00 | 100 |"
    assert fresh_row in text and text.index(fresh_row) < text.index("| 3 | 0.5 | the stale cache")
    assert (
        "- Participation 1, epsilon 1, 3, inf: linear probe 70.0%, 72.0%, 73.0% (rises at every step; epsilon 1 to "
        "inf paired by seed: +3.0 ± 0.0 points (rises)); kNN 66.0%, 68.0%, 69.0% (rises at every step;" in text
    )
    assert (
        "- Participation 0.5, Rbar_{-j} from the stale cache (the paper's), epsilon 1, 3, inf: linear probe 66.0%, "
        "69.0%, 72.0% (rises at every step;" in text
    )
    assert (
        "- Participation 0.5, Rbar_{-j} from the latest shares (silofl's default), epsilon 1, 3, inf: linear probe "
        "69.0%, 70.5%, 72.5% (rises at every step;" in text
    )
    assert (
        "- Epsilon 1, participation 1 to 0.5 (paired by seed), the latest shares (silofl's default): linear probe "
        "-1.0 ± 0.0 points (falls); kNN -0.5 ± 0.0 points (falls); epsilon spent 0.99 ± 0.00 and 0.51 ± 0.00; the "
        "stale cache (the paper's): linear probe -4.0 ± 0.0 points (falls); kNN -2.0 ± 0.0 points (falls); epsilon "
        "spent 0.99 ± 0.00 and 0.51 ± 0.00." in text
    )
    assert (
        "- Epsilon 1, participation 0.5, from the stale cache to the latest shares only (paired by seed): linear probe "
        "+3.0 ± 0.0 points (rises); kNN +1.5 ± 0.0 points (rises)." in text
    )
    assert "- Epsilon inf, participation 1 to 0.5 (paired by seed), the latest shares" in text
    assert (
        "Beside the paper's trends: with every silo each round, epsilon 1 to inf moves the probe by +3.0 ± 0.0 points "
        "(rises) here (the paper: +0.85 from epsilon 3 to inf); partial participation costs 0.5 to 1.5 probe points "
        "with the latest shares (silofl's default) (over 3 epsilons); partial participation costs 1.0 to 4.0 probe "
        "points with the stale cache (the paper's) (over 3 epsilons), against the paper's 2.24-2.94 at 2 of 10 "
        "clients." in text
    )
    assert '"deploying DP leads to negligible performance degradation"' in text
    assert "partial participation costs it 2.24-2.94 points at each epsilon" in text
    links = re.findall(r"!\[FedSC kNN accuracy over rounds[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 1 and (tmp_path / "docs" / links[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_only_fedsc_privacy_inserts_its_section_before_not_reproduced(tmp_path: Path):
    """`--only fedsc-privacy` on a document without the section puts it after the FedSC section, before "Not
    reproduced" (the sections that would come between are absent), and a second call replaces it in place."""
    out = tmp_path / "sweeps" / results_fedsc_privacy.FEDSC_PRIVACY_SWEEP
    for seed in (0, 1):
        _fedsc_result(out / f"fedsc__seed={seed}", 1.0, 1.0, seed, FEDSC_KNOWN[(1.0, 1.0)])
    doc = tmp_path / "docs" / "RESULTS.md"
    before = f"# silofl results\n\n{results_fedsc.FEDSC_HEADING}\n\nfedsc\n\n"
    after = "## Not reproduced\n\nlist\n"
    doc.parent.mkdir(parents=True)
    doc.write_text(before + after)
    argv = ["--only", "fedsc-privacy", "--sweeps", str(tmp_path / "sweeps"), "--out", str(doc)]
    for _ in range(2):
        assert results.main(argv) == 0
        text = doc.read_text()
        assert text.startswith(before + results_fedsc_privacy.FEDSC_PRIVACY_HEADING) and text.endswith(after)
        assert text.count(results_fedsc_privacy.FEDSC_PRIVACY_HEADING) == 1
    assert "regenerated alone (`python benchmarks/results.py --only fedsc-privacy`)" in text and "from 2 runs" in text


def test_only_parkinsons_replaces_its_sections_before_the_summary(tmp_path: Path):
    """`--only parkinsons` writes the Parkinsons sections from their runs into an existing document, before the
    summary, leaving the rest as it was; a second call replaces them in place."""
    out = _fake_sweep(tmp_path)
    out.rename(tmp_path / "sweeps" / "steffle_parkinsons_dp")
    doc = tmp_path / "docs" / "RESULTS.md"
    doc.parent.mkdir(parents=True)
    before = "# silofl results\n\n### Credit Card, equalized odds\n\nold credit\n\n"
    after = f"{results_steffle.SUMMARY_HEADING}\n\nold summary\n\n## DP-mu2-FL\n\nmu2\n"
    doc.write_text(before + after)
    argv = ["--only", "parkinsons", "--sweeps", str(tmp_path / "sweeps"), "--sweep-files", str(tmp_path / "none")]
    argv += ["--out", str(doc), "--allow-missing"]  # the equalized-odds sweep has no runs here
    for _ in range(2):
        assert results.main(argv) == 0
        text = doc.read_text()
        assert text.startswith(before) and text.endswith(after)
        assert text.count("### Parkinsons, demographic parity") == 1
        assert text.count("### Parkinsons, equalized odds") == 1
    dp = text[text.index("### Parkinsons, demographic parity") : text.index("### Parkinsons, equalized odds")]
    assert "regenerated alone (`python benchmarks/results.py --only parkinsons`)" in dp
    assert "| h | epsilon | vs tran | vs fedavg |" in dp
    assert "Not generated yet" in text[text.index("### Parkinsons, equalized odds") :]


@pytest.mark.parametrize("only", [None, *results.ONLY_CHOICES])
def test_without_the_sweeps_runs_nothing_is_written_and_the_error_names_them(tmp_path: Path, capsys, only) -> None:
    """A fresh checkout has no run folders: regenerating would replace the documented results with "not run yet".
    The script refuses, names the sweeps and their commands, and leaves the document byte for byte as it was."""
    doc = tmp_path / "RESULTS.md"
    doc.write_text("# silofl results\n\ndocumented\n")
    (tmp_path / "sweeps" / "steffle_adult_dp").mkdir(parents=True)  # a folder without a result.json is no run
    argv = ["--sweeps", str(tmp_path / "sweeps"), "--out", str(doc), *(["--only", only] if only else [])]
    assert results.main(argv) == 2
    assert doc.read_text() == "# silofl results\n\ndocumented\n"
    err = capsys.readouterr().err
    names = results.sweeps_read(only)
    assert names and all(name in err for name in names)
    assert "Nothing was written" in err and "--allow-missing" in err
    assert f"silofl sweep benchmarks/sweeps/{names[0]}.toml" in err


def test_results_md_holds_the_not_reproduced_list_as_the_generator_writes_it() -> None:
    from benchmarks.results_not_reproduced import NOT_REPRODUCED, not_reproduced_section

    text = (Path(__file__).resolve().parents[2] / "docs" / "RESULTS.md").read_text()
    assert "\n".join(not_reproduced_section()).rstrip() in text
    assert {paper for paper, _, _ in NOT_REPRODUCED} == {"SteFFLe", "DP-FERMI", "FedSC"}
