"""DP-mu2-FL round on a silo (the paper's Algorithms 1 and 2, "Actions of Machine i"; `protocols.mu2fl` has the math).

Each round the server sends the query points x_t and x_{t-1}. The silo takes its next b records of a single pass
over its data (a fixed random order: every record is used once, in one round), evaluates the gradients at both points
on those same records, updates its corrected momentum d_t (kept in its persistent state; its un-noised value never
leaves the silo) and releases q_t = t d_t: with its own Gaussian noise when the server is untrusted (Algorithm 1), as
is when the server is trusted (Algorithm 2; the server adds one noise draw to the average). A deployed silo sends an
un-noised q_t only if its operator allows it in the node config (`allow-trusted-server = true`).

Computation in numpy float64 through `protocols.mu2fl` (closed-form logistic-regression gradients), so the run matches
`protocols.mu2fl.run_mu2_reference` exactly.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
from torch import nn

from silofl.client import randomness, silo_policy
from silofl.client.data.tabular import SiloData
from silofl.client.round_privacy import RoundPrivacy
from silofl.client.rounds import RoundResult, with_records
from silofl.client.silo_data import is_deployed
from silofl.protocols import messages as msg
from silofl.protocols import mu2fl
from silofl.protocols.models import build_model, flatten_parameters, parameter_spec, unflatten_parameters
from silofl.protocols.privacy.mechanism import Mechanism, Release

D_KEY = "silofl.mu2.d"
ROUND_KEY = "silofl.mu2.round"
ORDER_KEY = "silofl.mu2.order"


def constants_for(silo: SiloData, diameter: float) -> mu2fl.Mu2Constants:
    return mu2fl.Mu2Constants.for_logreg(silo.info.num_features, silo.info.num_labels, D=diameter)


@functools.lru_cache(maxsize=8)
def _order(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n)


def record_order(context: Context, silo: SiloData, seed: int) -> np.ndarray:
    """The silo's single-pass order of its records, fixed at its first round (seeded in simulation)."""
    if ORDER_KEY not in context.state:
        order_seed = randomness.round_seed(
            context, seed=seed, silo_id=silo.silo_id, server_round=0, stream=randomness.SHUFFLE
        )
        context.state[ORDER_KEY] = ConfigRecord({"seed": str(order_seed)})
    return _order(int(context.state[ORDER_KEY]["seed"]), len(silo.train))


@with_records(msg.PREVIOUS, model=False)
def train_round(
    model: nn.Module | None, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    """DP-mu2-FL's silo round (the `mu2fl` registry entry): corrected momentum, t d_t released."""
    return _single_pass_round(silo, instr, context, message, sgd=False)


@with_records(msg.PREVIOUS, model=False)
def train_round_noisy_sgd(
    model: nn.Module | None, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    """The noisy-SGD baseline's silo round (the `noisy-sgd` registry entry): the round's mean gradient released."""
    return _single_pass_round(silo, instr, context, message, sgd=True)


def _single_pass_round(
    silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message, *, sgd: bool
) -> RoundResult:
    what = f"train message to silo {silo.silo_id}"
    spec = parameter_spec(build_model("logreg", silo.info.num_features, silo.info.num_labels))
    t = instr.server_round
    bound = {"dtype": "float64", "what": what, "max_abs": msg.MAX_SERVER_VALUE}
    x_t = flatten_parameters(msg.check_arrays(message.content, msg.MODEL, spec, **bound))
    x_prev = flatten_parameters(msg.check_arrays(message.content, msg.PREVIOUS, spec, **bound))
    trusted = instr.trust == "trusted"
    if trusted and not silo_policy.allow_trusted(context, deployed=is_deployed(context)):
        raise msg.MessageError(
            f"{what}: a trusted-server run asks this silo to send its momentum un-noised; its operator has not "
            f"allowed that (policy 'allow-trusted-server = true', or node config "
            f"'{silo_policy.ALLOW_TRUSTED_KEY} = true')"
        )
    if trusted and math.isfinite(silo_policy.node_policy(context).lifetime_epsilon):
        raise msg.MessageError(
            f"{what}: a trusted-server run asks this silo to send its momentum un-noised, which no lifetime ledger can "
            "hold (its epsilon is unbounded); its policy sets lifetime-epsilon, so it refuses (untrusted mode adds "
            "the noise at the silo)"
        )
    b = instr.batch_size
    if instr.total_rounds * b > len(silo.train):
        raise msg.MessageError(
            f"{what}: {instr.total_rounds} rounds x batch {b} exceed this silo's {len(silo.train)} records (DP-mu2-FL "
            "makes one pass: every record is used once)"
        )
    # Rounds strictly in order, each answered once: a round's records are used in that round only (single pass).
    last = int(context.state[ROUND_KEY]["round"]) if ROUND_KEY in context.state else 0
    if t != last + 1:
        raise msg.MessageError(f"{what}: round {t} after round {last}; a silo answers rounds once each, in order")
    # Round t uses records (t-1) b .. t b - 1 of the pass: with b pinned at round 1 no record is used twice.
    pinned = int(context.state[ROUND_KEY]["batch"]) if ROUND_KEY in context.state else b
    if b != pinned:
        raise msg.MessageError(
            f"{what}: batch size {b} in round {t}, but the run started with {pinned}; the single pass (and its privacy "
            "accounting: one use per record) needs the same batch size in every round"
        )
    constants = constants_for(silo, instr.domain_diameter)
    if t == 1:  # the silo's records are fixed for the run: checked once (a full scan costs ~10 ms per round)
        check_features(silo, what)
    check_in_domain(x_t, x_prev, instr.domain_diameter, what)
    if not sgd and t > 1:
        check_query_step(x_t, x_prev, t, instr.domain_diameter, what)
    rho = mu2fl.resolve_rho(instr.rho, instr.epsilon, instr.delta)
    calibrate = mu2fl.calibrate_noisy_sgd if sgd else mu2fl.calibrate
    cal = calibrate(
        constants, num_rounds=instr.total_rounds, num_silos=1, rho=rho, trusted=False, batch_size=b, delta=instr.delta
    )
    sigma = 0.0 if trusted else cal.sigma
    multiplier = cal.noise_multiplier
    spent = math.inf
    if not trusted:
        epsilon = math.inf if math.isinf(rho) else mu2fl.rho_to_epsilon(rho, instr.delta)
        privacy = RoundPrivacy(
            context,
            instr,
            mechanism(instr, cal, sgd=sgd),
            who=f"silo {silo.silo_id}",
            node_id=silo.silo_id,
            epsilon=epsilon,
        )
        # Charged before anything is computed or released: a refused answer releases nothing.
        spent = privacy.spent() if sgd and t > 1 else privacy.charge()

    rows = record_order(context, silo, instr.seed)[(t - 1) * b : t * b]
    features = silo.train.nonsensitive.features[rows].astype(np.float64)
    labels = silo.train.nonsensitive.labels[rows]
    classes = silo.info.num_labels
    g = mu2fl.logreg_grad(x_t, features, labels, classes)
    if sgd:
        q = g
        context.state[ROUND_KEY] = ConfigRecord({"round": t, "batch": b})
        if sigma > 0:
            q = q + sigma * _noise(context, instr, silo, t).standard_normal(q.shape[0])
        return {msg.UPDATE: unflatten_parameters(q, spec)}, _report(silo, t, spent, 0.0 if trusted else multiplier)
    d_prev = None
    g_prev = None
    if t > 1:
        if D_KEY not in context.state:
            raise msg.MessageError(f"{what}: round {t} but this silo holds no momentum from round {t - 1}")
        d_prev = context.state[D_KEY]["d"].numpy()
        g_prev = mu2fl.logreg_grad(x_prev, features, labels, classes)
    d, q = mu2fl.silo_step(d_prev, g, g_prev, t)
    context.state[D_KEY] = ArrayRecord({"d": Array(d)})
    context.state[ROUND_KEY] = ConfigRecord({"round": t, "batch": b})
    if sigma > 0:
        q = q + sigma * _noise(context, instr, silo, t).standard_normal(q.shape[0])
    return {msg.UPDATE: unflatten_parameters(q, spec)}, _report(silo, t, spent, 0.0 if trusted else multiplier)


def mechanism(instr: msg.TrainInstruction, cal: mu2fl.Mu2Calibration, *, sgd: bool) -> Mechanism:
    """An untrusted silo's run: DP-mu2-FL's T releases of q_t = t d_t (every q_t depends on every earlier record, so
    they compose), or noisy SGD's one release per record (each record is used in one round only: parallel
    composition, charged once), each a Gaussian of sensitivity 2 S / b (2 G / b) to replacing one record at the
    noise multiplier the algorithm fixes (sqrt(T) / rho; 1 / rho). The sensitivity holds for features in [0, 1] and
    query points in the domain K of diameter D whose steps keep Lemma 4.2's bound: the domain diameter, the batch size
    and the trust are bound with it."""
    return Mechanism(
        relation="add_remove",
        sampling="none",
        sampling_rate=1.0,
        steps=1 if sgd else instr.total_rounds,
        releases=(Release("gradient" if sgd else "momentum", radius=cal.sensitivity),),
        fixed_multiplier=cal.noise_multiplier,
        parameters={"domain-diameter": instr.domain_diameter, "batch-size": instr.batch_size, "trust": instr.trust},
        radius_is_distance=True,
    )


def check_in_domain(x_t: np.ndarray, x_prev: np.ndarray, diameter: float, what: str) -> None:
    """Refuse query points outside the domain K, the ball of radius D / 2 around 0 (`protocols.mu2fl`): the server's
    points are anytime averages of points of K, and the silo's bounds (G, L, S = G + 2 L D) and its arithmetic are
    for points of K. A relative slack of 1e-9 absorbs float64 rounding of the server's projection. Depends on the
    message only: the same refusal whatever the silo's data."""
    radius = diameter / 2.0
    for name, point in (("x_t", x_t), ("x_(t-1)", x_prev)):
        norm = float(np.linalg.norm(point))
        if not norm <= radius * (1.0 + 1e-9):
            raise msg.MessageError(
                f"{what}: query point {name} has norm {norm:.6g}, outside the domain K (the ball of radius D / 2 = "
                f"{radius:.6g} around 0, domain-diameter {diameter}); the silo's noise covers only query points of K, "
                "so it refuses this round"
            )


def check_query_step(x_t: np.ndarray, x_prev: np.ndarray, t: int, diameter: float, what: str) -> None:
    """Refuse query points that break Lemma 4.2's bound (t - 1) ||x_t - x_{t-1}|| <= 2D (`protocols.mu2fl`, eq. 18).

    The sensitivity S = G + 2LD the silo's noise is calibrated for holds only for query points an honest server
    produces (anytime averages of points of K). An untrusted server could otherwise send far-apart points and read the
    increment s_t = g_t + (t-1)(g_t - g_prev) of this round's record through noise too small for it
    (`docs/PRIVACY_AUDIT.md`). A relative slack of 1e-9 absorbs float64 rounding of the server's update.
    """
    step = (t - 1) * float(np.linalg.norm(x_t - x_prev))
    if not step <= 2.0 * diameter * (1.0 + 1e-9):
        raise msg.MessageError(
            f"{what}: round {t}'s query points are too far apart: (t - 1) ||x_t - x_(t-1)|| = {step:.6g} > 2 D = "
            f"{2.0 * diameter:.6g} (domain-diameter {diameter}); the silo's noise covers only query points of the "
            "anytime average over the domain K (Lemma 4.2), so it refuses this round"
        )


def check_features(silo: SiloData, what: str) -> None:
    """The gradient and smoothness bounds G, L (`Mu2Constants.for_logreg`) need every feature in [0, 1]."""
    features = silo.train.nonsensitive.features
    if features.size and not (float(features.min()) >= 0.0 and float(features.max()) <= 1.0):
        raise msg.MessageError(
            f"{what}: DP-mu2-FL calibrates its noise for features in [0, 1] (the Lipschitz and smoothness bounds of "
            f"logistic regression), but this silo's features range over [{float(features.min()):.4g}, "
            f"{float(features.max()):.4g}]; scale them to [0, 1] (e.g. min-max with public bounds) or use an image "
            "dataset (mnist, fashion-mnist: pixels in [0, 1])"
        )


def _noise(context: Context, instr: msg.TrainInstruction, silo: SiloData, t: int) -> np.random.Generator:
    seed = randomness.round_seed(
        context, seed=instr.seed, silo_id=silo.silo_id, server_round=t, stream=randomness.NOISE
    )
    return np.random.default_rng(seed)


def _report(silo: SiloData, t: int, spent: float, multiplier: float) -> msg.TrainReport:
    return msg.TrainReport(
        silo_id=silo.silo_id,
        server_round=t,
        num_examples=len(silo.train),
        epsilon_spent=spent,
        noise_multiplier=multiplier,
        sampling_rate=1.0,
    )
