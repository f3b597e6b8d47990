"""DP-FedSGD round: charge the ledger, then one noisy clipped gradient (record-level DP, add/remove neighbours)."""

from __future__ import annotations

from flwr.app import Context, Message
from torch import nn

from silofl.client import randomness
from silofl.client.data.tabular import SiloData
from silofl.client.gradients import unflatten
from silofl.client.noisy_gradient import noisy_gradient
from silofl.client.round_privacy import RoundPrivacy
from silofl.client.rounds import RoundResult, with_records
from silofl.protocols import messages as msg
from silofl.protocols.models import parameter_spec
from silofl.protocols.privacy.mechanism import Mechanism, Release


def mechanism(records: int, instr: msg.TrainInstruction) -> Mechanism:
    """T Poisson-sampled steps at q = min(1, m / n_j), each the sum of the sample's per-record gradients clipped to C
    (a ball of radius C around 0 whatever the record: add/remove sensitivity C), divided by the public m."""
    return Mechanism(
        relation="add_remove",
        sampling="poisson",
        sampling_rate=min(1.0, instr.batch_size / records),
        steps=instr.total_rounds,
        releases=(Release("gradient", radius=instr.clip),),
        parameters={"batch-size": instr.batch_size},
    )


@with_records()
def train_round(
    model: nn.Module, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    n = len(silo.train)
    privacy = RoundPrivacy(context, instr, mechanism(n, instr), who=f"silo {silo.silo_id}", node_id=silo.silo_id)
    # The ledger is charged BEFORE anything is computed or released: a refused answer releases nothing.
    spent = privacy.charge()
    rate = privacy.mechanism.sampling_rate
    grad = noisy_gradient(
        model,
        silo.train.nonsensitive,
        sampling_rate=rate,
        batch_size=instr.batch_size,
        clip=instr.clip,
        noise_multiplier=privacy.noise_multiplier,
        sample_rng=privacy.rng(randomness.SAMPLING),
        noise_generator=privacy.generator(randomness.NOISE),
    )
    update = {name: t.detach().numpy().astype("float32") for name, t in unflatten(grad, parameter_spec(model)).items()}
    return {msg.UPDATE: update}, privacy.report(num_examples=n, sampling_rate=rate, spent=spent)
