"""DP-mu2-FL round on a silo (the paper's Algorithms 1 and 2, "Actions of Machine i"; `protocols.mu2` has the math).

Each round the server sends the query points x_t and x_{t-1}. The silo takes its next b records of a single pass
over its data (a fixed random order: every record is used once, in one round), evaluates the gradients at both points
on those same records, updates its corrected momentum d_t (kept in its persistent state; its un-noised value never
leaves the silo) and releases q_t = t d_t: with its own Gaussian noise when the server is untrusted (Algorithm 1), as
is when the server is trusted (Algorithm 2; the server adds one noise draw to the average). A deployed silo sends an
un-noised q_t only if its operator allows it in the node config (`allow-trusted-server = true`).

Computation in numpy float64 through `protocols.mu2` (closed-form logistic-regression gradients), so the run matches
`protocols.mu2.run_mu2_reference` exactly.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
from torch import nn

from client import privacy_state, randomness
from client.data.tabular import SiloData
from client.rounds import RoundResult, with_records
from client.silo_data import is_deployed
from protocols import messages as msg
from protocols import mu2
from protocols.models import build_model, flatten_parameters, parameter_spec, unflatten_parameters

D_KEY = "silofl.mu2.d"
ROUND_KEY = "silofl.mu2.round"
ORDER_KEY = "silofl.mu2.order"
ALLOW_TRUSTED_KEY = "allow-trusted-server"


def constants_for(silo: SiloData, diameter: float) -> mu2.Mu2Constants:
    return mu2.Mu2Constants.for_logreg(silo.info.num_features, silo.info.num_labels, D=diameter)


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
    what = f"train message to silo {silo.silo_id}"
    spec = parameter_spec(build_model("logreg", silo.info.num_features, silo.info.num_labels))
    t = instr.server_round
    x_t = flatten_parameters(msg.check_arrays(message.content, msg.MODEL, spec, dtype="float64", what=what))
    x_prev = flatten_parameters(msg.check_arrays(message.content, msg.PREVIOUS, spec, dtype="float64", what=what))
    trusted = instr.trust == "trusted"
    if trusted and is_deployed(context) and not _allowed(context):
        raise msg.MessageError(
            f"{what}: a trusted-server run asks this silo to send its momentum un-noised; its operator has not "
            f"allowed that (node config '{ALLOW_TRUSTED_KEY} = true')"
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
    constants = constants_for(silo, instr.domain_diameter)
    rho = mu2.resolve_rho(instr.rho, instr.epsilon, instr.delta)
    sgd = instr.algorithm == "noisy-sgd"
    calibrate = mu2.calibrate_noisy_sgd if sgd else mu2.calibrate
    cal = calibrate(
        constants, num_rounds=instr.total_rounds, num_silos=1, rho=rho, trusted=False, batch_size=b, delta=instr.delta
    )
    sigma = 0.0 if trusted else cal.sigma
    multiplier = cal.noise_multiplier
    spent = math.inf
    if not trusted:
        epsilon = math.inf if math.isinf(rho) else mu2.rho_to_epsilon(rho, instr.delta)
        # DP-mu2-FL: every round's q_t depends on every earlier record, so T releases compose. Noisy SGD: each record
        # is used in one round only (parallel composition): one release per record, charged once.
        plan = privacy_state.noise_plan(
            context,
            epsilon=epsilon,
            delta=instr.delta,
            sampling_rate=1.0,
            steps=1 if sgd else instr.total_rounds,
            releases=1,
            accountant=instr.accountant,
            noise_multiplier=multiplier,
        )
        # Charged before anything is computed or released: a refused answer releases nothing.
        if sgd and t > 1:
            spent = privacy_state.spent(context)
        else:
            spent = privacy_state.charge(context, plan, server_round=t, silo=f"silo {silo.silo_id}")

    rows = record_order(context, silo, instr.seed)[(t - 1) * b : t * b]
    features = silo.train.nonsensitive.features[rows].astype(np.float64)
    labels = silo.train.nonsensitive.labels[rows]
    classes = silo.info.num_labels
    g = mu2.logreg_grad(x_t, features, labels, classes)
    if sgd:
        q = g
        context.state[ROUND_KEY] = ConfigRecord({"round": t})
        if sigma > 0:
            q = q + sigma * _noise(context, instr, silo, t).standard_normal(q.shape[0])
        return {msg.UPDATE: unflatten_parameters(q, spec)}, _report(silo, t, spent, 0.0 if trusted else multiplier)
    d_prev = None
    g_prev = None
    if t > 1:
        if D_KEY not in context.state:
            raise msg.MessageError(f"{what}: round {t} but this silo holds no momentum from round {t - 1}")
        d_prev = context.state[D_KEY]["d"].numpy()
        g_prev = mu2.logreg_grad(x_prev, features, labels, classes)
    d, q = mu2.silo_step(d_prev, g, g_prev, t)
    context.state[D_KEY] = ArrayRecord({"d": Array(d)})
    context.state[ROUND_KEY] = ConfigRecord({"round": t})
    if sigma > 0:
        q = q + sigma * _noise(context, instr, silo, t).standard_normal(q.shape[0])
    return {msg.UPDATE: unflatten_parameters(q, spec)}, _report(silo, t, spent, 0.0 if trusted else multiplier)


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


def _allowed(context: Context) -> bool:
    return str(context.node_config.get(ALLOW_TRUSTED_KEY, "false")).lower() in {"true", "1", "yes"}
