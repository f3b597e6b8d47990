"""SteFFLe with separate parties against SteFFLe on silos: seconds and bytes per round, same run otherwise.

    python benchmarks/steffle_parties.py [--dataset adult] [--silos 3] [--rounds 200] [--repeats 3]

Every variant is the same SteFFLe run (epsilon 1, lambda 1, demographic parity, batch 256, logistic regression)
through the real ServerApp, strategies and ClientApp on the in-process engine; only the topology differs:

* ``silos``: each silo holds both divisions (one exchange per round);
* ``central-sensitive``, ``divided``: N feature parties and one census-style sensitive party, or each silo's
  divisions on two nodes; the records sealed to the sensitive parties once at setup, then each round the model to
  every party and means back (two exchanges per round).

Seconds per round: the median of the rounds' wall times (result.json `rounds[].seconds`; evaluation only after the
last round), on the plain in-process engine. Bytes per round: the size of every message the server sends and every
reply it receives, as Flower serializes them for gRPC (`flwr.common.serde.message_to_proto(...).ByteSize()`), summed
over a round's messages (setup excluded: the one-off kB of setup, the sealed record exchange included, are their own
column), from a separate run of `--byte-rounds` rounds (serializing costs time of its own). The variants alternate,
`--repeats` times, so machine noise hits all alike; the figure kept is each variant's lowest median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import Message
from flwr.common.serde import message_to_proto

from silofl.client.app import app as client_app
from silofl.protocols.config import RunConfig
from silofl.protocols.messages import GROUPS, SETUP
from silofl.protocols.parties import HOLDINGS_QUERY, SEAL_QUERY, UNSEAL_QUERY
from silofl.server.inprocess_grid import InProcessGrid
from silofl.server.orchestrator import run_federation

#: The one-off messages of setup (the sealed record exchange included); every other message is a round's.
SETUP_KINDS = {SETUP, GROUPS, HOLDINGS_QUERY, SEAL_QUERY, UNSEAL_QUERY}

#: The run options of each measured topology, on top of the common ones.
VARIANTS: dict[str, dict] = {
    "silos": {},
    "central-sensitive": {"topology": "central-sensitive"},
    "divided": {"topology": "divided"},
}


class ByteCountingGrid(InProcessGrid):
    """The in-process engine, adding up the serialized size of each message sent and each reply received."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent = 0
        self.received = 0
        self.setup = 0

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(super().send_and_receive(messages, timeout=timeout))
        size = sum(_size(m) for m in messages) + sum(_size(r) for r in replies)
        if any(m.metadata.message_type in SETUP_KINDS for m in messages):
            self.setup += size
        else:
            self.sent += sum(_size(m) for m in messages)
            self.received += sum(_size(r) for r in replies)
        return replies


def _size(message: Message) -> int:
    return message_to_proto(message).ByteSize()


def _seconds(config: RunConfig) -> float:
    """The median seconds per round of a run (round 1 calibrates the noise, the last one evaluates: left out)."""
    rounds = run_federation(InProcessGrid(client_app, config.num_nodes), config)["rounds"]
    return statistics.median(r["seconds"] for r in rounds[1:-1])


def _bytes(config: RunConfig) -> tuple[float, float, float]:
    """(bytes sent, bytes received) per round by the server, and the bytes of setup (both ways, once)."""
    grid = ByteCountingGrid(client_app, config.num_nodes)
    rounds = len(run_federation(grid, config)["rounds"])
    return grid.sent / rounds, grid.received / rounds, grid.setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--silos", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--byte-rounds", type=int, default=5, help="rounds of the run that counts bytes")
    args = parser.parse_args()
    common = {
        "algorithm": "steffle",
        "dataset": args.dataset,
        "num-silos": args.silos,
        "rounds": args.rounds,
        "eval-every": args.rounds,
        "epsilon": 1.0,
        "lambda": 1.0,
        "w-noise": "isotropic",  # the default when benchmarks/README's figures were measured; both rows alike
        "batch-size": args.batch_size,
        "data-dir": os.environ.get("SILOFL_DATA_DIR", ""),
    }
    probe = run_federation(ByteCountingGrid(client_app, args.silos), RunConfig.parse({**common, "rounds": 1}))
    n_train = sum(s["n_train"] for s in probe["federation"]["silos"])
    seconds: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, extra in VARIANTS.items():
            measured = _seconds(RunConfig.parse({**common, **extra}))
            seconds[name] = min(measured, seconds.get(name, measured))
    sizes = {
        name: _bytes(RunConfig.parse({**common, **extra, "rounds": args.byte_rounds, "eval-every": args.byte_rounds}))
        for name, extra in VARIANTS.items()
    }
    base_seconds, (base_sent, base_received, _) = seconds["silos"], sizes["silos"]
    print(
        f"SteFFLe on {args.dataset}: {args.silos} silos or feature parties, {n_train} training records, batch "
        f"{args.batch_size}, eps 1, lambda 1; {args.rounds} rounds, best median of {args.repeats}, in-process engine"
    )
    header = (
        f"{'topology':<19}{'ms/round':>10}{'x silos':>9}{'kB sent':>11}{'kB received':>13}{'x silos':>9}"
        f"{'kB setup':>11}"
    )
    print(header)
    for name, (sent, received, setup) in sizes.items():
        print(
            f"{name:<19}{seconds[name] * 1000:>10.2f}{seconds[name] / base_seconds:>9.2f}{sent / 1000:>11.1f}"
            f"{received / 1000:>13.1f}{(sent + received) / (base_sent + base_received):>9.2f}{setup / 1000:>11.1f}"
        )


if __name__ == "__main__":
    main()
