"""Empirical privacy audit of silofl's Gaussian mechanisms: an epsilon lower bound per mechanism vs its claim.

    python benchmarks/privacy_audit.py [--trials 500000] [--epsilons 1 2 4] [--real-trials 20000] [--seed 0]
    python benchmarks/privacy_audit.py --attacks-only [--trials 500000]     # only the "under attack" part

For every mechanism a silo runs, two neighbouring data sets one canary record apart (D0: canary absent or replaced;
D1: canary present) are released many times with fresh noise, and `protocols.privacy.audit.audit_releases` turns a
likelihood-ratio attack's error counts into an epsilon lower bound at 95 % confidence (threshold fitted on a separate
half of the trials). Each mechanism is audited at the noise silofl calibrates for a target (epsilon, delta = 1e-5) of
ONE release, and again with that noise divided by 10 (a deliberately broken mechanism, same claim). The claimed
epsilon is the figure silofl's own accountant reports for the noise it uses (at most the target).

The mechanisms, each built from silofl's own functions (module `Mechanism` docstring for how the releases are drawn):

* ``dp-fedsgd``: `client.noisy_gradient.noisy_gradient` (per-sample clipping, Gaussian noise, / (q n)) at
  sampling rate 1, logistic regression at theta = 0; add/remove one canary whose gradient is clipped to norm C.
* ``steffle-fairness``: `client.algorithms.steffle.fairness_gradients` (clipped theta part and the attribute-dependent
  W part, both noised, replace-one of a sensitive attribute, 2 releases accounted as one mechanism), rate 1.
* ``mu2fl``: the untrusted DP-mu2-FL silo's first query, through `client.rounds.mu2fl.train_round` (replace one record
  of the round's batch; noise from `protocols.mu2fl.calibrate`).
* ``fedsc-calr``: `protocols.privacy.calr.dp_calr` (one share; replace one representation by an orthogonal one).
* ``steffle-groups``: SteFFLe's setup histogram of (group, label) counts (`client.rounds.steffle.group_counts`;
  replace one record's group), calibrated by the silo's noise plan.
* ``steffle-record``: SteFFLe under whole-record privacy (`protect = record`, issue 34):
  `client.algorithms.steffle.record_sums` at rate 1 (the loss gradients and the theta parts clipped to C, the
  s-dependent W part, the soft predictions per W block, all noised, / m), add/remove one canary record (features,
  label and attribute), 4 releases accounted as one add/remove mechanism.

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

Under attack (``--attacks-only`` runs just this part). A malicious server forges what it sends a silo. The attacks the
silo now answers are audited like the mechanisms above, each built the way the attack drives the silo, through the
function its round calls, with the forged arrays first passed through the silo's own boundary check
(`protocols.messages.check_arrays` at ``MAX_SERVER_VALUE``):

* ``dp-fedsgd-overflow``: a model at the bound and an added record whose own gradient overflows (zeroed: it moves
  nothing); ``dp-fedsgd-overflow-control``: the same with a canary whose gradient stays finite (moves by C / m).
* ``steffle-mlp-overflow``: SteFFLe's fairness release with an MLP whose head is at the bound; replace-one of the
  attribute of a record whose theta term overflows only for s = 1.
* ``calr-add-remove``: DP-CalR under ``calr-relation add_remove`` at q = 0.5, n = 20, add/remove a canary with its own
  Poisson coin (D1's release a mixture, :class:`CanaryCoin`), through `dp_calr` with the silo's `release_divisor` q;
  ``calr-add-remove (pre-fix divisor q n_j)``: the same on the silo's code before the fix (divisor and noise scale
  from its own count n_j), to show what the audit sees of the old flaw.

A separate sensitive party (SteFFLe's topologies ``divided``, ``central-sensitive``, ``general``) runs the silo's
sensitive division, `fairness_gradients`, over the records it received sealed at setup, with its own secret sample
at the silos' rate: the mechanism of ``steffle-fairness`` and ``steffle-mlp-overflow``, which cover it.

The attacks it refuses (a model beyond the bound, sent to a silo or to a sensitive party; DP-mu2-FL's domain
diameter, trust or batch size changed mid-run; a shuffled epoch's batch size changed; query points outside K) are
sent to a node through the real ClientApp (:func:`refusals`), and the table lists the node's own error text.
"""

from __future__ import annotations

import argparse
import functools
import logging
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
from scipy import special

from silofl.client import group_fairness, party_exchange, randomness
from silofl.client.algorithms.steffle import (
    OUTPUTS_RADIUS,
    fairness_gradients,
    record_sums,
    w_radius_of,
)
from silofl.client.data.tabular import DatasetInfo, NonSensitiveDivision, SensitiveDivision, SiloData, make_split
from silofl.client.noisy_gradient import noisy_gradient
from silofl.client.rounds import fedsc as fedsc_round
from silofl.client.rounds import mu2fl as mu2_round
from silofl.client.rounds import steffle as steffle_round
from silofl.client.sealed_records import SealedRecords
from silofl.protocols import messages as msg
from silofl.protocols import mu2fl as mu2fl_math
from silofl.protocols import parties as pm
from silofl.protocols.models import (
    build_model,
    flatten_parameters,
    parameter_spec,
    set_parameters,
    unflatten_parameters,
)
from silofl.protocols.privacy.accountant import calibrate_noise, epsilon_spent
from silofl.protocols.privacy.audit import AuditResult, audit_releases, gaussian_epsilon
from silofl.protocols.privacy.calr import (
    calr_epsilon,
    calr_noise_multiplier_scale,
    calr_sensitivity,
    dp_calr,
    release_divisor,
    release_noise_scale,
)
from silofl.protocols.privacy.gaussian import histogram_sensitivity
from silofl.protocols.steffle import GroupPrior

DELTA = 1e-5
BROKEN = 0.1  # the broken mechanism's noise scale
CONFIDENCE = 0.95

Draw = Callable[[int, int], np.ndarray]
"""``draw(trials, seed)``: standard normal noise ``(trials, dim)`` in the order and from the generator the mechanism's
code uses (so that ``trials = 1`` reproduces one real release, to float rounding)."""


@dataclass(frozen=True)
class CanaryCoin:
    """D1's release when it includes the canary's own Poisson coin (DP-CalR at rate q < 1): a mixture.

    With probability ``rate`` the coin takes the canary (noise-free release ``present``), else it leaves it out
    (``absent``); the other records' coins are fixed. ``draw(trials, seed)`` gives the coins' uniforms ``(trials,)``
    and the standard normal noise ``(trials, dim)``, in the order and from the generator the mechanism's code uses.
    """

    rate: float
    absent: np.ndarray
    present: np.ndarray
    draw: Callable[[int, int], tuple[np.ndarray, np.ndarray]] = field(repr=False)


@dataclass(frozen=True)
class Mechanism:
    """One of silofl's Gaussian mechanisms on a fixed pair of neighbours, ready to audit.

    ``means`` are the noise-free releases on D0 and D1 and ``stds`` the per-coordinate noise std on each, both as the
    mechanism's code computes them: the means come from silofl's own function run with zero noise, and
    :meth:`sample` adds ``stds * draw(...)``. ``real(world, seed, noise_scale)`` makes ONE release through silofl's own
    function (for ``mu2fl`` and ``steffle-groups``: the silo's round function, with its context, noise plan and
    ledger; it only takes ``noise_scale = 1``); ``noise_seed(seed)`` is the seed its noise generator then gets.
    ``tests/benchmarks/test_privacy_audit.py`` checks ``sample(world, 1, noise_seed(s)) == real(world, s)``, so the
    vectorized draws are releases of the code as it runs, not of a re-implementation.

    With a ``coin`` (:class:`CanaryCoin`), D1's release is a mixture over the canary's Poisson coin, drawn per trial;
    ``means[1]`` is then its expectation, the direction the attack scores along.
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
    coin: CanaryCoin | None = None

    @classmethod
    def same_noise(
        cls,
        name: str,
        neighbours: str,
        target_epsilon: float,
        claimed_epsilon: float,
        real: Callable[[int, int, float], np.ndarray],
        std: np.ndarray,
        draw: Draw,
    ) -> Mechanism:
        """The mechanism of ``real``, one release through silofl's own function, with the same noise std ``std`` on
        D0 and D1: its ``means`` are ``real``'s releases at ``noise_scale = 0``."""
        return cls(
            name=name,
            neighbours=neighbours,
            target_epsilon=target_epsilon,
            claimed_epsilon=claimed_epsilon,
            means=tuple(real(world, 0, 0.0) for world in (0, 1)),
            stds=(std, std),
            draw=draw,
            real=real,
        )

    def sample(self, world: int, trials: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        """``trials`` independent releases on D0 (``world = 0``) or D1 (``world = 1``), ``(trials, dim)`` float64."""
        if world == 1 and self.coin is not None:
            uniforms, normals = self.coin.draw(trials, seed)
            means = np.where((uniforms < self.coin.rate)[:, None], self.coin.present, self.coin.absent)
            return means + (noise_scale * self.stds[1]) * normals
        return self.means[world] + (noise_scale * self.stds[world]) * self.draw(trials, seed)

    def realized_mu(self, noise_scale: float = 1.0) -> float:
        """Distance between the two noise-free releases in noise stds (per-coordinate std averaged over D0 and D1;
        with a coin, between D0's and D1's expected releases)."""
        return self.shift_in_stds(self.means[1], noise_scale)

    def shift_in_stds(self, release: np.ndarray, noise_scale: float = 1.0) -> float:
        """How far a noise-free release of D1 (e.g. one of the coin's two) is from D0's, in noise stds."""
        std = 0.5 * (self.stds[0] + self.stds[1]) * noise_scale
        return float(np.linalg.norm((release - self.means[0]) / std))

    def realized_epsilon(self, noise_scale: float = 1.0) -> float:
        """Epsilon of a Gaussian mechanism at that distance: the most any attack on this pair can show. With a coin,
        the exact epsilon of the attack's own score, the best threshold on it (:func:`score_epsilon`): the most this
        audit can show (the most any attack can where the likelihood ratio is monotone in the score, as it is when the
        coin's absent release is D0's and the noise the same on both)."""
        if self.coin is None:
            return gaussian_epsilon(self.realized_mu(noise_scale), DELTA)
        return score_epsilon(self, noise_scale)


def score_epsilon(mechanism: Mechanism, noise_scale: float = 1.0, points: int = 400_001) -> float:
    """Exact epsilon at ``DELTA`` of the best threshold test on the attack's score ``<x - m0, (m1 - m0) / v>``.

    ``v`` is the per-coordinate variance the attack estimates in the limit of many trials (pooled over D0 and D1: the
    noise, plus on D1 the spread of a coin's mixture). D0's score is a Gaussian; D1's is a Gaussian or, with a coin,
    a mixture of two. The rates come from their CDFs on a grid of ``points`` thresholds, and the epsilon is
    :func:`protocols.privacy.audit.epsilon_lower_bound`'s at those exact rates, maximised over the grid. For a Gaussian
    mechanism with the same std on both sides this is :func:`gaussian_epsilon` at ``realized_mu``.
    """
    m0, m1 = mechanism.means
    var0, var1 = (noise_scale * mechanism.stds[0]) ** 2, (noise_scale * mechanism.stds[1]) ** 2
    if mechanism.coin is None:
        weights, releases, spread = np.array([1.0]), [m1], 0.0
    else:
        q, absent, present = mechanism.coin.rate, mechanism.coin.absent, mechanism.coin.present
        weights, releases, spread = np.array([1.0 - q, q]), [absent, present], q * (1.0 - q) * (present - absent) ** 2
    direction = (m1 - m0) / (0.5 * (var0 + var1 + spread))
    if not np.any(direction):
        return 0.0
    tau0, tau1 = math.sqrt(float(direction**2 @ var0)), math.sqrt(float(direction**2 @ var1))
    centres = np.array([float((r - m0) @ direction) for r in releases])
    reach = 40.0 * max(tau0, tau1)
    t = np.linspace(min(0.0, centres.min()) - reach, max(0.0, centres.max()) + reach, points)[:, None]
    log_w = np.log(weights)[None, :]
    log_fpr = special.log_ndtr(-t[:, 0] / tau0)  # D0 scores above t
    log_tnr = special.log_ndtr(t[:, 0] / tau0)
    log_fnr = special.logsumexp(log_w + special.log_ndtr((t - centres) / tau1), axis=1)  # D1 scores at or below t
    log_tpr = special.logsumexp(log_w + special.log_ndtr((centres - t) / tau1), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        above = np.log(np.maximum(np.exp(log_tpr) - DELTA, 0.0)) - log_fpr  # (1 - delta - FNR) / FPR
        below = np.log(np.maximum(np.exp(log_tnr) - DELTA, 0.0)) - log_fnr  # (1 - delta - FPR) / FNR
    best = np.nanmax(np.concatenate([above, below]))
    return max(0.0, float(best))


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
    """The silo's calibration of one release at rate 1 (what `client.round_privacy.RoundPrivacy` asks for)."""
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


def _dp_fedsgd_release(
    model: torch.nn.Module, data: NonSensitiveDivision, batch: int, clip: float, noise_multiplier: float, seed: int
) -> np.ndarray:
    """One DP-FedSGD release at q = 1 (`noisy_gradient`: every record, whatever the sampling draw), flat."""
    return _flat(
        noisy_gradient(
            model,
            data,
            sampling_rate=1.0,
            batch_size=batch,
            clip=clip,
            noise_multiplier=noise_multiplier,
            sample_rng=np.random.default_rng(0),
            noise_generator=torch.Generator().manual_seed(seed),
        )
    )


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
    batch = len(base_y)  # the run's public batch size m (>= n: q = 1, every record is used)
    return _dp_fedsgd_mechanism(
        "dp-fedsgd-size" if opposed else "dp-fedsgd",
        "add/remove a record" + (" (others opposed)" if opposed else ""),
        target,
        model,
        datasets,
        batch,
        clip,
    )


def _dp_fedsgd_mechanism(
    name: str,
    neighbours: str,
    target: float,
    model: torch.nn.Module,
    datasets: tuple[NonSensitiveDivision, NonSensitiveDivision],
    batch: int,
    clip: float,
) -> Mechanism:
    """DP-FedSGD's release at q = 1 on two neighbouring datasets, calibrated for ``target``: noisy_gradient's
    (sum + N(0, (sigma C)^2 I)) / m, m the run's public batch size."""
    calibration = _calibration(target)
    sigma = calibration.noise_multiplier

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        return _dp_fedsgd_release(model, datasets[world], batch, clip, sigma * noise_scale, seed)

    means = tuple(real(world, 0, 0.0) for world in (0, 1))
    dim = means[0].size
    stds = tuple(np.full(dim, sigma * clip / batch) for _ in datasets)
    return Mechanism(
        name=name,
        neighbours=neighbours,
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


def _fairness_release(
    model: torch.nn.Module,
    data: NonSensitiveDivision,
    sensitive: SensitiveDivision,
    w: torch.Tensor,
    prior: GroupPrior,
    clip: float,
    noise_multiplier: float,
    seed: int,
    w_noise: str = "isotropic",
) -> np.ndarray:
    """One release of SteFFLe's sensitive division (`fairness_gradients` at q = 1), theta part then W part, flat."""
    h_theta, h_w = fairness_gradients(
        model,
        data,
        sensitive,
        w=w,
        prior=prior,
        rate=1.0,
        clip=clip,
        noise_multiplier=noise_multiplier,
        rng=np.random.default_rng(0),
        generator=torch.Generator().manual_seed(seed),
        w_noise=w_noise,
    )
    return np.concatenate([_flat(h_theta), _flat(h_w)])


def _steffle_setting() -> tuple[torch.nn.Module, GroupPrior, torch.Tensor]:
    """The SteFFLe rows' server message: logistic regression at theta = 0 (every prediction 1/2), demographic parity,
    prior (1/2, 1/2), W = 1/2 [[1, -1], [-1, 1]]."""
    model = build_model("logreg", 4, 2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    prior = GroupPrior("dp", np.array([0.5, 0.5]), num_labels=2)
    return model, prior, torch.tensor([[0.5, -0.5], [-0.5, 0.5]], dtype=torch.float32)


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
    model, prior, w = _steffle_setting()
    calibration = _calibration(target, releases=2, relation="replace_one")
    sigma = calibration.noise_multiplier

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        return _fairness_release(model, data, sensitive[world], w, prior, clip, sigma * noise_scale, seed)

    params = sum(p.numel() for p in model.parameters())
    # fairness_gradients: theta sum + N(0, (sigma C)^2), then W sum + N(0, (sigma R_W)^2), both / (q n)
    std = np.r_[np.full(params, sigma * clip), np.full(w.numel(), sigma * w_radius_of(prior))] / (1.0 * records)
    return Mechanism.same_noise(
        "steffle-fairness",
        "replace a sensitive attribute",
        target,
        calibration.epsilon,
        real,
        std,
        _torch_draw(params, w.numel(), dtype=torch.float32),
    )


def steffle_record(target: float, *, records: int = 20, clip: float = 1.0) -> Mechanism:
    """SteFFLe under whole-record privacy (`record_sums` at q = 1, every sum / m): add/remove one canary record.

    Logistic regression at theta = 0, demographic parity, prior (1/2, 1/2) and W = 1/2 [[1, -1], [-1, 1]], as in
    ``steffle-fairness``. The canary (0, 0, 0, 10; y = 0; s = 0) moves the loss sum by C (its gradient, norm 5, is
    clipped), the theta sum by C, the s-dependent W sum by 2 ||F|| / sqrt(1/2) = 2 of its radius 2 sqrt(2), and the
    soft predictions by ||F|| = sqrt(2)/2 of their radius 1: in noise stds sqrt(3) / sigma against the sqrt(4) / sigma
    the 4 releases are calibrated for. The divisor is the public batch size m = n + 1, the same on both sides."""
    rng = np.random.default_rng(14)
    base_x = rng.random((records, 4)).astype(np.float32)
    base_y = rng.integers(0, 2, records).astype(np.int64)
    base_s = rng.integers(0, 2, records).astype(np.int64)
    canary = np.array([[0.0, 0.0, 0.0, 10.0]], dtype=np.float32)
    worlds = (
        (NonSensitiveDivision(base_x, base_y), SensitiveDivision(base_s)),
        (
            NonSensitiveDivision(np.vstack([base_x, canary]), np.r_[base_y, 0].astype(np.int64)),
            SensitiveDivision(np.r_[base_s, 0].astype(np.int64)),
        ),
    )
    batch = records + 1  # the run's public batch size m (q = 1 on both sides)
    model, prior, w = _steffle_setting()
    calibration = _calibration(target, releases=4, relation="add_remove")
    sigma = calibration.noise_multiplier

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        data, sensitive = worlds[world]
        sums = record_sums(
            model,
            data,
            sensitive,
            w=w,
            prior=prior,
            clip=clip,
            noise_multiplier=sigma * noise_scale,
            generator=torch.Generator().manual_seed(seed),
            sample=np.arange(len(data.labels)),
            w_noise="isotropic",
        )
        return np.concatenate([_flat(part) for part in (sums.loss, sums.theta, sums.w, sums.outputs)]) / batch

    params = sum(p.numel() for p in model.parameters())
    radii = [clip] * params + [clip] * params + [w_radius_of(prior)] * w.numel() + [OUTPUTS_RADIUS] * 2
    std = sigma * np.asarray(radii) / batch
    return Mechanism.same_noise(
        "steffle-record",
        "add/remove a whole record",
        target,
        calibration.epsilon,
        real,
        std,
        _torch_draw(params, params, w.numel(), 2, dtype=torch.float32),
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
    unsampled: `client.round_privacy`) is for ``target``. The canary (label 1) is in group 0 (D1) or 1 (D0):
    the counts move by sqrt(2), the distance the radius sqrt(2)/2 is calibrated for.
    """
    rng = np.random.default_rng(13)
    features = rng.random((records, 4)).astype(np.float32)
    labels = np.r_[rng.integers(0, 2, records - 1), 1].astype(np.int64)
    base_groups = rng.integers(0, 2, records - 1)
    silos = (_silo(features, labels, np.r_[base_groups, 1]), _silo(features, labels, np.r_[base_groups, 0]))
    calibration = _calibration(target, relation="replace_one")  # what the silo calibrates for share x budget
    one_off = calibration.noise_multiplier
    std = one_off * histogram_sensitivity("replace_one")
    means = tuple(
        _flat(
            group_fairness.group_label_counts(
                s.train.nonsensitive, s.train.sensitive, s.info.num_groups, s.info.num_labels
            )
        )
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


def _mu2_calibration(silo: SiloData, target: float, rounds: int, batch: int) -> mu2fl_math.Mu2Calibration:
    """What `train_round` computes: rho from (epsilon, delta), then the untrusted silo's sigma (Theorem 5.2)."""
    constants = mu2_round.constants_for(silo, 0.1)  # the default --domain-diameter
    rho = mu2fl_math.resolve_rho(0.0, target, DELTA)
    return mu2fl_math.calibrate(
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
    dim = mu2fl_math.logreg_dim(4, 2)
    origin = np.zeros(dim)

    def mean(silo: SiloData) -> np.ndarray:
        g = mu2fl_math.logreg_grad(
            origin, silo.train.nonsensitive.features.astype(np.float64), silo.train.nonsensitive.labels, 2
        )
        return mu2fl_math.silo_step(None, g, None, 1)[1]

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        if noise_scale != 1.0:
            raise ValueError("train_round takes its noise from protocols.mu2fl.calibrate; it cannot be scaled")
        return _mu2_release(silos[world], target, seed, [(origin, origin)], "untrusted")[0]

    def noise_seed(seed: int) -> int:
        return randomness.round_seed(_context(), seed=seed, silo_id=0, server_round=1, stream=randomness.NOISE)

    std = np.full(dim, calibration.sigma)
    return Mechanism(
        name="mu2fl",
        neighbours="replace a record",
        target_epsilon=target,
        # the silo's ledger: one Gaussian release at multiplier sqrt(T) / rho (client.round_privacy.RoundPrivacy)
        claimed_epsilon=epsilon_spent(calibration.noise_multiplier, 1.0, 1, DELTA),
        means=(mean(silos[0]), mean(silos[1])),
        stds=(std, std),
        draw=_numpy_draw(dim),
        real=real,
        noise_seed=noise_seed,
    )


def mu2fl_deviating_server(target: float, *, rounds: int = 60, seed: int = 0, reach: float = 0.1):
    """Rounds 1..T of an untrusted DP-mu2-FL silo whose server sends x_T = v, x_(T-1) = -v in round T of T.

    One record per round, query points 0 before round T, v = (reach / 4) (1, 1, 1, 1, 0), of norm reach / 2: with
    the default reach = D = 0.1 both points lie in the domain K (the ball of radius D / 2), at its edge. An honest
    server's points satisfy (T - 1) ||x_T - x_(T-1)|| <= 2 D; these are (T - 1) reach apart, so the silo's increment
    s_T would exceed the bound S its noise is calibrated for (before the silo checked it, the audit measured epsilon
    lower bounds of 5.3 / 8.8 / 10.4 against claims 0.74 / 1.56 / 3.25, with reach 10). Returns the last release and
    report; the silo must refuse instead (`client.rounds.mu2fl.check_query_step` raises MessageError; with reach >
    D the points are outside K and `check_in_domain` refuses them first).
    """
    rng = np.random.default_rng(15)
    features = rng.random((rounds, 4)).astype(np.float32)
    labels = rng.integers(0, 2, rounds).astype(np.int64)
    silo = _silo(features, labels, np.zeros(rounds, dtype=np.int64))
    dim = mu2fl_math.logreg_dim(4, 2)
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

    return Mechanism.same_noise(
        "fedsc-calr",
        "replace a record",
        target,
        calr_epsilon(sigma, DELTA, 1, mu, records),
        real,
        np.full(width * width, sigma),
        _torch_draw(width * width, dtype=torch.float64),
    )


MECHANISMS: dict[str, Callable[[float], Mechanism]] = {
    "dp-fedsgd": dp_fedsgd,
    "steffle-fairness": steffle_fairness,
    "mu2fl": mu2fl,
    "fedsc-calr": fedsc_calr,
    "steffle-groups": steffle_groups,
    "steffle-record": steffle_record,
}
"""The mechanisms as silofl runs them (each must stay within its claim, and its broken version must not)."""

FINDINGS: dict[str, Callable[[float], Mechanism]] = {
    "dp-fedsgd-size": functools.partial(dp_fedsgd, opposed=True),
}
"""Configurations that probe the accounting's assumptions (module docstring)."""


# --------------------------------------------------------------------------------------------------------------------
# Under attack: what a malicious server's forged messages make the silo release
# --------------------------------------------------------------------------------------------------------------------

BOUND = msg.MAX_SERVER_VALUE  # the largest magnitude a silo accepts in an array a server sends it


def _accepted(record: str, arrays: dict[str, np.ndarray], *, dtype: str = "float32") -> dict[str, np.ndarray]:
    """The forged arrays after the silo's own check at its message boundary (`protocols.messages.check_arrays` with
    ``max_abs = MAX_SERVER_VALUE``, as `client.app` and the round functions call it): raises MessageError if the silo
    would refuse them, so an attack row is always one the silo answers."""
    content = RecordDict({record: msg.arrays_record(arrays)})
    spec = [(name, array.shape) for name, array in arrays.items()]
    return msg.check_arrays(content, record, spec, dtype=dtype, what="forged message", max_abs=BOUND)


def _model_at(kind: str, arrays: dict[str, np.ndarray], hidden: int = 8) -> torch.nn.Module:
    model = build_model(kind, 4, 2, hidden=hidden)
    set_parameters(model, _accepted(msg.MODEL, arrays))
    return model


def dp_fedsgd_attack(
    target: float,
    *,
    canary_scale: float = 1e33,
    others: int = 50,
    clip: float = 1.0,
    name: str = "dp-fedsgd-overflow",
) -> Mechanism:
    """DP-FedSGD (`noisy_gradient`, q = 1) under a server model at the silo's bound: add/remove one record whose own
    per-sample gradient overflows.

    Attack 1: the server sends logistic regression with every weight and the bias at MAX_SERVER_VALUE (accepted: the
    silo refuses only entries above it). The canary is (0, 0, 0, ``canary_scale``; y = 0). With the default 1e33 its
    logit B x_4 + B = 1e39 overflows float32 to inf and its gradient is NaN: before the fix, the release was NaN
    exactly when the canary was there (the starting commit's attack, there with a model of 3e38, now refused). With
    1e20 the logit is finite (p = 1) and the gradient (x, 1) too, but its squared norm overflows to inf. Either way the
    zeroing (`protocols.models.clip_factors` and the clipped sums) makes the canary contribute exactly 0, the centre of
    its ball: D0 and D1 have the same noise-free release. The other records (features in [0, 1), y = 0) have
    gradients (x, 1), each clipped to C, so their sum is large: had the canary's NaN reached the Gaussian mechanism's
    fallback instead (the noise alone), D1's release would have lost that sum. With ``canary_scale = 1e15`` the
    canary's gradient is finite and clipped to C (``dp-fedsgd-overflow-control``): the same construction where the
    canary does move the release, by exactly the sensitivity.
    """
    rng = np.random.default_rng(21)
    base_x = rng.random((others, 4)).astype(np.float32)
    canary = np.array([[0.0, 0.0, 0.0, canary_scale]], dtype=np.float32)
    datasets = (
        NonSensitiveDivision(base_x, np.zeros(others, dtype=np.int64)),
        NonSensitiveDivision(np.vstack([base_x, canary]), np.zeros(others + 1, dtype=np.int64)),
    )
    model = _model_at(
        "logreg", {"head.weight": np.full((1, 4), BOUND, np.float32), "head.bias": np.full(1, BOUND, np.float32)}
    )
    batch = others + 1  # the run's public batch size m >= n_j on both sides: q = 1
    neighbours = f"add/remove a record of feature {canary_scale:g} (model at {BOUND:g})"
    return _dp_fedsgd_mechanism(name, neighbours, target, model, datasets, batch, clip)


def steffle_attack(target: float, *, records: int = 20, clip: float = 1.0, canary_scale: float = 1e18) -> Mechanism:
    """SteFFLe's fairness release (`fairness_gradients`, q = 1) with an MLP whose head is at the silo's bound:
    replace the sensitive attribute of a record whose theta term overflows when s = 1 only.

    Attack 1 on SteFFLe: hidden unit 0 is 0.5 for every record (zero weights, bias 0.5; the other units are 0), the
    head's weights are all MAX_SERVER_VALUE and its bias -MAX_SERVER_VALUE / 2, so z = 0 and F = (1/2, 1/2) for every
    record; W = [[-1e-6, 1e-6], [-1, 1]], prior (1/2, 1/2). A record's d psi / d z is then 1.41 for s = 1 and 1.41e-6
    for s = 0, and its gradient for hidden unit 0's weights is MAX_SERVER_VALUE d psi / d z x. The canary
    (``canary_scale``, 0, 0, 0) has ||x||^2 = 1e36, finite in float32: with s = 1 its term's squared norm overflows to
    inf and the term is zeroed; with s = 0 its norm is finite (1.4e18) and it is clipped to C. So the theta release
    moves by C, the radius of its ball around 0; the W part moves by 4 ||F|| = 2 sqrt(2) as in ``steffle-fairness``.
    D0: the canary's s = 0, D1: s = 1.

    At the bound the overflow can only be the norm's: the silo scales each record's output gradient by its clip factor
    before the outer product with its inputs, and with the head <= MAX_SERVER_VALUE and a prior >= MIN_SILO_PRIOR
    those stay finite (the starting commit's NaN needed a head of 3e38, now refused). An inf norm got the factor C /
    inf = 0 before the fix as well, so this row is not one the fix changed; it shows the answered release within its
    claim.
    """
    rng = np.random.default_rng(22)
    features = np.vstack([rng.random((records - 1, 4)), [[canary_scale, 0.0, 0.0, 0.0]]]).astype(np.float32)
    labels = np.r_[rng.integers(0, 2, records - 1), 1].astype(np.int64)
    base_groups = rng.integers(0, 2, records - 1)
    data = NonSensitiveDivision(features, labels)
    sensitive = (
        SensitiveDivision(np.r_[base_groups, 0].astype(np.int64)),
        SensitiveDivision(np.r_[base_groups, 1].astype(np.int64)),
    )
    hidden = 8
    model = _model_at(
        "mlp",
        {
            "hidden.weight": np.zeros((hidden, 4), np.float32),
            "hidden.bias": np.r_[0.5, np.zeros(hidden - 1)].astype(np.float32),
            "head.weight": np.full((1, hidden), BOUND, np.float32),
            "head.bias": np.full(1, -BOUND / 2, np.float32),
        },
        hidden,
    )
    fair = _accepted(
        msg.FAIRNESS,
        {"w": np.array([[-1e-6, 1e-6], [-1.0, 1.0]], np.float32), "prior": np.array([0.5, 0.5], np.float32)},
    )
    prior = group_fairness.group_prior("dp", fair["prior"], 2)
    w = torch.from_numpy(fair["w"])
    w_noise = steffle_round.w_noise_of("auto")  # the run's default: per-group W noise
    calibration = _calibration(target, releases=2, relation="replace_one")
    sigma = calibration.noise_multiplier

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        return _fairness_release(model, data, sensitive[world], w, prior, clip, sigma * noise_scale, seed, w_noise)

    params = sum(p.numel() for p in model.parameters())
    # theta: N(0, (sigma C)^2); W row r: N(0, (sigma 2 / sqrt(p(r)))^2) (per-group); both / (q n)
    row_bounds = np.repeat(prior.w_row_bounds().reshape(-1), w.shape[-1])
    std = np.r_[np.full(params, sigma * clip), sigma * row_bounds] / (1.0 * records)
    return Mechanism.same_noise(
        "steffle-mlp-overflow",
        f"replace s of a record of feature {canary_scale:g}, whose term overflows for s = 1 (head at {BOUND:g})",
        target,
        calibration.epsilon,
        real,
        std,
        _torch_draw(params, w.numel(), dtype=torch.float32),
    )


def calr_attack(
    target: float,
    *,
    records: int = 20,
    rate: float = 0.5,
    sampled: int = 12,
    mu: float = 1.0,
    width: int = 4,
    pre_fix: bool = False,
) -> Mechanism:
    """DP-CalR with ``calr-relation add_remove`` at Poisson rate q < 1 (`dp_calr`, one share, one view): add/remove a
    canary, its own coin included.

    Attack 4. D0: ``records`` records, D1: the same plus the canary. Every other record's representation is sqrt(mu)
    e_0 (their terms all mu e_0 e_0^T, the largest sum R of ``sampled`` of them) and the canary's is sqrt(mu) e_1.
    The other records' coins are fixed: ``sampled`` of them in the sample, the rest out (an auditor who knows them,
    the strongest; the guarantee must hold for every one of their outcomes). The canary's coin is drawn per trial:
    D1's release is the mixture (1 - q) N(absent) + q N(present). Given the coins, `dp_calr` sums the sampled
    records' terms (`images[keep]`), divides by the divisor and adds the noise; a release here is `dp_calr` at rate 1
    on the sampled records (its computation given its coins, `tests/benchmarks/test_privacy_audit.py` checks it), with
    the canary's coin drawn first from the same generator.

    The silo (since the fix): divisor `release_divisor` = q (the server divides by the public n_j), noise std
    multiplier x `release_noise_scale` = multiplier x mu / q. An unsampled canary moves nothing; a sampled one moves
    the release by mu / q, the radius the noise covers: the accountant's PoissonSampled Gaussian exactly.

    ``pre_fix``: the silo before the fix, dp_calr's default divisor q n_j and the noise multiplier x mu / (q n_j),
    n_j its own count (20 in D0, 21 in D1): an unsampled canary still moves the release by R (1 / (q n) - 1 / (q (n
    + 1))), 0.057 with 12 sampled records at n = 20, q = 0.5, mu = 1, against the radius mu / (q n) = 0.1.
    """
    q = rate
    sampled_rows = np.vstack([np.sqrt(mu) * np.eye(width)[0]] * sampled)
    canary = np.sqrt(mu) * np.eye(width)[1]
    counts = (records, records + 1)
    calibration = _calr_calibration(target, records, q, mu)
    if pre_fix:  # before the fix: dp_calr's default divisor q n_j and the noise scale mu / (q n_j), n_j its own count
        divisors = tuple(q * n for n in counts)
        sigmas = tuple(calibration.multiplier * calr_noise_multiplier_scale(mu, n, "add_remove", q) for n in counts)
    else:
        divisors = tuple(release_divisor("add_remove", q, n) for n in counts)
        sigmas = tuple(calibration.multiplier * release_noise_scale(mu, n, "add_remove", q) for n in counts)

    def identity(x: torch.Tensor) -> torch.Tensor:
        return x

    def release(world: int, canary_in: bool, sigma: float, generator: torch.Generator | None) -> np.ndarray:
        images = torch.from_numpy(np.vstack([sampled_rows, canary[None]]) if canary_in else sampled_rows)
        return _flat(
            dp_calr(
                identity, images, identity, views=1, mu=mu, sigma=sigma, generator=generator, divisor=divisors[world]
            )
        )

    def real(world: int, seed: int, noise_scale: float = 1.0) -> np.ndarray:
        generator = torch.Generator().manual_seed(seed)
        canary_in = False
        if world == 1:  # the canary's coin, drawn as dp_calr draws its coins (float64 uniform < q)
            canary_in = bool(torch.rand(1, generator=generator, dtype=torch.float64)[0] < q)
        return release(world, canary_in, sigmas[world] * noise_scale, generator)

    def coin_draw(trials: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        generator = torch.Generator().manual_seed(seed)
        uniforms = torch.rand(trials, generator=generator, dtype=torch.float64).numpy()
        normals = torch.randn((trials, width * width), generator=generator, dtype=torch.float64).numpy()
        return uniforms, normals

    absent, present = release(1, False, 0.0, None), release(1, True, 0.0, None)
    d0 = release(0, False, 0.0, None)
    dim = width * width
    return Mechanism(
        name="calr-add-remove" + (" (pre-fix divisor q n_j)" if pre_fix else ""),
        neighbours=f"add/remove a record, its own coin at q = {q:g} (n = {records}, {sampled} others sampled)",
        target_epsilon=target,
        claimed_epsilon=calibration.epsilon,
        means=(d0, (1.0 - q) * absent + q * present),
        stds=tuple(np.full(dim, s) for s in sigmas),
        draw=_torch_draw(dim, dtype=torch.float64),
        real=real,
        coin=CanaryCoin(q, absent, present, coin_draw),
    )


@functools.lru_cache(maxsize=32)
def _calr_calibration(target: float, records: int, rate: float, mu: float):
    """The FedSC silo's calibration of one add/remove share at Poisson rate q (`client.rounds.fedsc.mechanism`:
    PoissonSampled(q, Gaussian) under the accountant's add_remove), by the run's default accountant."""
    instr = msg.TrainInstruction.for_algorithm(
        "fedsc",
        server_round=1,
        total_rounds=1,
        epsilon=target,
        delta=DELTA,
        mu=mu,
        views=1,
        calr_relation="add_remove",
        calr_sampling_rate=rate,
        planned_shares=1,
    )
    return fedsc_round.mechanism(records, instr).calibrate(target, DELTA, instr.accountant)


ATTACKS: dict[str, Callable[[float], Mechanism]] = {
    "dp-fedsgd-overflow": dp_fedsgd_attack,
    "steffle-mlp-overflow": steffle_attack,
    "calr-add-remove": calr_attack,
}
"""The attacks the silo now answers, each as it drives the silo (each must stay within its claim)."""

ATTACK_CONTROLS: dict[str, Callable[[float], Mechanism]] = {
    "dp-fedsgd-overflow-control": functools.partial(
        dp_fedsgd_attack, canary_scale=1e15, name="dp-fedsgd-overflow-control"
    ),
}
"""``dp-fedsgd-overflow`` with a canary whose gradient stays finite (1e15): the same message, a canary that moves the
release by the full sensitivity C / m. It shows what the audit would see of the canary if its overflowing term were
released in any form; ``dp-fedsgd-overflow`` itself cannot be flagged even with the broken noise (it moves nothing)."""

PRE_FIX: dict[str, Callable[[float], Mechanism]] = {
    "calr-add-remove (pre-fix divisor q n_j)": functools.partial(calr_attack, pre_fix=True),
}
"""The same attack on the silo's code before its fix (what the audit sees of the old flaw)."""


# --------------------------------------------------------------------------------------------------------------------
# Under attack: the forged messages the silo refuses
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A forged message sent to a silo (or a sensitive party) through the real ClientApp (`client.app.app`), after
    the honest messages of the run before it; ``error`` is the node's error reason, ``""`` if it answered."""

    attack: str
    message: str
    error: str

    @property
    def refused(self) -> bool:
        return bool(self.error)


def _mu2_point(norm: float) -> np.ndarray:
    """A DP-mu2-FL query point (logistic regression on 4 features: 5 parameters) of Euclidean norm `norm`."""
    return np.full(5, norm / math.sqrt(5.0))


def _forged_replies(ms, folder: Path) -> dict[str, tuple[str, Callable[[bool], Message]]]:
    """Each refused attack: (what the forged message does, ``send(forged)``), where ``send`` runs the messages of a
    run on a fresh node and returns its reply to the last one: the forged message, or with ``forged = False`` its
    honest twin (the same run without the forgery: a value at the bound, an unchanged field, a point inside K), which
    the node must answer. An earlier, honest message that is refused raises."""
    huge = 3e38  # attack 1's values: finite in float32

    def answered(reply: Message) -> None:
        if reply.has_error():
            raise RuntimeError(f"an honest message was refused: {reply.error.reason}")

    def silo(records: int = 20, **config) -> ms.SimulatedNode:
        node = ms.SimulatedNode(ms.make_silo(records), **config)
        node.setup()
        return node

    common = {"total_rounds": 3, "lr": 0.1, "epsilon": 1.0, "delta": 1e-5, "clip": 1.0}
    fair = {"w": np.array([[0.5, -0.5], [-0.5, 0.5]], np.float32), "prior": np.array([0.5, 0.5], np.float32)}

    def dp_fedsgd_model(forged: bool) -> Message:
        params = ms.tabular_model("logreg", 4, 2, fill=huge if forged else BOUND)
        return silo().send(msg.TRAIN, ms.train("dp-fedsgd", params, server_round=1, batch_size=64, **common), 1)

    def steffle_model(forged: bool) -> Message:
        node = silo()
        mlp = {**common, "batch_size": 64, "model": "mlp", "hidden": 8}
        answered(node.send(msg.GROUPS, ms.groups("steffle", **mlp), 0))
        params = ms.tabular_model("mlp", 4, 2, hidden=8)
        params["head.weight"][:] = huge if forged else BOUND
        return node.send(msg.TRAIN, ms.train("steffle", params, records={msg.FAIRNESS: fair}, server_round=1, **mlp), 1)

    def party_model(forged: bool) -> Message:
        # A deployed sensitive party holding the records the sealed exchange gives it (the exchange itself, and its
        # refusal of forged or swapped boxes, are tested in tests/client/test_sealed_parties.py): its node state is set
        # to what `client.party_exchange.receive` keeps, then the server's messages go through the ClientApp.
        data = ms.make_silo(20)
        node = ms.Node(ms.sensitive_party(data), folder / f"party-{forged}")
        node.setup()
        received = SealedRecords(
            data.train.nonsensitive, data.train.sensitive, data.test.nonsensitive, data.test.sensitive, (20,)
        )
        node.context.state[party_exchange.SEALED_KEY] = msg.arrays_record(received.to_arrays())
        mlp = {**common, "batch_size": 64, "model": "mlp", "hidden": 8}
        answered(node.send(msg.GROUPS, ms.groups("steffle", **mlp), 0))
        params = ms.tabular_model("mlp", 4, 2, hidden=8)
        params["head.weight"][:] = huge if forged else BOUND
        query = ms.train("steffle", params, records={msg.FAIRNESS: fair}, server_round=1, **mlp)
        return node.send(pm.SENSITIVE_QUERY, query, 1)

    def mu2(t: int, node: ms.Node, point: np.ndarray, previous: np.ndarray, **values) -> Message:
        spec = ms.tabular_spec("logreg", 4, 2)
        fields = {"total_rounds": 5, "batch_size": 1, "rho": 1.0, "delta": 1e-5, "domain_diameter": 0.1, **values}
        content = ms.train(
            "mu2fl",
            unflatten_parameters(point, spec),
            records={msg.PREVIOUS: unflatten_parameters(previous, spec)},
            server_round=t,
            **fields,
        )
        return node.send(msg.TRAIN, content, t)

    zero = np.zeros(5)

    def mu2_changed(config: dict, **values) -> Callable[[bool], Message]:
        def send(forged: bool) -> Message:
            node = silo(**config)
            answered(mu2(1, node, zero, zero))
            if not forged:
                return mu2(2, node, zero, zero)
            point = _mu2_point(1e3) if "domain_diameter" in values else zero
            return mu2(2, node, point, zero, **values)

        return send

    def mu2_outside(forged: bool) -> Message:
        point = _mu2_point(0.06 if forged else 0.04)
        return mu2(1, silo(), point, point)

    def shuffled_batch(forged: bool) -> Message:
        node = silo(1500)
        values = {**common, "total_rounds": 12, "delta": 1e-6, "sampling": "shuffle"}
        answered(node.send(msg.GROUPS, ms.groups("steffle", batch_size=256, **values), 0))
        params = ms.tabular_model("logreg", 4, 2, fill=0.1)
        reply = None
        for t, batch in ((1, 256), (2, 299 if forged else 256)):
            records = {msg.FAIRNESS: fair}
            reply = node.send(
                msg.TRAIN, ms.train("steffle", params, records=records, server_round=t, batch_size=batch, **values), t
            )
            if t == 1:
                answered(reply)
        return reply

    return {
        "dp-fedsgd: model beyond the bound": ("head weight and bias 3e38 (attack 1's model)", dp_fedsgd_model),
        "steffle: MLP head beyond the bound": (
            "MLP head weights 3e38, round 1 (after the group counts)",
            steffle_model,
        ),
        "sensitive party: model beyond the bound": (
            "MLP head weights 3e38 in query.sensitive, round 1 (sealed records, after the group counts)",
            party_model,
        ),
        "mu2fl: domain diameter changed": (
            "D = 0.1 in round 1, D = 1e4 in round 2 (query step 1e3, within Lemma 4.2's check for 1e4)",
            mu2_changed({}, domain_diameter=1e4),
        ),
        "mu2fl: trust changed": (
            "untrusted in round 1, trust = trusted in round 2 (the silo allows trusted servers)",
            mu2_changed({"allow-trusted-server": True}, trust="trusted"),
        ),
        "mu2fl: batch size changed": ("b = 1 in round 1, b = 2 in round 2", mu2_changed({}, batch_size=2)),
        "mu2fl: query point outside K": (
            "round 1, x_1 = x_0 of norm 0.06, D = 0.1 (K: the ball of radius 0.05)",
            mu2_outside,
        ),
        "steffle (shuffled epochs): batch size changed": (
            "1,500 records, batch 256 in round 1, 299 in round 2 (6 batches per epoch either way)",
            shuffled_batch,
        ),
    }


def refusals(forged: bool = True) -> list[Refusal]:
    """Send every refused attack's forged message (``forged = False``: its honest twin) to a fresh node through the
    real ClientApp (the harness of `tests/malicious_server.py`: simulated silos, a deployed sensitive party in a
    temporary folder) and record what the node says: the table can only claim a refusal that happens."""
    import tempfile

    from tests import malicious_server as ms

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for attack, (message, send) in _forged_replies(ms, Path(tmp)).items():
            reply = send(forged)
            out.append(Refusal(attack, message, reply.error.reason if reply.has_error() else ""))
    return out


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


def refusal_markdown(found: list[Refusal]) -> str:
    lines = ["| attack | forged message | silo | its error |", "|---|---|---|---|"]
    for r in found:
        said = r.error.replace("|", "\\|").replace("\n", " ") if r.refused else "-"
        lines.append(f"| {r.attack} | {r.message} | {'refused' if r.refused else 'ANSWERED'} | {said} |")
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
    parser.add_argument(
        "--attacks-only",
        action="store_true",
        help="only the 'under attack' part: the attacks the silo answers, audited, and the ones it refuses",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting's RDP warnings at q = 0.5 (orders it skips)
    start = time.perf_counter()

    def audited(groups, label: str = "") -> list[dict[str, str]]:
        rows = []
        for builders, scales in groups:
            for name, build in builders.items():
                for target in args.epsilons:
                    mechanism = build(target)
                    for scale in scales:
                        result = audit(mechanism, args.trials, args.seed, scale)
                        rows.append(row(mechanism, result, scale, "vectorized"))
                        print(
                            f"{label}{name} eps={target:g} noise x{scale:g}: eps_LB {result.epsilon_lb:.3f}", flush=True
                        )
        return rows

    if not args.attacks_only:
        rows = audited(((MECHANISMS, (1.0, BROKEN)), (FINDINGS, (1.0,))))
        if args.real_trials > 0:
            target = args.epsilons[0]
            for name in ("dp-fedsgd", "steffle-fairness", "fedsc-calr", "steffle-record"):
                mechanism = MECHANISMS[name](target)
                for scale in (1.0, BROKEN):
                    result = audit_real(mechanism, args.real_trials, args.seed + 1, scale)
                    rows.append(row(mechanism, result, scale, "real function, one call each"))
                    print(f"{name} eps={target:g} noise x{scale:g} (real): eps_LB {result.epsilon_lb:.3f}", flush=True)
        print()
        print(markdown(rows))
    attack_rows = audited(
        ((ATTACKS, (1.0, BROKEN)), (ATTACK_CONTROLS, (1.0, BROKEN)), (PRE_FIX, (1.0,))), "under attack: "
    )
    found = refusals()
    print("\n## Under attack: the forged messages the silo answers, audited\n")
    print(markdown(attack_rows))
    print("\n## Under attack: the forged messages the silo refuses (sent through the real ClientApp)\n")
    print(refusal_markdown(found))
    print(
        f"\n{time.perf_counter() - start:.0f} s; delta = {DELTA:g}, confidence {CONFIDENCE:.0%} (one-sided "
        "Clopper-Pearson per error rate at 97.5 %, joint by a union bound)"
    )


if __name__ == "__main__":
    main()
