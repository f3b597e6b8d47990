"""Per-round silo compute of SteFFLe against a non-private FedSGD round on the same data, and their ratio.

    python benchmarks/steffle_round.py [--dataset adult] [--batch-size 256] [--rounds 300] [--model logreg]

One silo of 3 (IID) answers `train` messages through the real ClientApp (message checks, privacy ledger, both
divisions, noise, reply). SteFFLe: epsilon = 1, lambda = 1, demographic parity. Baseline: the same ClientApp with
SteFFLe at lambda = 0 and epsilon = inf, which sends only the minibatch loss gradient g: non-private FedSGD. The two
alternate round by round, so machine noise hits both alike; the figure is the median over rounds after a warm-up
(round 1 includes the silo's noise calibration).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client.app import app
from protocols import messages as msg
from protocols.models import build_model, get_parameters


def _context() -> Context:
    return Context(
        run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 3}, state=RecordDict(), run_config={}
    )


def _call(context: Context, content: RecordDict, kind: str) -> Message:
    message = Message(content, 5, kind, group_id="b")
    message.metadata.__dict__["_message_id"] = "m"
    reply = app(message, context)
    if reply.has_error():
        raise RuntimeError(reply.error.reason)
    return reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--model", default="logreg", choices=["logreg", "mlp"])
    args = parser.parse_args()
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    spec = msg.DataSpec(dataset=args.dataset, data_dir=os.environ.get("SILOFL_DATA_DIR", ""), num_silos=3)
    variants = {"steffle": {"epsilon": 1.0, "lam": 1.0}, "fedsgd": {"epsilon": float("inf"), "lam": 0.0}}
    contexts, instructions = {}, {}
    info = None
    for name, extra in variants.items():
        contexts[name] = _context()
        reply = _call(contexts[name], RecordDict({msg.CONFIG: spec.to_config_record()}), msg.SETUP)
        info = msg.read_config(reply.content, msg.SiloInfo, record=msg.REPORT)
        instructions[name] = msg.TrainInstruction.for_algorithm(
            "steffle",
            server_round=1,
            total_rounds=args.rounds + 1,
            batch_size=args.batch_size,
            lr=0.25,
            delta=1.0 / (3 * info.n_train) ** 2,
            model=args.model,
            **extra,
        )
        _call(contexts[name], RecordDict({msg.CONFIG: instructions[name].to_config_record()}), msg.GROUPS)
    model = build_model(args.model, info.num_features, info.num_labels)
    model_record = msg.arrays_record(get_parameters(model))
    fairness = msg.arrays_record(
        {
            "w": np.full((info.num_groups, info.num_labels), 0.5, np.float32),
            "prior": np.full(info.num_groups, 1.0 / info.num_groups, np.float32),
        }
    )
    times: dict[str, list[float]] = {name: [] for name in variants}
    for server_round in range(1, args.rounds + 1):
        for name in variants:
            instr = instructions[name].model_copy(update={"server_round": server_round}).to_config_record()
            content = RecordDict({msg.MODEL: model_record, msg.FAIRNESS: fairness, msg.CONFIG: instr})
            t0 = time.perf_counter()
            _call(contexts[name], content, msg.TRAIN)
            if server_round > 5:
                times[name].append(time.perf_counter() - t0)
    steffle, fedsgd = (statistics.median(times[n]) for n in ("steffle", "fedsgd"))
    print(
        f"silo compute per round, {args.dataset}, m = {args.batch_size}, {args.model}, one silo of 3 "
        f"({info.n_train} records, {info.num_features} features), median over {len(times['steffle'])} rounds"
    )
    print(f"  SteFFLe (eps 1, lambda 1)        : {steffle * 1000:7.3f} ms")
    print(f"  non-private FedSGD (g only)      : {fedsgd * 1000:7.3f} ms")
    print(f"  ratio                            : {steffle / fedsgd:7.2f}x")


if __name__ == "__main__":
    main()
