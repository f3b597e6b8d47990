"""FedFDP round on a silo (Ling et al. 2024, Alg. 2): charge the ledger, then one fair, clipped,
noised local step and the noised loss release, both computed in the silo.

What leaves the silo, and why each is private under add/remove-one-record neighbours (FedFDP's record is the whole
row (x, s, y), the silo's protection is ISRL-DP against the server):

- ``update``: w_i = w_t - eta (sum_{j in B} c_j g_j + N(0, sigma^2 C^2 I)) / m on a Poisson(q) sample B. Each term has
  norm <= C (fair clipping, Eq. 13), so the noised sum is a Gaussian mechanism of multiplier sigma; w_t, eta and m are
  public, so w_i is post-processing of it.
- ``loss-release``: F~_i = (sum_{j in B'} min(C_l, max(0, f(w_i; x_j))) + N(0, sigma_l^2 C_l^2)) / m on a fresh,
  independent Poisson(q) sample B' (its own random stream). Each term lies in [0, C_l]; C_l is fixed before the round
  (the silo's own previous release, floored at 1e-3, or C_l0 = 2.5), so its multiplier is sigma_l = 2.5 sigma.
- the report: n_i (public), the epsilon spent, sigma and q. No count of B or B', no un-noised loss.

Accounting: per round PoissonSampled(q, Gaussian(sigma)) composed with PoissonSampled(q, Gaussian(sigma_l)) (two
independent samples: two mechanisms), calibrated once for (epsilon, delta, q, T) and charged to the silo's ledger
before anything is computed (`client.privacy_state`, the ledger's `companion`).

The silo keeps C_l in its persistent state (with the round it was fixed for, so a round recomputed after a crash
uses the same bound); it is the silo's own last release, nothing new.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message
from torch import nn

from silofl.client import randomness
from silofl.client.algorithms import fedfdp as algo
from silofl.client.data.tabular import SiloData
from silofl.client.gradients import unflatten
from silofl.client.round_privacy import RoundPrivacy
from silofl.client.rounds import RoundResult, with_records
from silofl.protocols import fedfdp
from silofl.protocols import messages as msg
from silofl.protocols.models import parameter_spec, set_parameters
from silofl.protocols.privacy.mechanism import Mechanism, Release

#: The silo's adaptive loss bound in its state: `bound` is C_l of round `round`; `next` the bound for the round after.
BOUND_KEY = "silofl.fedfdp"
#: The loss release in the silo's mechanism (on its own Poisson sample).
LOSS = "loss"
#: The name of the scalar in the global-loss and loss-release records.
VALUE = "value"
SCALAR = (1,)


def mechanism(records: int, instr: msg.TrainInstruction) -> Mechanism:
    """T steps, each two Poisson-sampled releases on independent samples of rate q = min(1, m / n_i): the fair,
    clipped gradient sum (radius C) and the clipped loss sum (radius C_l, which the silo sets itself each round from
    its own last release, or the run's fixed `loss-bound`) at 2.5 x the calibrated multiplier (sigma_l = 2.5 sigma)."""
    rate = min(1.0, instr.batch_size / records)
    return Mechanism(
        relation="add_remove",
        sampling="poisson",
        sampling_rate=rate,
        steps=instr.total_rounds,
        releases=(
            Release("update", radius=instr.clip),
            Release(LOSS, radius=instr.loss_bound or None, sample=LOSS, ratio=fedfdp.LOSS_NOISE_RATIO),
        ),
        parameters={"batch-size": instr.batch_size},
    )


def loss_bound(context: Context, server_round: int) -> float:
    """C_l for `server_round`: fixed once per round (before anything of the round is computed)."""
    if BOUND_KEY in context.state:
        rec = context.state[BOUND_KEY]
        if int(rec["round"]) == server_round:  # the round is computed again (its answer never left): same bound
            return float(rec["bound"])
        bound = float(rec["next"])
    else:
        bound = fedfdp.LOSS_BOUND_INIT
    context.state[BOUND_KEY] = ConfigRecord({"round": server_round, "bound": bound, "next": bound})
    return bound


@with_records(msg.GLOBAL_LOSS)
def train_round(
    model: nn.Module, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    what = f"train message to silo {silo.silo_id}"
    global_loss = float(
        msg.check_arrays(message.content, msg.GLOBAL_LOSS, [(VALUE, SCALAR)], what=what, max_abs=msg.MAX_SERVER_VALUE)[
            VALUE
        ][0]
    )
    n = len(silo.train)
    privacy = RoundPrivacy(context, instr, mechanism(n, instr), who=f"silo {silo.silo_id}", node_id=silo.silo_id)
    rate = privacy.mechanism.sampling_rate
    # The ledger is charged BEFORE anything is computed or released: a refused answer releases nothing.
    spent = privacy.charge()
    adaptive = instr.loss_bound == 0
    bound = loss_bound(context, instr.server_round) if adaptive else instr.loss_bound
    noise = privacy.generator(randomness.NOISE)
    data = silo.train.nonsensitive
    grad = algo.fair_noisy_gradient(
        model,
        data,
        global_loss=global_loss,
        lam=instr.lam,
        sampling_rate=rate,
        batch_size=instr.batch_size,
        clip=instr.clip,
        noise_multiplier=privacy.noise_multiplier,
        sample_rng=privacy.rng(randomness.SAMPLING),
        noise_generator=noise,
    )
    spec = parameter_spec(model)
    current = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().to(torch.float64)
    stepped = algo.local_step(current, grad.to(torch.float64), instr.lr)
    update = {name: t.numpy().astype(np.float32) for name, t in unflatten(stepped, spec).items()}
    set_parameters(model, update)  # w_i as sent: the loss release is computed at the model the server receives
    released = algo.loss_release(
        model,
        data,
        bound=bound,
        sampling_rate=rate,
        batch_size=instr.batch_size,
        noise_multiplier=privacy.multiplier_of(LOSS),
        sample_rng=privacy.rng(randomness.LOSS_SAMPLING),
        noise_generator=noise,
    )
    if adaptive:
        context.state[BOUND_KEY]["next"] = fedfdp.next_loss_bound(released)
    report = privacy.report(num_examples=n, sampling_rate=rate, spent=spent)
    return {msg.UPDATE: update, msg.LOSS_RELEASE: {VALUE: np.array([released], dtype=np.float32)}}, report
