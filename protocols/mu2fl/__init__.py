"""The maths of DP-mu2-FL (`silofl run mu2fl`) and of its baseline, single-pass noisy SGD (`silofl run noisy-sgd`).

Source: Reshef, Levy, "Private and Federated Stochastic Convex Optimization: Efficient Strategies for Centralized
Systems", 2024, Algorithm 1 (untrusted server, Section 5) and Algorithm 2 (trusted server, Section 6). numpy float64
only: no Flower, no torch, so the Flower strategy (`strategies.mu2fl`) and the silo's round (`client.rounds.mu2fl`)
can call these functions and be checked against `run_mu2_reference` to 1e-10 or bit for bit. The algorithm's registry
entries are `protocols.algorithms.mu2fl` and `protocols.algorithms.noisy_sgd`.

One module a job; the public names are re-exported here (`from silofl.protocols import mu2fl`, `mu2fl.calibrate`):

* `constants`: the loss's constants G, L, D, d on K (Section 5.3; `Mu2Constants`).
* `accounting`: privacy units and accounting (the paper's rho <-> (epsilon, delta), Lemma 2.5; the noise multiplier;
  the accountant's epsilon).
* `calibration`: noise and step size (Theorems 5.2 and 6.2; `calibrate`, and `calibrate_noisy_sgd` for the
  baseline), with the sensitivity argument of Theorems 5.1 / 6.1.
* `iteration`: one silo's round, one server round, the projection onto K, each party's noise seed (Algorithms 1/2).
* `logreg`: multinomial logistic regression in closed form, in silofl's parameter layout.
* `reference`: the whole algorithm on one machine (`run_mu2_reference`).
* `checks`: the argument checks the others share.
"""

from silofl.protocols.mu2fl.accounting import (
    accountant_epsilon,
    epsilon_to_rho,
    noise_multiplier,
    resolve_rho,
    rho_to_epsilon,
)
from silofl.protocols.mu2fl.calibration import (
    Mu2Calibration,
    calibrate,
    calibrate_noisy_sgd,
    eta,
    sensitivity,
    sigma_trusted,
    sigma_untrusted,
)
from silofl.protocols.mu2fl.constants import Mu2Constants
from silofl.protocols.mu2fl.iteration import NOISE_STREAM, noise_seed, project_ball, server_step, silo_step
from silofl.protocols.mu2fl.logreg import logreg_accuracy, logreg_dim, logreg_grad, logreg_loss
from silofl.protocols.mu2fl.reference import Mu2Result, Mu2Trace, run_mu2_reference

__all__ = [
    "NOISE_STREAM",
    "Mu2Calibration",
    "Mu2Constants",
    "Mu2Result",
    "Mu2Trace",
    "accountant_epsilon",
    "calibrate",
    "calibrate_noisy_sgd",
    "epsilon_to_rho",
    "eta",
    "logreg_accuracy",
    "logreg_dim",
    "logreg_grad",
    "logreg_loss",
    "noise_multiplier",
    "noise_seed",
    "project_ball",
    "resolve_rho",
    "rho_to_epsilon",
    "run_mu2_reference",
    "sensitivity",
    "server_step",
    "sigma_trusted",
    "sigma_untrusted",
    "silo_step",
]
