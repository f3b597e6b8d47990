"""Empirical privacy audit of silofl's Gaussian mechanisms: an epsilon lower bound per mechanism vs its claim.

    python benchmarks/privacy_audit.py [--trials 500000] [--epsilons 1 2 4] [--real-trials 20000] [--seed 0]

For every mechanism a silo runs, two neighbouring data sets one canary record apart (D0: canary absent or replaced;
D1: canary present) are released many times with fresh noise, and `protocols.privacy.audit.audit_releases` turns a
likelihood-ratio attack's error counts into an epsilon lower bound at 95 % confidence (threshold fitted on a separate
half of the trials). Each mechanism is audited at the noise silofl calibrates for a target (epsilon, delta = 1e-5) of
ONE release, and again with that noise divided by 10 (a deliberately broken mechanism, same claim). The claimed
epsilon is the figure silofl's own accountant reports for the noise it uses (at most the target).

The mechanisms, each built from silofl's own functions (module `Mechanism` docstring for how the releases are drawn):

* ``dp-fedsgd``: `client.algorithms.dp_fedsgd.noisy_gradient` (per-sample clipping, Gaussian noise, / (q n)) at
  sampling rate 1, logistic regression at theta = 0; add/remove one canary whose gradient is clipped to norm C.
* ``steffle-fairness``: `client.algorithms.steffle.fairness_gradients` (clipped theta part and the attribute-dependent
  W part, both noised, replace-one of a sensitive attribute, 2 releases accounted as one mechanism), rate 1.
* ``mu2fl``: the untrusted DP-mu2-FL silo's first query, through `client.rounds.mu2fl.train_round` (replace one record
  of the round's batch; noise from `protocols.mu2.calibrate`).
* ``fedsc-calr``: `protocols.privacy.calr.dp_calr` (one share; replace one representation by an orthogonal one).
* ``steffle-groups``: SteFFLe's setup histogram of (group, label) counts (`client.rounds.steffle.group_counts`;
  replace one record's group), calibrated by the silo's noise plan.

One more configuration probes what the accounting assumes:

* ``dp-fedsgd-size``: as ``dp-fedsgd``, but every other record's clipped gradient points opposite the canary's. Until
  2026-11-21 `noisy_gradient` divided by the silo's actual record count n (at q = 1), which differs by one between
  add/remove neighbours, so the release moved by up to 2 C / (n + 1) where the noise covers C / (n + 1) (measured
  lower bounds 1.68 / 3.19 / 5.31 against claims 1.00 / 2.00 / 4.00). It now divides by the run's public batch size
  m, and this row must stay below its claim like the others.

A second finding is now refused by the silo rather than audited: an untrusted server that sends query points x_T and
x_(T-1) far apart (so that the calibration's bound ||s_T|| <= S of Lemma 4.2 fails) gets a MessageError from
`client.rounds.mu2fl.check_query_step` (before the fix: lower bounds 5.26 / 8.83 / 10.44 against claims 0.74 / 1.56 /
3.25). `mu2fl_deviating_server` builds that query for the test.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict

from client import randomness
from client.algorithms.dp_fedsgd import noisy_gradient
from client.algorithms.steffle import fairness_gradients, group_label_counts, w_radius_of
from client.data.tabular import DatasetInfo, NonSensitiveDivision, SensitiveDivision, SiloData, make_split
from client.rounds import mu2fl as mu2_round
from client.rounds import steffle as steffle_round
from protocols import messages as msg
from protocols import mu2
from protocols.ermi import GroupPrior
from protocols.models import build_model, flatten_parameters, parameter_spec, unflatten_parameters
from protocols.privacy.accountant import calibrate_noise, epsilon_spent
from protocols.privacy.audit import AuditResult, audit_releases, gaussian_epsilon
from protocols.privacy.calr import calr_epsilon, calr_sensitivity, dp_calr
from protocols.privacy.gaussian import histogram_sensitivity

DELTA = 1e-5
BROKEN = 0.1  # the broken mechanism's noise scale
CONFIDENCE = 0.95

Draw = Callable[[int, int], np.ndarray]
"""``draw(trials, seed)``: standard normal noise ``(trials, dim)`` in the order and from the generator the mechanism's
code uses (so that ``trials = 1`` reproduces one real release, to float rounding)."""


@dataclass(frozen=True)
class Mechanism:
    """One of silofl's Gaussian mechanisms on a fixed pair of neighbours, ready to audit.

    ``means`` are the noise-free releases on D0 and D1 and ``stds`` the per-coordinate noise std on each, both as the
    mechanism's code computes them: the means come from silofl's own function run with zero noise, and
    :meth:`sample` adds ``stds * draw(...)``. ``real(world, seed, noise_scale)`` makes ONE release through silofl's own
    function (for ``mu2fl`` and ``steffle-groups``: the silo's round function, with its context, noise plan and
    ledger; it only takes ``noise_scale = 1``); ``noise_seed(seed)`` is the seed its noise generator then gets.
    ``tests/test_privacy_audit.py`` checks ``sample(world, 1, noise_seed(s)) == real(world, s)``, so the vectorized
    draws are releases of the code as it runs, not of a re-implementation.
    """

    name: str
    neighbours: str
    target_epsilon: float
    claimed_epsilon: float  # what silofl's accountant reports for this noise (<= target)
    means: tuple[np.ndarray, np.ndarray]
    stds: tuple[np.ndarray, np.ndarray]
    draw: Draw = field(repr=False)
    real: Callable[[int, int, float], np.ndarray] | None = field(default=None, repr=False)
    noise_seed: Callable[[int], int] = field(default=lambda seed: seed, repr=False)

    def sample(self, world: int, trials: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        """``trials`` independent releases on D0 (``world = 0``) or D1 (``world = 1``), ``(trials, dim)`` float64."""
        return self.means[world] + (noise_scale * self.stds[world]) * self.draw(trials, seed)

    def realized_mu(self, noise_scale: float = 1.0) -> float:
        """Distance between the two noise-free releases in noise stds (per-coordinate std averaged over D0 and D1)."""
        std = 0.5 * (self.stds[0] + self.stds[1]) * noise_scale
        return float(np.linalg.norm((self.means[1] - self.means[0]) / std))

    def realized_epsilon(self, noise_scale: float = 1.0) -> float:
        """Epsilon of a Gaussian mechanism at that distance: the most any attack on this pair can show."""
        return gaussian_epsilon(self.realized_mu(noise_scale), DELTA)


def audit(
    mechanism: Mechanism, trials: int, seed: int, noise_scale: float = 1.0, confidence: float = CONFIDENCE
) -> AuditResult:
    """Audit ``mechanism`` from ``trials`` vectorized releases per neighbour (independent seeds per neighbour)."""
    negative = mechanism.sample(0, trials, 2 * seed, noise_scale)
    positive = mechanism.sample(1, trials, 2 * seed + 1, noise_scale)
    return audit_releases(
        negative,
        positive,
        delta=DELTA,
        mean_negative=mechanism.means[0],
        mean_positive=mechanism.means[1],
        confidence=confidence,
    )


def audit_real(mechanism: Mechanism, trials: int, seed: int, noise_scale: float = 1.0) -> AuditResult:
    """Audit through silofl's own release function, one call per trial (slow; a cross-check of :func:`audit`)."""
    if mechanism.real is None:
        raise ValueError(f"{mechanism.name} has no stand-alone release function to loop over")
    releases = [
        np.stack([mechanism.real(world, seed * 10**7 + 2 * i + world, noise_scale) for i in range(trials)])
        for world in (0, 1)
    ]
    return audit_releases(
        releases[0],
        releases[1],
        delta=DELTA,
        mean_negative=mechanism.means[0],
        mean_positive=mechanism.means[1],
        confidence=CONFIDENCE,
    )


# --------------------------------------------------------------------------------------------------------------------
# Noise draws, calibration
# --------------------------------------------------------------------------------------------------------------------


def _torch_draw(*blocks: int, dtype: torch.dtype) -> Draw:
    """Blocks of ``torch.randn`` drawn one after the other from one generator (e.g. h_theta's noise, then h_W's)."""

    def draw(trials: int, seed: int) -> np.ndarray:
        generator = torch.Generator().manual_seed(seed)
        parts = [torch.randn((trials, size), generator=generator, dtype=dtype) for size in blocks]
        return torch.cat(parts, dim=1).to(torch.float64).numpy()

    return draw


def _numpy_draw(dim: int) -> Draw:
    def draw(trials: int, seed: int) -> np.ndarray:
        return np.random.default_rng(seed).standard_normal((trials, dim))

    return draw


@functools.lru_cache(maxsize=32)
def _calibration(target: float, releases: int = 1, relation: str = "add_remove"):
    """The silo's calibration of one release at rate 1 (what `client.privacy_state.noise_plan` asks for)."""
    return calibrate_noise(target, DELTA, 1.0, 1, releases=releases, relation=relation)


def _context() -> Context:
    """A simulated silo's context: no data path, so its noise is seeded from (run seed, silo, round, stream)."""
    return Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={})


def _silo(features: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> SiloData:
    d = features.shape[1]
    info = DatasetInfo(
        name="audit",
        feature_names=tuple(f"f{i}" for i in range(d)),
        label_names=("0", "1"),
        sensitive_columns=("s",),
        group_names=("a", "b"),
    )
    split = make_split(features, labels, groups)
    return SiloData(info=info, silo_id=0, num_silos=1, train=split, test=split)


def _flat(vector: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(vector, torch.Tensor):
        vector = vector.detach().numpy()
    return np.asarray(vector, dtype=np.float64).reshape(-1)


# --------------------------------------------------------------------------------------------------------------------
# DP-FedSGD (and the record-count finding)
# --------------------------------------------------------------------------------------------------------------------


def dp_fedsgd(target: float, *, opposed: bool = False, pairs: int = 25, clip: float = 1.0) -> Mechanism:
    """DP-FedSGD's noisy clipped gradient at q = 1 (`noisy_gradient`), add/remove one canary.

    Logistic regression (binary head, 4 features + bias) at theta = 0, where every prediction is 1/2. The canary
    (0, 0, 0, 10; y = 1) has a gradient of norm 5.0 along -(0, 0, 0, 10, 1), clipped to C. The other records:
    ``pairs`` pairs (x, 1), (x, 0) whose gradients cancel exactly (so the release's mean moves by c / (n + 1), the
    canary's share alone), or with ``opposed`` 2 x ``pairs`` copies of (0, 0, 0, 10; y = 0) whose clipped gradients
    are -c (the ``dp-fedsgd-size`` finding: the mean moves by 2 c / (n + 1); module docstring).
    """
    rng = np.random.default_rng(11)
    canary = np.array([[0.0, 0.0, 0.0, 10.0]], dtype=np.float32)
    if opposed:
        base_x = np.repeat(canary, 2 * pairs, axis=0)
        base_y = np.zeros(2 * pairs, dtype=np.int64)
    else:
        x = np.hstack([rng.random((pairs, 3)), np.zeros((pairs, 1))]).astype(np.float32)
        base_x = np.vstack([x, x])
        base_y = np.r_[np.ones(pairs), np.zeros(pairs)].astype(np.int64)
    datasets = (
        NonSensitiveDivision(base_x, base_y),
        NonSensitiveDivision(np.vstack([base_x, canary]), np.r_[base_y, 1].astype(np.int64)),
    )
    model = build_model("logreg", 4, 2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    calibration = _calibration(target)
    sigma = calibration.noise_multiplier
    batch = len(base_y)  # the run's public batch size m (>= n: q = 1, every record is used)

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        return _flat(
            noisy_gradient(
                model,
                datasets[world],
                sampling_rate=1.0,
                batch_size=batch,
                clip=clip,
                noise_multiplier=sigma * noise_scale,
                sample_rng=np.random.default_rng(0),  # rate 1: every record, whatever the draw
                noise_generator=torch.Generator().manual_seed(seed),
            )
        )

    means = tuple(real(world, 0, 0.0) for world in (0, 1))
    dim = means[0].size
    # noisy_gradient: (sum + N(0, (sigma C)^2 I)) / m, m the run's public batch size
    stds = tuple(np.full(dim, sigma * clip / batch) for _ in datasets)
    return Mechanism(
        name="dp-fedsgd-size" if opposed else "dp-fedsgd",
        neighbours="add/remove a record" + (" (others opposed)" if opposed else ""),
        target_epsilon=target,
        claimed_epsilon=calibration.epsilon,
        means=means,
        stds=stds,
        draw=_torch_draw(dim, dtype=torch.float32),
        real=real,
    )


# --------------------------------------------------------------------------------------------------------------------
# SteFFLe: fairness gradients and the group histogram
# --------------------------------------------------------------------------------------------------------------------


def steffle_fairness(target: float, *, records: int = 20, clip: float = 1.0) -> Mechanism:
    """SteFFLe's sensitive division (`fairness_gradients`) at q = 1: replace one record's sensitive attribute.

    Logistic regression at theta = 0, demographic parity, prior P_S = (1/2, 1/2) and the server's W = 1/2 [[1, -1],
    [-1, 1]], for which d psi / d theta flips sign with the group: the canary (0, 0, 0, 10; y = 1) in group 0 (D1) or
    group 1 (D0) moves the clipped theta sum by 2 C, its ball's diameter; its W part moves by 4 ||F|| = 2 sqrt(2)
    (F = (1/2, 1/2)), half the diameter 2 R_W. Noise: the silo's calibration of the 2 releases under replace-one.
    """
    rng = np.random.default_rng(12)
    features = np.vstack([rng.random((records - 1, 4)), [[0.0, 0.0, 0.0, 10.0]]]).astype(np.float32)
    labels = np.r_[rng.integers(0, 2, records - 1), 1].astype(np.int64)
    base_groups = rng.integers(0, 2, records - 1)
    data = NonSensitiveDivision(features, labels)
    sensitive = (
        SensitiveDivision(np.r_[base_groups, 1].astype(np.int64)),
        SensitiveDivision(np.r_[base_groups, 0].astype(np.int64)),
    )
    model = build_model("logreg", 4, 2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    prior = GroupPrior("dp", np.array([0.5, 0.5]), num_labels=2)
    w = torch.tensor([[0.5, -0.5], [-0.5, 0.5]], dtype=torch.float32)
    calibration = _calibration(target, releases=2, relation="replace_one")
    sigma = calibration.noise_multiplier

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        h_theta, h_w = fairness_gradients(
            model,
            data,
            sensitive[world],
            w=w,
            prior=prior,
            rate=1.0,
            clip=clip,
            noise_multiplier=sigma * noise_scale,
            rng=np.random.default_rng(0),
            generator=torch.Generator().manual_seed(seed),
        )
        return np.concatenate([_flat(h_theta), _flat(h_w)])

    means = tuple(real(world, 0, 0.0) for world in (0, 1))
    params = sum(p.numel() for p in model.parameters())
    # fairness_gradients: theta sum + N(0, (sigma C)^2), then W sum + N(0, (sigma R_W)^2), both / (q n)
    std = np.r_[np.full(params, sigma * clip), np.full(w.numel(), sigma * w_radius_of(prior))] / (1.0 * records)
    return Mechanism(
        name="steffle-fairness",
        neighbours="replace a sensitive attribute",
        target_epsilon=target,
        claimed_epsilon=calibration.epsilon,
        means=means,
        stds=(std, std),
        draw=_torch_draw(params, w.numel(), dtype=torch.float32),
        real=real,
    )


def _steffle_instruction(target: float, seed: int, records: int, share: float) -> msg.TrainInstruction:
    return msg.TrainInstruction.for_algorithm(
        "steffle",
        server_round=1,
        total_rounds=1,
        batch_size=records,
        lr=0.1,
        epsilon=target / share,  # so that the histogram's share of the budget is the target
        delta=DELTA,
        seed=seed,
        counts_share=share,
    )


def steffle_groups(target: float, *, records: int = 20, share: float = 0.5) -> Mechanism:
    """SteFFLe's setup histogram (`client.rounds.steffle.group_counts`): replace one record's group.

    The run's budget is ``target / share`` so that the histogram's one-off calibration (share x budget, replace-one,
    unsampled: `client.privacy_state.noise_plan`) is for ``target``. The canary (label 1) is in group 0 (D1) or 1 (D0):
    the counts move by sqrt(2), the distance the radius sqrt(2)/2 is calibrated for.
    """
    rng = np.random.default_rng(13)
    features = rng.random((records, 4)).astype(np.float32)
    labels = np.r_[rng.integers(0, 2, records - 1), 1].astype(np.int64)
    base_groups = rng.integers(0, 2, records - 1)
    silos = (_silo(features, labels, np.r_[base_groups, 1]), _silo(features, labels, np.r_[base_groups, 0]))
    calibration = _calibration(target, relation="replace_one")  # what noise_plan calibrates for share x budget
    one_off = calibration.noise_multiplier
    std = one_off * histogram_sensitivity("replace_one")
    means = tuple(
        _flat(group_label_counts(s.train.nonsensitive, s.train.sensitive, s.info.num_groups, s.info.num_labels))
        for s in silos
    )

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        if noise_scale != 1.0:
            raise ValueError("group_counts takes its noise from the silo's plan; it cannot be scaled")
        noisy, _ = steffle_round.group_counts(
            silos[world], _steffle_instruction(target, seed, records, share), _context()
        )
        return _flat(noisy)

    def noise_seed(seed: int) -> int:
        return randomness.round_seed(_context(), seed=seed, silo_id=0, server_round=0, stream=randomness.NOISE)

    dim = means[0].size
    return Mechanism(
        name="steffle-groups",
        neighbours="replace a sensitive attribute",
        target_epsilon=target,
        claimed_epsilon=epsilon_spent(one_off, 1.0, 1, DELTA, relation="replace_one"),
        means=means,
        stds=(np.full(dim, std), np.full(dim, std)),
        draw=_torch_draw(dim, dtype=torch.float64),
        real=real,
        noise_seed=noise_seed,
    )


# --------------------------------------------------------------------------------------------------------------------
# DP-mu2-FL
# --------------------------------------------------------------------------------------------------------------------


def _mu2_instruction(target: float, seed: int, t: int, rounds: int, batch: int, trust: str) -> msg.TrainInstruction:
    return msg.TrainInstruction.for_algorithm(
        "mu2fl",
        server_round=t,
        total_rounds=rounds,
        batch_size=batch,
        epsilon=target,
        delta=DELTA,
        seed=seed,
        trust=trust,
    )


@dataclass(frozen=True)
class _Received:
    """What `train_round` reads of the server's message: its content. (A `flwr.app.Message` needs Flower's process-wide
    task identity, which a benchmark or a test should not set.)"""

    content: RecordDict


def _mu2_message(x_t: np.ndarray, x_prev: np.ndarray, spec: list[tuple[str, tuple[int, ...]]]) -> Message:
    content = RecordDict(
        {
            msg.MODEL: msg.arrays_record(unflatten_parameters(x_t, spec)),
            msg.PREVIOUS: msg.arrays_record(unflatten_parameters(x_prev, spec)),
        }
    )
    return _Received(content)  # type: ignore[return-value]


def _mu2_calibration(silo: SiloData, target: float, rounds: int, batch: int) -> mu2.Mu2Calibration:
    """What `train_round` computes: rho from (epsilon, delta), then the untrusted silo's sigma (Theorem 5.2)."""
    constants = mu2_round.constants_for(silo, 0.1)  # the default --domain-diameter
    rho = mu2.resolve_rho(0.0, target, DELTA)
    return mu2.calibrate(
        constants, num_rounds=rounds, num_silos=1, rho=rho, trusted=False, batch_size=batch, delta=DELTA
    )


def _mu2_release(silo: SiloData, target: float, seed: int, points: list[tuple[np.ndarray, np.ndarray]], trust: str):
    """Rounds 1..T of one silo through `train_round`, the server sending ``points[t - 1] = (x_t, x_(t-1))``; returns
    the last round's release and report."""
    context = _context()
    spec = parameter_spec(build_model("logreg", silo.info.num_features, silo.info.num_labels))
    rounds = len(points)
    batch = len(silo.train) // rounds
    arrays, report = {}, None
    for t, (x_t, x_prev) in enumerate(points, start=1):
        instr = _mu2_instruction(target, seed, t, rounds, batch, trust)
        arrays, report = mu2_round.train_round(None, silo, instr, context, _mu2_message(x_t, x_prev, spec))
    return flatten_parameters(arrays[msg.UPDATE]), report


def mu2fl_silos(batch: int = 10) -> tuple[SiloData, SiloData]:
    """The silo of :func:`mu2fl` on D0 and D1: ``batch`` records, the last one the canary (y = 0 in D0, 1 in D1)."""
    rng = np.random.default_rng(14)
    features = np.vstack([rng.random((batch - 1, 4)), np.ones((1, 4))]).astype(np.float32)
    base_labels = rng.integers(0, 2, batch - 1)
    return tuple(
        _silo(features, np.r_[base_labels, y].astype(np.int64), np.zeros(batch, dtype=np.int64)) for y in (0, 1)
    )


def mu2fl(target: float, *, batch: int = 10) -> Mechanism:
    """The untrusted DP-mu2-FL silo's query q_1 (`client.rounds.mu2fl.train_round`, one round of ``batch`` records).

    The run has one round, so the claim is for this release alone. The server's first query point is x_1 = 0 (the
    spec's). Replace one record of the batch: (1, 1, 1, 1; y = 1) (D1) by (1, 1, 1, 1; y = 0) (D0); at x_1 = 0 its
    gradient (1/2 - y) (a, 1) moves q_1 by G / b (G = sqrt(5)), while the noise is calibrated for the sensitivity of
    every round, 2 S / b with S = G + 2 L D (Lemma 4.2): the round-1 canary is at 0.45 of it.
    """
    silos = mu2fl_silos(batch)
    calibration = _mu2_calibration(silos[0], target, 1, batch)
    dim = mu2.logreg_dim(4, 2)
    origin = np.zeros(dim)

    def mean(silo: SiloData) -> np.ndarray:
        g = mu2.logreg_grad(
            origin, silo.train.nonsensitive.features.astype(np.float64), silo.train.nonsensitive.labels, 2
        )
        return mu2.silo_step(None, g, None, 1)[1]

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        if noise_scale != 1.0:
            raise ValueError("train_round takes its noise from protocols.mu2.calibrate; it cannot be scaled")
        return _mu2_release(silos[world], target, seed, [(origin, origin)], "untrusted")[0]

    def noise_seed(seed: int) -> int:
        return randomness.round_seed(_context(), seed=seed, silo_id=0, server_round=1, stream=randomness.NOISE)

    std = np.full(dim, calibration.sigma)
    return Mechanism(
        name="mu2fl",
        neighbours="replace a record",
        target_epsilon=target,
        # the silo's ledger: one Gaussian release at multiplier sqrt(T) / rho (client.privacy_state.noise_plan)
        claimed_epsilon=epsilon_spent(calibration.noise_multiplier, 1.0, 1, DELTA),
        means=(mean(silos[0]), mean(silos[1])),
        stds=(std, std),
        draw=_numpy_draw(dim),
        real=real,
        noise_seed=noise_seed,
    )


def mu2fl_deviating_server(target: float, *, rounds: int = 60, seed: int = 0, reach: float = 10.0):
    """Rounds 1..T of an untrusted DP-mu2-FL silo whose server sends x_T = v, x_(T-1) = -v in round T of T.

    One record per round, query points 0 before round T, v = (reach / 4) (1, 1, 1, 1, 0). An honest server's points
    satisfy (T - 1) ||x_T - x_(T-1)|| <= 2 D; these are ~ T reach apart, so the silo's increment s_T would exceed the
    bound S its noise is calibrated for (before the silo checked it, the audit measured epsilon lower bounds of 5.3 /
    8.8 / 10.4 against claims 0.74 / 1.56 / 3.25). Returns the last release and report; the silo must refuse instead
    (`client.rounds.mu2fl.check_query_step` raises MessageError).
    """
    rng = np.random.default_rng(15)
    features = rng.random((rounds, 4)).astype(np.float32)
    labels = rng.integers(0, 2, rounds).astype(np.int64)
    silo = _silo(features, labels, np.zeros(rounds, dtype=np.int64))
    dim = mu2.logreg_dim(4, 2)
    v = np.r_[np.full(4, reach / 4.0), 0.0]
    points = [(np.zeros(dim), np.zeros(dim))] * (rounds - 1) + [(v, -v)]
    return _mu2_release(silo, target, seed, points, "untrusted")


# --------------------------------------------------------------------------------------------------------------------
# FedSC: DP-CalR
# --------------------------------------------------------------------------------------------------------------------


def fedsc_calr(target: float, *, records: int = 10, width: int = 4, mu: float = 1.0) -> Mechanism:
    """One DP-CalR share (`dp_calr`, one view, representations given directly): replace one representation.

    The canary's representation is sqrt(mu) e_0 (D1) or sqrt(mu) e_1 (D0), orthogonal at the clip norm, so the
    correlation matrix moves by sqrt(2) mu / n, the replace-one sensitivity the noise is calibrated for (what the FedSC
    round computes: the silo's multiplier for one share x `calr_sensitivity`).
    """
    rng = np.random.default_rng(16)
    base = rng.standard_normal((records - 1, width))
    base *= (0.5 * math.sqrt(mu) / np.linalg.norm(base, axis=1))[:, None]
    images = tuple(
        torch.from_numpy(np.vstack([base, math.sqrt(mu) * np.eye(width)[axis]])) for axis in (1, 0)
    )  # D0: e_1, D1: e_0
    sigma = _calibration(target).noise_multiplier * calr_sensitivity(mu, records, "replace_one")

    def identity(x: torch.Tensor) -> torch.Tensor:
        return x

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        return _flat(
            dp_calr(
                identity,
                images[world],
                identity,
                views=1,
                mu=mu,
                sigma=sigma * noise_scale,
                generator=torch.Generator().manual_seed(seed),
            )
        )

    means = tuple(real(world, 0, 0.0) for world in (0, 1))
    std = np.full(width * width, sigma)
    return Mechanism(
        name="fedsc-calr",
        neighbours="replace a record",
        target_epsilon=target,
        claimed_epsilon=calr_epsilon(sigma, DELTA, 1, mu, records),
        means=means,
        stds=(std, std),
        draw=_torch_draw(width * width, dtype=torch.float64),
        real=real,
    )


MECHANISMS: dict[str, Callable[[float], Mechanism]] = {
    "dp-fedsgd": dp_fedsgd,
    "steffle-fairness": steffle_fairness,
    "mu2fl": mu2fl,
    "fedsc-calr": fedsc_calr,
    "steffle-groups": steffle_groups,
}
"""The mechanisms as silofl runs them (each must stay within its claim, and its broken version must not)."""

FINDINGS: dict[str, Callable[[float], Mechanism]] = {
    "dp-fedsgd-size": functools.partial(dp_fedsgd, opposed=True),
}
"""Configurations that probe the accounting's assumptions (module docstring)."""


# --------------------------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------------------------


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3f}"


def row(mechanism: Mechanism, result: AuditResult, noise_scale: float, how: str) -> dict[str, str]:
    verdict = "VIOLATION" if result.epsilon_lb > mechanism.claimed_epsilon else "within claim"
    return {
        "mechanism": mechanism.name,
        "neighbours": mechanism.neighbours,
        "noise": "x1" if noise_scale == 1.0 else f"x{noise_scale:g} (broken)",
        "target eps": f"{mechanism.target_epsilon:g}",
        "claimed eps": _fmt(mechanism.claimed_epsilon),
        "eps at canary shift": _fmt(mechanism.realized_epsilon(noise_scale)),
        "eps_hat": _fmt(result.epsilon_hat),
        "eps_LB (95%)": _fmt(result.epsilon_lb),
        "FP / FN (eval)": f"{result.false_positives} / {result.false_negatives}",
        "trials": f"{result.trials:,}",
        "releases": how,
        "verdict": verdict,
    }


def markdown(rows: list[dict[str, str]]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r[h] for h in header) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=500_000, help="vectorized releases per neighbour")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument(
        "--real-trials",
        type=int,
        default=20_000,
        help="releases per neighbour through silofl's own function, one call each, at the first epsilon (0: skip)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    rows = []
    for builders, scales in ((MECHANISMS, (1.0, BROKEN)), (FINDINGS, (1.0,))):
        for name, build in builders.items():
            for target in args.epsilons:
                mechanism = build(target)
                for scale in scales:
                    result = audit(mechanism, args.trials, args.seed, scale)
                    rows.append(row(mechanism, result, scale, "vectorized"))
                    print(f"{name:18s} eps={target:g} noise x{scale:g}: eps_LB {result.epsilon_lb:.3f}", flush=True)
    if args.real_trials > 0:
        target = args.epsilons[0]
        for name in ("dp-fedsgd", "steffle-fairness", "fedsc-calr"):
            mechanism = MECHANISMS[name](target)
            for scale in (1.0, BROKEN):
                result = audit_real(mechanism, args.real_trials, args.seed + 1, scale)
                rows.append(row(mechanism, result, scale, "real function, one call each"))
                print(f"{name:18s} eps={target:g} noise x{scale:g} (real): eps_LB {result.epsilon_lb:.3f}", flush=True)
    print()
    print(markdown(rows))
    print(
        f"\n{time.perf_counter() - start:.0f} s; delta = {DELTA:g}, confidence {CONFIDENCE:.0%} (one-sided "
        "Clopper-Pearson per error rate at 97.5 %, joint by a union bound)"
    )


if __name__ == "__main__":
    main()
