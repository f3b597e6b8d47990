"""FedAvg round: local epochs of SGD, the trained model back (no privacy)."""

from __future__ import annotations

from flwr.app import Context, Message
from torch import nn

from silofl.client import randomness
from silofl.client.algorithms.fedavg import local_sgd
from silofl.client.data.tabular import SiloData
from silofl.client.rounds import RoundResult, with_records
from silofl.protocols import messages as msg
from silofl.protocols.models import get_parameters


@with_records()
def train_round(
    model: nn.Module, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    rng = randomness.numpy_rng(
        context, seed=instr.seed, silo_id=silo.silo_id, server_round=instr.server_round, stream=randomness.SHUFFLE
    )
    n = local_sgd(
        model, silo.train.nonsensitive, epochs=instr.local_epochs, batch_size=instr.batch_size, lr=instr.lr, rng=rng
    )
    report = msg.TrainReport(
        silo_id=silo.silo_id,
        server_round=instr.server_round,
        num_examples=n,
        epsilon_spent=float("inf"),
        noise_multiplier=0.0,
        sampling_rate=1.0,
    )
    return {msg.UPDATE: get_parameters(model)}, report
