"""The epsilon of shuffled epochs at the noise a Poisson run calibrated: what a shuffled run must be given as its
target to calibrate that same noise (issue 20: the Tran et al. comparison with both samplers at equal noise).

For each silo of each Poisson-sampled `steffle` or `tran` run folder given (its result.json), with the silo's n_j, the
run's m, T, delta, accountant and counts-share:

* ``sigma_P``: the noise multiplier the Poisson run calibrated (per release; result.json, privacy.per_silo);
* ``eps_shuffled``: silofl's accountant's epsilon for the SHUFFLED mechanism at sigma_P (E_j = ceil(T / B_j)
  unsampled releases of the round's two vectors) after the run's own group-count histogram (calibrated for
  counts-share x the run's target, as the silo does): the same noise, accounted for shuffled epochs;
* ``target``: the epsilon to give a shuffled run so that it calibrates sigma_P. Its histogram is calibrated for
  counts-share x its own target, so the target is the fixed point e = eps(sigma_P, E_j, histogram(counts-share x e)),
  found by iteration (the histogram's share of the budget moves the total little, so it converges in a few steps);
* ``sigma_check``: the multiplier a shuffled silo calibrates for that target (`client.round_privacy.RoundPrivacy`'s
  calibration: equal to sigma_P within the calibration's relative tolerance of 1e-3, never below it).

    SILOFL_DATA_DIR=../shared/data .venv/bin/python benchmarks/shuffle_noise.py runs/adult-eps1-poisson runs/...

Every figure is the accountant's (`protocols.privacy.accountant`, PLD under replace-one); nothing is run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from silofl.protocols.privacy.accountant import calibrate_noise, epsilon_spent
from silofl.protocols.shuffled_epochs import accounted_steps

RELATION = "replace_one"
RELEASES = 2


def histogram_multiplier(epsilon: float, delta: float, accountant: str) -> float:
    """The one-off histogram's multiplier a silo calibrates for `epsilon` (its counts-share of the target)."""
    return calibrate_noise(
        epsilon, delta, 1.0, 1, releases=1, accountant=accountant, relation=RELATION
    ).noise_multiplier


def shuffled_epsilon(sigma: float, epochs: int, delta: float, histogram: float, accountant: str) -> float:
    """The accountant's epsilon of the histogram and `epochs` unsampled releases of two vectors at `sigma`."""
    return epsilon_spent(
        sigma, 1.0, epochs, delta, releases=RELEASES, accountant=accountant, relation=RELATION, prior=[(histogram,)]
    )


def matching_target(sigma: float, epochs: int, delta: float, share: float, accountant: str, start: float) -> float:
    """The target e whose shuffled calibration (histogram at share x e, then `epochs` releases) is `sigma`: the fixed
    point of e -> shuffled_epsilon(sigma, epochs, delta, histogram(share x e)), iterated from `start` to 1e-9."""
    target = start
    for _ in range(50):
        following = shuffled_epsilon(
            sigma, epochs, delta, histogram_multiplier(share * target, delta, accountant), accountant
        )
        if abs(following - target) <= 1e-9 * target:
            return following
        target = following
    raise RuntimeError(f"no fixed point for sigma={sigma:g}, epochs={epochs}: last {target!r}")


def rows(folder: Path) -> list[dict[str, float | int | str]]:
    """One row per silo of the Poisson run in `folder`."""
    result = json.loads((folder / "result.json").read_text())
    config, privacy = result["config"], result["privacy"]
    if config.get("sampling", "poisson") != "poisson":
        raise ValueError(f"{folder}: a {config['sampling']} run; give Poisson-sampled runs")
    target, delta = float(config["epsilon"]), float(privacy["delta"])
    share, accountant, m = float(config["counts-share"]), str(config["accountant"]), int(config["batch-size"])
    rounds = int(result["federation"]["rounds"])
    out = []
    for silo_id, silo in sorted(privacy["per_silo"].items()):
        sigma, n = float(silo["noise_multiplier"]), int(silo["n_train"])
        epochs = accounted_steps(rounds, n, m)
        as_run = shuffled_epsilon(
            sigma, epochs, delta, histogram_multiplier(share * target, delta, accountant), accountant
        )
        matched = matching_target(sigma, epochs, delta, share, accountant, as_run)
        check = calibrate_noise(
            matched,
            delta,
            1.0,
            epochs,
            releases=RELEASES,
            accountant=accountant,
            relation=RELATION,
            prior=[(histogram_multiplier(share * matched, delta, accountant),)],
        ).noise_multiplier
        out.append(
            {
                "run": folder.name,
                "silo": silo_id,
                "target": target,
                "n": n,
                "T": rounds,
                "E": epochs,
                "sigma_P": sigma,
                "eps_shuffled": as_run,
                "shuffled_target": matched,
                "sigma_check": check,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of Poisson-sampled steffle or tran runs")
    args = parser.parse_args()
    print(
        "| run | silo | target eps | n_j | T | E_j | sigma (Poisson) | eps of shuffled at that sigma | "
        "shuffled target for that sigma | sigma a shuffled run calibrates there |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for folder in args.runs:
        for r in rows(folder):
            print(
                f"| {r['run']} | {r['silo']} | {r['target']:g} | {r['n']} | {r['T']} | {r['E']} | {r['sigma_P']:.6g} | "
                f"{r['eps_shuffled']:.6g} | {r['shuffled_target']:.6g} | {r['sigma_check']:.6g} |"
            )


if __name__ == "__main__":
    main()
