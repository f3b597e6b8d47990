"""The "Not reproduced" section of docs/RESULTS.md: each experiment of the four papers that silofl does not run, and
why. Written by hand (a statement of what is missing, not a measurement); `benchmarks/results.py` appends it after the
measured sections.
"""

from __future__ import annotations

NOT_REPRODUCED_HEADING = "## Not reproduced"

#: (paper, experiment, why silofl does not run it).
NOT_REPRODUCED: tuple[tuple[str, str, str], ...] = (
    (
        "SteFFLe",
        "Figure 4: the Retired Adult dataset (demographic parity, 3 silos)",
        "no offline copy: Retired Adult (Ding et al. 2021, built from US Census ACS samples) is not among the "
        "verified datasets these machines carry, and tests never download",
    ),
    (
        "SteFFLe",
        "15 trials per point (Figures 1-5)",
        "3 seeds per point, for the sweeps' CPU budget on 2-core machines; each section reports the spread over its "
        "seeds",
    ),
    (
        "DP-FERMI",
        "Figure 5: a deep CNN on UTK-Face (128x128 images, epsilon 10-200, 150 epochs)",
        "no offline copy of UTK-Face, and a deep CNN on 128x128 images is GPU work; the same algorithm runs a user's "
        "network through `--model module:factory` (docs/CUSTOM_MODEL.md)",
    ),
    (
        "DP-FERMI",
        "Figures 6 and 10: Retired Adult",
        "no offline copy (as above)",
    ),
    (
        "DP-FERMI",
        "its Section 4.1.1 settings (Appendix F.2.1: batch 1024, 200 epochs, constant steps) on Credit Card and "
        "Parkinsons",
        "sized for Adult only (`benchmarks/sweeps/dp_fermi_adult.toml`, 7-24 CPU seconds per run; the same file "
        "with `dataset` changed runs them); Credit Card and Parkinsons appear above at SteFFLe's settings (DP-FERMI "
        "is SteFFLe with one silo)",
    ),
    (
        "FedSC",
        "Tables 2-5 at the paper's scale: SVHN, CIFAR-10, CIFAR-100 with a ResNet, 200 rounds of 5 local epochs",
        "silofl reads CIFAR-10 (downloaded and sha256-checked where a network is at hand) but has no SVHN or "
        "CIFAR-100 loader, none of the three is on these machines, and one forward and backward pass of that model on "
        "256 images takes 34 s on their CPUs; docs/FEDSC.md gives the GPU command for a user who has both. silofl "
        "runs the protocol at CPU scale on Fashion-MNIST",
    ),
    (
        "FedSC",
        "Table 2's other methods (FedAvg + BYOL, FedU, FedEMA, FedX, FedCA)",
        "not implemented in silofl; its baseline is FedAvg+SC, the paper's own ablation",
    ),
)

INTRO = (
    "The experiments of the four papers that silofl does not run, and why. DP-mu2-FL's Tables 1 and 2 are reproduced "
    "in full. Four studies have their own sections, each from its own sweep: SteFFLe across heterogeneity h in "
    "{0, 0.25, 0.5, 0.75, 0.9} with non-private SteFFLe (`steffle_adult_heterogeneity.toml`, "
    "`steffle_credit_heterogeneity.toml`; `python benchmarks/results.py --only heterogeneity`), SteFFLe protecting "
    "the whole record against FedFDP at the same epsilon (`steffle_adult_record.toml`, `steffle_credit_record.toml`; "
    "`--only record`), DP-FERMI at its own settings (`dp_fermi_adult.toml`; `--only dp-fermi`) and FedSC across "
    'epsilon and participation (`fedsc_fmnist_privacy.toml`; `--only fedsc-privacy`). A section reads "not generated '
    'yet" until its sweep has run, and this document holds it once the script has been rerun on those runs '
    "(benchmarks/sweeps/README.md has the commands)."
)


def not_reproduced_section() -> list[str]:
    """The section's markdown lines: a paragraph, then one table row per experiment."""
    lines = [NOT_REPRODUCED_HEADING, "", INTRO, "", "| paper | experiment | why not |", "|---|---|---|"]
    lines += [f"| {paper} | {experiment} | {why} |" for paper, experiment, why in NOT_REPRODUCED]
    return [*lines, ""]
