"""DP-FedSGD round: charge the ledger, then one noisy clipped gradient (record-level DP, add/remove neighbours)."""

from __future__ import annotations

from flwr.app import Context, Message
from torch import nn

from client import privacy_state, randomness
from client.algorithms.dp_fedsgd import noisy_gradient
from client.data.tabular import SiloData
from client.gradients import unflatten
from client.rounds import RoundResult, with_records
from protocols import messages as msg
from protocols.models import parameter_spec


@with_records()
def train_round(
    model: nn.Module, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    n = len(silo.train)
    rate = min(1.0, instr.batch_size / n)
    plan = privacy_state.noise_plan(
        context,
        epsilon=instr.epsilon,
        delta=instr.delta,
        sampling_rate=rate,
        steps=instr.total_rounds,
        releases=1,
        accountant=instr.accountant,
    )
    # The ledger is charged BEFORE anything is computed or released: a refused answer releases nothing.
    spent = privacy_state.charge(context, plan, server_round=instr.server_round, silo=f"silo {silo.silo_id}")
    keys = {"seed": instr.seed, "silo_id": silo.silo_id, "server_round": instr.server_round}
    grad = noisy_gradient(
        model,
        silo.train.nonsensitive,
        sampling_rate=rate,
        batch_size=instr.batch_size,
        clip=instr.clip,
        noise_multiplier=plan.noise_multiplier,
        sample_rng=randomness.numpy_rng(context, stream=randomness.SAMPLING, **keys),
        noise_generator=randomness.torch_generator(context, stream=randomness.NOISE, **keys),
    )
    update = {name: t.detach().numpy().astype("float32") for name, t in unflatten(grad, parameter_spec(model)).items()}
    report = msg.TrainReport(
        silo_id=silo.silo_id,
        server_round=instr.server_round,
        num_examples=n,
        epsilon_spent=spent,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=rate,
    )
    return {msg.UPDATE: update}, report
