"""FedSC and FedAvg+SC on a silo (the FedSC paper's Algorithms 1 and 2; `protocols.fedsc` has the math).

Two messages per FedSC round:

* ``query.correlation`` (:func:`correlation_reply`): the silo computes its correlation matrix with the current
  global model through DP-CalR (Algorithm 2: every representation normalized to norm sqrt(mu) by the model's
  representation layer and clipped to it, the mean of z z^T over V augmented views of every record, i.i.d. Gaussian
  noise on every entry, added here, in the silo, before the matrix leaves). Its noise is calibrated once per run for
  the largest number of shares the run's schedule can ask of it (`planned_shares`, at the run's
  `calr-sampling-rate`: 1 = every record, the paper; q < 1 = a Poisson sample of the records, a subsampled Gaussian
  in the accountant), and every share is charged to its ledger before anything is computed: the ledger counts the
  shares that actually happened (with partial participation a silo shares less often).
* ``train`` (:func:`train_round`): E local epochs (or `local-steps` minibatch steps) on eq. 5 with the server's
  Rbar_{-j} (the others' aggregate, `others`) and this round's alpha_t; the trained weights go back. The weights
  are NOT protected by DP-CalR (as in the paper); the run's privacy report says so.

FedAvg+SC (:func:`train_round_fedavg_sc`) is the same training with alpha = 1 and no correlation sharing.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message

from silofl.client import privacy_state, randomness, silo_policy
from silofl.client.algorithms.fedsc import local_sc_training
from silofl.client.augment import ssl_augmentation
from silofl.client.data.tabular import SiloData
from silofl.client.round_privacy import RoundPrivacy
from silofl.client.rounds import RoundResult, with_records
from silofl.protocols import messages as msg
from silofl.protocols.devices import resolve_device
from silofl.protocols.fedsc import normalize_rows
from silofl.protocols.models import ModelError, get_parameters, parameter_spec, set_parameters
from silofl.protocols.privacy.calr import (
    accountant_relation,
    dp_calr,
    normalize_release,
    release_divisor,
    release_noise_scale,
)
from silofl.protocols.privacy.mechanism import Mechanism, Release
from silofl.protocols.ssl_models import SSLModel, build_ssl_model, image_shape

SHARES_KEY = "silofl.fedsc.shares"
#: randomness streams of this module (distinct from client.randomness's SHUFFLE and NOISE)
AUGMENT_STREAM = 11
CALR_STREAM = 12


@functools.lru_cache(maxsize=4)
def _shell(kind: str, shape: tuple[int, int, int], projection_dim: int, width: int) -> SSLModel:
    """A model of the right architecture, reused across messages (every message overwrites all its parameters)."""
    return build_ssl_model(kind, shape, projection_dim=projection_dim, width=width, seed=0)


@functools.lru_cache(maxsize=2)
def _augmentation(shape: tuple[int, int, int]) -> torch.nn.Module:
    return ssl_augmentation(shape)


def silo_images(silo: SiloData) -> torch.Tensor:
    """The silo's training images as an (N, C, H, W) float tensor (records are flattened pixels in [0, 1])."""
    shape = image_shape(silo.info.num_features)
    return torch.from_numpy(silo.train.nonsensitive.features).reshape(-1, *shape)


def model_from_message(message: Message, silo: SiloData, instr: msg.TrainInstruction, what: str) -> SSLModel:
    """The global model of the message, on the run's device."""
    shape = image_shape(silo.info.num_features)
    try:
        model = _shell(instr.model, shape, instr.projection_dim, instr.width)
    except ModelError as exc:  # a user's encoder (--model module:factory) that does not import or build here
        raise msg.MessageError(f"{what}: {exc}") from None
    params = msg.check_arrays(
        message.content, msg.MODEL, parameter_spec(model), what=what, max_abs=msg.MAX_SERVER_VALUE
    )
    set_parameters(model, params)
    return model.to(_device(instr, what))


def _device(instr: msg.TrainInstruction, what: str) -> torch.device:
    try:
        return resolve_device(instr.device)
    except ValueError as exc:
        raise msg.MessageError(f"{what}: {exc}") from None


#: The DP-CalR share in the silo's mechanism.
CORRELATION = "correlation"


def mechanism(records: int, instr: msg.TrainInstruction) -> Mechanism:
    """The silo's DP-CalR shares: at most `planned_shares` Gaussian releases of its correlation matrix (rate 1: every
    record; q < 1: a Poisson sample), one record's term of norm at most the release's scale
    (`calr.release_noise_scale`: sqrt(2) mu / n or mu / n at rate 1, mu / (q n) below it; mu / q in the released
    sum under add/remove), under the accountant relation of `calr.accountant_relation`. `mu` and the views are bound
    with it."""
    rate = instr.calr_sampling_rate
    return Mechanism(
        relation=accountant_relation(instr.calr_relation, rate),
        sampling="poisson" if rate < 1.0 else "none",
        sampling_rate=rate,
        steps=instr.planned_shares,
        releases=(Release(CORRELATION, radius=release_noise_scale(instr.mu, records, instr.calr_relation, rate)),),
        parameters={"mu": instr.mu, "views": instr.views, "calr-relation": instr.calr_relation},
    )


def correlation_reply(
    silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> tuple[np.ndarray, msg.CorrelationReport]:
    """DP-CalR (Algorithm 2) on this silo's training records with the model of the message."""
    what = f"correlation query to silo {silo.silo_id}"
    rate = instr.calr_sampling_rate
    if instr.planned_shares < 1:
        raise msg.MessageError(f"{what}: 'planned_shares' must be >= 1 in a FedSC run (the schedule's shares)")
    t = instr.server_round
    shares = int(context.state[SHARES_KEY]["shares"]) if SHARES_KEY in context.state else 0
    last = int(context.state[SHARES_KEY]["round"]) if SHARES_KEY in context.state else 0
    if t <= last:
        raise msg.MessageError(f"{what}: round {t} after a share in round {last}; a silo shares once per round")
    if shares >= instr.planned_shares:
        raise msg.MessageError(
            f"{what}: this silo has shared {shares} times, all the run's schedule announced ({instr.planned_shares})"
        )
    n = len(silo.train)
    # The model is checked before the ledger is charged: a malformed query releases nothing and costs nothing.
    model = model_from_message(message, silo, instr, what)
    sigma, spent = 0.0, math.inf
    # The silo's own cap (`epsilon-budget` in its node config) applies even when the run asks for no noise.
    budget = silo_policy.job_budget(context, instr.epsilon)
    if math.isfinite(budget):
        privacy = RoundPrivacy(context, instr, mechanism(n, instr), who=f"silo {silo.silo_id}", node_id=silo.silo_id)
        # Rate 1: the Gaussian mechanism on a matrix of L2 (Frobenius) sensitivity Delta with std z * Delta is exactly
        # the mechanism the accountant prices at noise multiplier z, whatever the relation. Rate q < 1: one sampled
        # record's term has norm <= mu / (q n) (mu / q in the released sum / q under add/remove): the accountant's
        # Poisson-subsampled Gaussian (privacy/calr.py).
        sigma = privacy.multiplier_of(CORRELATION)
        sigma *= release_noise_scale(instr.mu, n, instr.calr_relation, rate)
        # Charged before anything is computed or released: a refused share releases nothing.
        spent = privacy.charge()
    shape = image_shape(silo.info.num_features)
    generator = torch.Generator().manual_seed(
        randomness.round_seed(context, seed=instr.seed, silo_id=silo.silo_id, server_round=t, stream=CALR_STREAM)
    )
    views_seed = randomness.round_seed(
        context, seed=instr.seed, silo_id=silo.silo_id, server_round=t, stream=AUGMENT_STREAM + 100
    )
    device = _device(instr, what)
    # kornia draws from torch's global RNG (the device's own generator for CUDA images): seed it, leave it as it was.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(views_seed)
        correlation = dp_calr(
            lambda x: normalize_rows(model(x), instr.mu),
            silo_images(silo).to(device),
            _augmentation(shape),
            views=instr.views,
            mu=instr.mu,
            sigma=sigma,
            generator=generator,
            sampling_rate=rate,
            divisor=release_divisor(instr.calr_relation, rate, n),
        )
    context.state[SHARES_KEY] = ConfigRecord({"shares": shares + 1, "round": t})
    report = msg.CorrelationReport(
        silo_id=silo.silo_id,
        server_round=t,
        num_examples=n,
        epsilon_spent=spent,
        shares=shares + 1,
        # the std on the server's R~_j (after its normalization, `calr.normalize_release`)
        noise_std=float(normalize_release(np.float64(sigma), instr.calr_relation, rate, n)),
    )
    return correlation, report


def _train(
    silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message, others: np.ndarray | None
) -> RoundResult:
    what = f"train message to silo {silo.silo_id}"
    model = model_from_message(message, silo, instr, what)
    shape = image_shape(silo.info.num_features)
    seed = randomness.round_seed(
        context, seed=instr.seed, silo_id=silo.silo_id, server_round=instr.server_round, stream=AUGMENT_STREAM
    )
    device = _device(instr, what)
    local_sc_training(
        model,
        silo_images(silo).to(device),
        _augmentation(shape),
        epochs=instr.local_epochs,
        batch_size=instr.batch_size,
        steps=instr.local_steps,
        lr=instr.lr,
        momentum=instr.momentum,
        weight_decay=instr.weight_decay,
        grad_clip=instr.grad_clip,
        mu=instr.mu,
        alpha=instr.alpha,
        others=None if others is None else torch.from_numpy(others).float().to(device),
        seed=seed,
    )
    report = msg.TrainReport(
        silo_id=silo.silo_id,
        server_round=instr.server_round,
        num_examples=len(silo.train),
        epsilon_spent=(
            privacy_state.spent(context) if math.isfinite(silo_policy.job_budget(context, instr.epsilon)) else math.inf
        ),
        noise_multiplier=0.0,
        sampling_rate=1.0,
    )
    return {msg.UPDATE: get_parameters(model)}, report


@with_records(msg.OTHERS, model=False)
def train_round(
    model: None, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    """FedSC's local update with the server's Rbar_{-j} (ignored while alpha = 1, before the first share)."""
    what = f"train message to silo {silo.silo_id}"
    h = instr.projection_dim
    others = msg.check_arrays(message.content, msg.OTHERS, [("R", (h, h))], dtype="float64", what=what)["R"]
    return _train(silo, instr, context, message, others if instr.alpha < 1.0 else None)


@with_records(model=False)
def train_round_fedavg_sc(
    model: None, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    """FedAvg+SC: plain local spectral contrastive training (alpha = 1, nothing shared)."""
    if instr.alpha != 1.0:
        raise msg.MessageError(f"train message to silo {silo.silo_id}: FedAvg+SC trains with alpha = 1")
    return _train(silo, instr, context, message, None)
