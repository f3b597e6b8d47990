"""DP-mu2-FL's server: anytime averaging (the paper's Algorithms 1 and 2, "Server"; `protocols.mu2fl` has the math).

The server keeps w_t, x_t, x_{t-1} and t in float64. Each round it broadcasts the query points x_t and x_{t-1}, averages
the silos' q_t (equal weights: every silo answers every round), adds one Gaussian draw when it is the trusted server
(Algorithm 2), and steps: w_{t+1} = Proj_K(w_t - eta qbar), x_{t+1} = t/(t+2) x_t + 2/(t+2) w_{t+1}. K is the ball of
radius D/2 around 0 and x_1 = 0 (the paper's Algorithms 1 and 2 take x_1 as an input; silofl fixes it). The run's output
is x_T (the last query point the silos were asked about), as the paper states; x_{T+1} is kept in the server state.

The noisy-SGD baseline (`noisy-sgd`) is DP-mu2-FL's baseline at the same rho and shares this server
(`build_noisy_sgd`): the same state, broadcast and trusted/untrusted noise, with a projected SGD step and the uniform
average of the iterates in place of the anytime step (`protocols.mu2fl.calibrate_noisy_sgd`).

Noise of the trusted server: drawn from (seed, M, t) in simulation (the engines "inprocess" and "ray"), so runs are
reproducible and match `protocols.mu2fl.run_mu2_reference`; from the operating system's entropy in a deployment, where
the silos know the run seed and could otherwise subtract it from the released x_t.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from silofl.protocols import messages as msg
from silofl.protocols import mu2fl
from silofl.protocols.models import flatten_parameters, unflatten_parameters
from silofl.strategies.base import SiloflStrategy, StrategyInputs
from silofl.strategies.replies import Arrays, SiloUpdate


class Mu2flStrategy(SiloflStrategy):
    """DP-mu2-FL's server: anytime averaging (untrusted: silos noise their q_t; trusted: the server noises the mean).

    Reshef, Levy, "Private and Federated Stochastic Convex Optimization: Efficient Strategies for Centralized Systems",
    2024 (Algorithm 1, untrusted server; Algorithm 2, trusted server). With algorithm "noisy-sgd" (silofl's baseline for
    it, sharing this server; the paper runs none) the silos send noised mean gradients at x_t and the server takes a
    projected SGD step and keeps the uniform average of its iterates (`protocols.mu2fl.calibrate_noisy_sgd`).

    Parameters
    ----------
    federation, param_spec, instruction, eval_instruction, timeout
        as :class:`strategies.base.SiloflStrategy`.
    calibration : protocols.mu2fl.Mu2Calibration
        the run's step size eta, noise std sigma, rho and trust model.
    radius : float
        D / 2, the radius of the ball K the server projects w onto.
    seeded : bool
        draw the trusted server's noise from (seed, M, t) (simulation) rather than the operating system's entropy.
    projected_sgd : bool
        the noisy-SGD baseline's step instead of anytime averaging.
    """

    array_dtype = "float64"

    def __init__(
        self,
        *args,
        calibration: mu2fl.Mu2Calibration,
        radius: float,
        seeded: bool,
        projected_sgd: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.calibration = calibration
        self.radius = radius
        self.seeded = seeded
        self.projected_sgd = projected_sgd
        dim = sum(int(np.prod(shape)) for _, shape in self.param_spec)
        self.w = np.zeros(dim)  # w_1 = x_1 = 0
        self.x = np.zeros(dim)
        self.x_prev = np.zeros(dim)  # x_0 = x_1

    def initial_arrays(self) -> ArrayRecord:
        return msg.arrays_record(unflatten_parameters(self.x, self.param_spec))

    def train_records(self, server_round: int, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        return {
            msg.MODEL: msg.arrays_record(unflatten_parameters(self.x, self.param_spec)),
            msg.PREVIOUS: msg.arrays_record(unflatten_parameters(self.x_prev, self.param_spec)),
        }

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        as32 = {name: a.numpy().astype(np.float32) for name, a in arrays.items()}
        return list(super().configure_evaluate(server_round, msg.arrays_record(as32), config, grid))

    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        t = server_round
        qbar = np.mean([flatten_parameters(arrays[msg.UPDATE]) for _, arrays, _ in updates], axis=0)
        cal = self.calibration
        if cal.trusted and cal.sigma > 0:
            seed = mu2fl.noise_seed(self.instruction.seed, cal.num_silos, t) if self.seeded else secrets.randbits(63)
            qbar = qbar + cal.sigma * np.random.default_rng(seed).standard_normal(qbar.shape[0])
        output = self.x  # x_t
        if self.projected_sgd:  # noisy SGD: projected SGD, uniform average of the iterates w_1..w_{t+1}
            self.w = mu2fl.project_ball(self.w - cal.eta * qbar, self.radius)
            x_next = (t * self.x + self.w) / (t + 1)
        else:
            self.w, x_next = mu2fl.server_step(self.w, self.x, qbar, t, cal.eta, self.radius)
        self.x_prev, self.x = self.x, x_next
        last = t >= self.instruction.total_rounds
        return unflatten_parameters(output if last else self.x, self.param_spec)

    def result_state(self) -> dict[str, object]:
        cal = self.calibration
        return {  # a non-private run has rho = epsilon = inf: strings, since result.json is strict JSON
            "rho": "inf" if math.isinf(cal.rho) else cal.rho,
            "epsilon_closed_form": "inf" if math.isinf(cal.epsilon) else cal.epsilon,
            "sigma": cal.sigma,
            "eta": cal.eta,
            "trust": "trusted" if cal.trusted else "untrusted",
        }


def _build(inputs: StrategyInputs, calibrate, *, projected_sgd: bool) -> Mu2flStrategy:
    config, federation = inputs.config, inputs.federation
    info = federation.info
    constants = mu2fl.Mu2Constants.for_logreg(info.num_features, info.num_labels, D=config.domain_diameter)
    calibration = calibrate(
        constants,
        num_rounds=inputs.rounds,
        num_silos=len(federation.silos),
        rho=mu2fl.resolve_rho(config.rho, config.epsilon, inputs.delta),
        trusted=config.trust == "trusted",
        batch_size=config.batch_size,
        delta=inputs.delta,
    )
    return Mu2flStrategy(
        federation,
        inputs.tabular_spec(),
        calibration=calibration,
        radius=constants.radius,
        seeded=inputs.engine in ("inprocess", "ray"),
        projected_sgd=projected_sgd,
        **inputs.common,
    )


def build_mu2fl(inputs: StrategyInputs) -> Mu2flStrategy:
    """DP-mu2-FL's server (the `mu2fl` registry entry): anytime averaging with corrected momentum."""
    return _build(inputs, mu2fl.calibrate, projected_sgd=False)


def build_noisy_sgd(inputs: StrategyInputs) -> Mu2flStrategy:
    """The noisy-SGD baseline's server (the `noisy-sgd` registry entry): projected SGD, averaged iterates."""
    return _build(inputs, mu2fl.calibrate_noisy_sgd, projected_sgd=True)
