"""Milliseconds per SteFFLe round on the in-process engine, and one silo's compute against non-private FedSGD.

    python benchmarks/steffle_round.py [--dataset adult] [--batch-size 256] [--rounds 600] [--repeats 3]
                                       [--model logreg] [--silo-rounds 300] [--math-rounds 300] [--policy-rounds 300]

1. The whole round: `silofl run steffle` on the in-process engine (real ServerApp, strategy and 3 ClientApps through
   `server.inprocess_grid`: messages, checks, copies, ledgers, both divisions, noise), epsilon = 1, lambda = 1,
   demographic parity, 3 IID silos, evaluation only after the last round. The figure is the median of
   `rounds[i].seconds` over rounds 2 .. T-1 (round 1 includes each silo's noise calibration, round T the
   evaluation), best of `--repeats` runs; the mean over the same rounds includes the ledgers' PLD evaluations (the
   privacy accountant, a few rounds in ten). Next to it, the same run without privacy or fairness (lambda = 0,
   epsilon = inf: each silo sends only its loss gradient g, i.e. non-private FedSGD through the same code), and
   their ratio: what SteFFLe's privacy and fairness cost per round.
2. One silo (`--silo-rounds`, 0 to skip): the ClientApp called directly with `train` messages, SteFFLe against
   the same ClientApp at lambda = 0 and epsilon = inf; the two alternate round by round, so machine noise hits both
   alike; the median over rounds after a warm-up.
3. The math alone (`--math-rounds`): the three silos' calls of `client.algorithms.steffle`, no messages.
4. The operator's policy (`--policy-rounds`): one silo with a state folder, without and with a policy (a lifetime
   budget, SteFFLe listed), alternating as in 2: what the policy checks cost per round.
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
import torch
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from silofl.client.app import app
from silofl.protocols import messages as msg
from silofl.protocols.models import build_model, get_parameters

#: SteFFLe as the issue measures it, and the same code without privacy and fairness (non-private FedSGD).
VARIANTS = {"steffle": {"epsilon": 1.0, "lam": 1.0}, "fedsgd": {"epsilon": float("inf"), "lam": 0.0}}


def round_times(dataset: str, batch_size: int, rounds: int, model: str, variant: str) -> list[float]:
    """Seconds of rounds 2 .. T-1 of one in-process run (`variant`: a key of VARIANTS)."""
    from silofl.client.privacy_state import clear_caches
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    clear_caches()  # each run pays its noise calibration and privacy accounting as in a fresh process
    extra = VARIANTS[variant]
    values = {
        "algorithm": "steffle",
        "dataset": dataset,
        "num-silos": 3,
        "rounds": rounds,
        "eval-every": rounds,
        "batch-size": batch_size,
        "model": model,
        "epsilon": extra["epsilon"],
        "lambda": extra["lam"],
        "data-dir": os.environ.get("SILOFL_DATA_DIR", ""),
    }
    result = run_job(RunConfig.parse(values), engine="inprocess", progress=False)
    return [r["seconds"] for r in result["rounds"][1:-1]]


def whole_round(args: argparse.Namespace) -> None:
    best: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for variant in VARIANTS:  # alternate, so that machine noise hits both alike
            times = round_times(args.dataset, args.batch_size, args.rounds, args.model, variant)
            if variant not in best or statistics.median(times) < statistics.median(best[variant]):
                best[variant] = times
    print(
        f"whole round, in-process engine: {args.dataset}, 3 silos, m = {args.batch_size}, {args.model}, "
        f"{args.rounds} rounds (median and mean of rounds 2..{args.rounds - 1}, best of {args.repeats} runs)"
    )
    print(f"  {'':34}{'median ms':>10}{'mean ms':>10}{'p95 ms':>10}")
    for variant, label in (("steffle", "SteFFLe (eps 1, lambda 1)"), ("fedsgd", "non-private (eps inf, lambda 0)")):
        times = sorted(best[variant])
        p95 = times[int(0.95 * (len(times) - 1))]
        print(
            f"  {label:<34}{statistics.median(times) * 1000:>10.3f}{statistics.mean(times) * 1000:>10.3f}"
            f"{p95 * 1000:>10.3f}"
        )
    ratio = statistics.median(best["steffle"]) / statistics.median(best["fedsgd"])
    print(f"  {'ratio (median)':<34}{ratio:>9.2f}x")


def _context(**node_config: str) -> Context:
    config = {"partition-id": 0, "num-partitions": 3, **node_config}
    return Context(run_id=1, node_id=5, node_config=config, state=RecordDict(), run_config={})


def _call(context: Context, content: RecordDict, kind: str) -> Message:
    message = Message(content, 5, kind, group_id="b")
    message.metadata.__dict__["_message_id"] = "m"
    reply = app(message, context)
    if reply.has_error():
        raise RuntimeError(reply.error.reason)
    return reply


def silo_rounds(
    args: argparse.Namespace, rounds: int, variants: dict[str, tuple[dict, dict]]
) -> tuple[dict[str, list[float]], msg.SiloInfo]:
    """Seconds of one silo's ClientApp per train round for each variant (name -> (instruction fields, node
    config)), the variants alternating round by round so that machine noise hits them alike; rounds after 5."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    spec = msg.DataSpec(dataset=args.dataset, data_dir=os.environ.get("SILOFL_DATA_DIR", ""), num_silos=3)
    contexts, instructions = {}, {}
    info = None
    for name, (extra, node_config) in variants.items():
        contexts[name] = _context(**node_config)
        reply = _call(contexts[name], RecordDict({msg.CONFIG: spec.to_config_record()}), msg.SETUP)
        info = msg.read_config(reply.content, msg.SiloInfo, record=msg.REPORT)
        instructions[name] = msg.TrainInstruction.for_algorithm(
            "steffle",
            server_round=1,
            total_rounds=rounds + 1,
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
    for server_round in range(1, rounds + 1):
        for name in variants:
            instr = instructions[name].model_copy(update={"server_round": server_round}).to_config_record()
            content = RecordDict({msg.MODEL: model_record, msg.FAIRNESS: fairness, msg.CONFIG: instr})
            t0 = time.perf_counter()
            _call(contexts[name], content, msg.TRAIN)
            if server_round > 5:
                times[name].append(time.perf_counter() - t0)
    return times, info


def one_silo(args: argparse.Namespace) -> None:
    times, info = silo_rounds(args, args.silo_rounds, {name: (extra, {}) for name, extra in VARIANTS.items()})
    steffle, fedsgd = (statistics.median(times[n]) for n in ("steffle", "fedsgd"))
    print(
        f"one silo's ClientApp per round, {args.dataset}, m = {args.batch_size}, {args.model}, one silo of 3 "
        f"({info.n_train} records, {info.num_features} features), median over {len(times['steffle'])} rounds"
    )
    print(f"  SteFFLe (eps 1, lambda 1)        : {steffle * 1000:7.3f} ms")
    print(f"  non-private FedSGD (g only)      : {fedsgd * 1000:7.3f} ms")
    print(f"  ratio                            : {steffle / fedsgd:7.2f}x")


#: The policy of the policy-cost comparison: a lifetime budget (the job is admitted into a lifetime ledger), SteFFLe
#: listed, the default max-delta (1/n_j) checked on every message.
POLICY = 'lifetime-epsilon = 10.0\nlifetime-delta = 1e-6\nalgorithms = ["steffle"]\n'


def policy_cost(args: argparse.Namespace) -> None:
    """One silo with a state folder, without and with the operator's policy (the policy checks of every message; the
    lifetime ledger is charged once, at the job's admission in round 1, which the median leaves out)."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "policy.toml").write_text(POLICY)
        variants = {
            "state": (VARIANTS["steffle"], {"state-dir": str(root / "state")}),
            "policy": (VARIANTS["steffle"], {"state-dir": str(root / "policy"), "policy": str(root / "policy.toml")}),
        }
        times, info = silo_rounds(args, args.policy_rounds, variants)
        checks = _policy_check_seconds(root / "policy.toml", root / "policy", info)
    plain, policed = (statistics.median(times[n]) for n in ("state", "policy"))
    print(
        f"one silo's ClientApp per round with a state folder, without and with a policy, {args.dataset}, m = "
        f"{args.batch_size}, {args.model}, SteFFLe eps 1, median over {len(times['state'])} rounds"
    )
    print(f"  no policy                        : {plain * 1000:7.3f} ms")
    print(f"  policy (lifetime ledger, checks) : {policed * 1000:7.3f} ms")
    print(f"  difference                       : {(policed - plain) * 1000:7.3f} ms ({policed / plain - 1:+.1%})")
    print(
        f"  the policy's work per message    : {checks * 1000:7.4f} ms (`client.silo_policy.check_job`, timed alone: "
        f"{checks / plain:.2%} of the round above)"
    )


def _policy_check_seconds(policy: Path, state: Path, info: msg.SiloInfo, calls: int = 20000) -> float:
    """Seconds per call of what a policy adds to every message (`check_job`: the node's policy, cached per file
    stamp, its algorithm and delta checks), median of 5 batches."""
    from silofl.client import silo_policy

    context = _context(**{"state-dir": str(state), "policy": str(policy)})
    instr = msg.TrainInstruction.for_algorithm(
        "steffle", server_round=2, total_rounds=10, batch_size=256, lr=0.25, delta=1e-9, epsilon=1.0
    )
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            silo_policy.check_job(context, instr, role="silo", records=info.n_train, what="benchmark")
        batches.append((time.perf_counter() - t0) / calls)
    return statistics.median(batches)


def math_only(args: argparse.Namespace) -> None:
    from silofl.client.algorithms import steffle as algo
    from silofl.client.data.federate import load_federation
    from silofl.client.group_fairness import group_prior

    _, silos = load_federation(args.dataset, 3, data_dir=os.environ.get("SILOFL_DATA_DIR") or None, download=False)
    info = silos[0].info
    model = build_model(args.model, info.num_features, info.num_labels)
    w = torch.full((info.num_groups, info.num_labels), 0.5)
    prior = group_prior("dp", np.full(info.num_groups, 1.0 / info.num_groups), info.num_labels)
    rng, generator = np.random.default_rng(0), torch.Generator().manual_seed(0)
    torch.set_num_threads(1)  # as the ClientApp computes (client.app._single_thread)

    def one_round(private: bool) -> float:
        t0 = time.perf_counter()
        for silo in silos:
            rate = min(1.0, args.batch_size / len(silo.train))
            algo.nonsensitive_step(model, silo.train.nonsensitive, w=w, prior=prior, rate=rate, rng=rng)
            if private:
                algo.fairness_gradients(
                    model,
                    silo.train.nonsensitive,
                    silo.train.sensitive,
                    w=w,
                    prior=prior,
                    rate=rate,
                    clip=1.0,
                    noise_multiplier=15.0,
                    rng=rng,
                    generator=generator,
                    w_noise="per-group",
                )
        return time.perf_counter() - t0

    times: dict[bool, list[float]] = {True: [], False: []}
    warm_up = min(20, args.math_rounds // 2)
    for i in range(args.math_rounds):
        for private in (True, False):
            seconds = one_round(private)
            if i >= warm_up:
                times[private].append(seconds)
    steffle, fedsgd = (statistics.median(times[p]) * 1000 for p in (True, False))
    print(
        f"the math alone, 3 silos' calls of client.algorithms.steffle per round (no messages, ledgers, checks), "
        f"{args.dataset}, m = {args.batch_size}, {args.model}, median over {len(times[True])} rounds"
    )
    print(f"  SteFFLe (both divisions, noise)  : {steffle:7.3f} ms")
    print(f"  non-private (g only)             : {fedsgd:7.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=600, help="rounds of each whole-round run (0: skip them)")
    parser.add_argument("--repeats", type=int, default=3, help="whole-round runs of each variant (the best is kept)")
    parser.add_argument("--model", default="logreg", choices=["logreg", "mlp"])
    parser.add_argument("--silo-rounds", type=int, default=300, help="rounds of the one-silo comparison (0: skip it)")
    parser.add_argument("--math-rounds", type=int, default=300, help="rounds of the math-alone timing (0: skip it)")
    parser.add_argument(
        "--policy-rounds", type=int, default=300, help="rounds of the policy-cost comparison (0: skip it)"
    )
    args = parser.parse_args()
    if args.rounds:
        if args.rounds < 3:
            parser.error("--rounds must be >= 3 (round 1 calibrates, the last one evaluates)")
        whole_round(args)
    if args.silo_rounds:
        one_silo(args)
    if args.math_rounds:
        math_only(args)
    if args.policy_rounds:
        policy_cost(args)


if __name__ == "__main__":
    main()
