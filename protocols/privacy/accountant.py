"""Privacy accounting for Poisson-sampled Gaussian releases, on Google's ``dp-accounting``.

One *step* of a silo is: draw a Poisson sample of its records (rate ``q``), compute ``K`` quantities from that same
sample (e.g. SteFFLe's ``h_theta`` and ``h_W``: Gupta et al. 2024, Algorithm 1 line 8) and release each with
Gaussian noise. :func:`combined_noise_multiplier` shows the ``K`` releases are one Gaussian mechanism, so a run of ``T``
steps is ``T`` compositions of a Poisson-subsampled Gaussian (:func:`dp_event`). Its ``(epsilon, delta)`` comes from

* RDP (``dp_accounting.rdp.RdpAccountant``): Mironov et al. 2019 for the subsampled Gaussian, converted with the
  tighter bound of Balle et al. 2020 (Prop. 12); cheap, slightly loose;
* PLD (``dp_accounting.pld.PLDAccountant``): numerical composition of the privacy loss distribution (Koskela et al.
  2020; Doroshenko et al. 2022 "connect the dots"), pessimistic rounding (the library default, kept), so its epsilon is
  also an upper bound; usually 5-10 % tighter than RDP for DP-SGD-like settings, slower;
* ``"best"``: the smaller of the two. Both are valid upper bounds, so their minimum is one too.

Neighbouring relations (:data:`RELATIONS`), the ``relation`` argument of every accounting function here:

* ``"add_remove"`` (default): neighbours differ by one whole record, present or absent (DP-FedSGD, record-level DP).
  A release's ``sensitivity`` is the L2 norm bound of one record's contribution (e.g. the clip norm ``C`` of a sum of
  clipped per-record gradients). RDP, PLD and ``"best"`` all apply.
* ``"replace_one"``: neighbours differ in one record's *sensitive attribute* only (DP w.r.t. sensitive attributes:
  DP-FERMI paper Definition 2.2, SteFFLe Definition 2.3). The Poisson sample is drawn independently of the attributes,
  and each record's contribution to a released sum must lie in a ball of radius ``R`` **centred at 0, the
  contribution of a record that is not sampled**, whatever its attribute (e.g. a per-record vector clipped to norm
  ``C``: ``R = C``). ``R`` is the ``sensitivity`` given to :class:`~protocols.privacy.gaussian.GaussianMechanism`,
  so the noise multiplier is ``std / R``. Changing ``s_i`` then moves that contribution anywhere inside the ball, and
  the worst pair of outputs is dp-accounting's ``REPLACE`` adjacency (``pld/privacy_loss_mechanism.py``,
  ``AdditiveNoisePrivacyLoss``): ``mu_upper = q N(x + R) + (1 - q) N(x)``, ``mu_lower = q N(x - R) + (1 - q) N(x)``;
  at ``q = 1`` this is a Gaussian of sensitivity ``2 R`` (the library's note;
  ``tests/protocols/privacy/test_accountant.py`` checks it), and there only the distance between the two neighbours'
  values matters, not the centre, so ``R`` is half that distance (a histogram of group counts:
  :func:`protocols.privacy.gaussian.histogram_sensitivity`). Only PLD accounts it:
  ``PLDAccountant(neighboring_relation=REPLACE_ONE)`` hands the relation to ``from_gaussian_mechanism`` for
  ``GaussianDpEvent`` and ``PoissonSampledDpEvent(GaussianDpEvent)``, which builds one symmetric PMF with
  ``AdjacencyType.REPLACE`` (dp-accounting 0.6.0, the installed version). ``"best"`` therefore means PLD under
  ``replace_one``, and ``"rdp"`` is refused (:func:`check_accountant_supports`).

What ``replace_one`` relies on, and what it does not cover:

* That the library's pair is the worst pair in the ball. It is the textbook worst case (``c = -R e``, ``c' = R e``,
  all other records contributing 0); we did not prove that no other pair inside ``B(0, R)`` is worse, but
  ``tests/protocols/privacy/test_accountant.py`` checks, by 2-D numerical integration, that the hockey-stick divergences
  of several other pairs in the ball never exceed the library pair's.
* The centre must be 0. A ball of radius ``r`` around a centre ``m_i != 0`` that merely does not depend on ``s_i``
  (e.g. SteFFLe's W-gradient ``-2 W diag(F(x_i)) + 2 P_S^(-1/2) e_(s_i) F(x_i)^T``, whose first term is such a
  centre) is NOT covered with ``R = r``: for ``|m_i| >> noise std`` the output reveals whether record ``i`` was
  sampled, and the pair becomes ``(1 - q) A + q N(0)`` vs ``(1 - q) A + q N(2 r)`` with the "not sampled" part
  ``A`` disjoint, whose epsilon barely benefits from sampling (measured: q = 256/11300, T = 1770,
  delta = 1/33900^2, multiplier 4: 2.8 under REPLACE, 27 for that pair). Use ``R = max_i |m_i| + r`` (the
  triangle inequality puts the contribution in ``B(0, |m_i| + r)``), or clip the whole per-record contribution to a
  ball around 0.
* The sample must stay secret: a message that reveals who was sampled (e.g. an un-noised gradient of the same batch
  whose batch indices leak) gives the same disjoint pair. Draw such quantities on an independent sample.
* dp-accounting's ``RdpAccountant`` refuses ``PoissonSampledDpEvent`` under ``REPLACE_ONE``, and for a plain
  ``GaussianDpEvent`` under ``REPLACE_ONE`` it uses sensitivity 1 where its PLD accountant uses 2 (a different
  convention for the same event); this module never hands ``REPLACE_ONE`` to ``RdpAccountant``.

A valid RDP bound for ``replace_one`` does exist (replace = remove then add, joined by the weak triangle inequality
for Renyi divergences, Mironov 2017 Prop. 11: ``D_a(P||R) <= (a - 1/2)/(a - 1) D_2a(P||Q) + D_(2a-1)(Q||R)``), but it
is looser than PLD: 7-18 % above the PLD figure at q = 256/11300, T = 1770, delta = 1/33900^2, multipliers 2-8
(measured), so ``"best"`` would always pick PLD; we do not offer it.

One-off releases before the run (:class:`PriorRelease`, the ``prior`` argument): e.g. SteFFLe's setup round may
release a DP histogram of the silo's group counts once, without sampling. :func:`epsilon_spent` and
:func:`calibrate_noise` account the prior releases and the run as ONE composition (``ComposedDpEvent``, composed by the
accountant: PLD convolves the privacy loss distributions, RDP adds the curves), never as a sum of epsilons.

Why a wrapper at all: the library takes events, not run parameters; the wrapper fixes the event shape (so the silo
ledger, the calibration and the CLI all account the same thing), validates input with errors that name the argument,
and fixes the PLD discretization (:func:`pld_value_discretization`).

Where the code is, one job a module (import from here; this module only re-exports them):

* :mod:`protocols.privacy.checks`: argument checks, the accepted :data:`ACCOUNTANTS` and :data:`RELATIONS`;
* :mod:`protocols.privacy.events`: the run as dp-accounting sees it (:func:`combined_noise_multiplier`,
  :func:`dp_event`, :class:`PriorRelease`), the library's accountant and relation names, the PLD grid;
* :mod:`protocols.privacy.epsilon`: :func:`epsilon_spent`;
* :mod:`protocols.privacy.calibration`: :func:`calibrate_noise` and its :class:`Calibration`.
"""

from __future__ import annotations

from silofl.protocols.privacy.calibration import Calibration, calibrate_noise
from silofl.protocols.privacy.checks import (
    ACCOUNTANTS,
    RELATIONS,
    check_accountant,
    check_accountant_supports,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_relation,
    check_releases,
    check_sampling_rate,
    check_steps,
)
from silofl.protocols.privacy.epsilon import epsilon_spent
from silofl.protocols.privacy.events import (
    PLD_GRID_POINTS_PER_LOSS_SCALE,
    PLD_MAX_VALUE_DISCRETIZATION,
    PriorRelease,
    as_priors,
    combined_noise_multiplier,
    dp_event,
    library_accountants,
    library_relation,
    pld_value_discretization,
)

__all__ = [
    "ACCOUNTANTS",
    "PLD_GRID_POINTS_PER_LOSS_SCALE",
    "PLD_MAX_VALUE_DISCRETIZATION",
    "RELATIONS",
    "Calibration",
    "PriorRelease",
    "as_priors",
    "calibrate_noise",
    "check_accountant",
    "check_accountant_supports",
    "check_delta",
    "check_epsilon",
    "check_noise_multiplier",
    "check_relation",
    "check_releases",
    "check_sampling_rate",
    "check_steps",
    "combined_noise_multiplier",
    "dp_event",
    "epsilon_spent",
    "library_accountants",
    "library_relation",
    "pld_value_discretization",
]
