"""``silofl privacy calibrate``: the noise multiplier for a privacy target, and what it costs by RDP and by PLD.

The lead's console script wires it in with ``add_privacy_parser(subparsers)`` and dispatches with ``args.func(args)``
(the sub-command sets ``func``).

``--sampling shuffle --records N --batch-size M --steps T`` calibrates for shuffled epochs
(`protocols.shuffled_epochs`): T rounds over B = ceil(N / M) batches per epoch are E = ceil(T / B) unsampled steps, no
amplification; the table also gives the multiplier Poisson sampling at q = min(1, M / N) would need for the same T
rounds, so the cost of shuffling is in view.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from silofl.protocols.privacy.accountant import ACCOUNTANTS, RELATIONS, Calibration, calibrate_noise
from silofl.protocols.shuffled_epochs import SAMPLERS, accounted_steps, batches_per_epoch

_NOTES = {
    "add_remove": "Each release adds Gaussian noise with std = noise multiplier x its own L2 sensitivity "
    "(add/remove-one record).",
    "replace_one": "Each release adds Gaussian noise with std = noise multiplier x R, where every record's "
    "contribution lies within radius R of 0 whatever its sensitive attribute (replace-one: one record's sensitive "
    "attribute changes); accounted by PLD only.",
}


def add_privacy_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``privacy calibrate``.

    Usage: ``privacy calibrate --epsilon E --delta D (--sampling-rate Q | --records N --batch-size M) --steps T
    [--sampling poisson|shuffle] [--releases K] [--accountant A] [--relation add_remove|replace_one] [--tolerance R]``
    (``--sampling shuffle`` needs ``--records`` and ``--batch-size``).
    """
    privacy = subparsers.add_parser(
        "privacy", help="differential privacy tools", description="Differential privacy tools."
    )
    commands = privacy.add_subparsers(dest="privacy_command", metavar="COMMAND", required=True)
    calibrate = commands.add_parser(
        "calibrate",
        help="noise multiplier for a privacy target",
        description=(
            "Smallest per-release noise multiplier such that STEPS Poisson-sampled steps, each releasing RELEASES "
            "Gaussian quantities from the same sample, are (EPSILON, DELTA)-DP under the neighbouring RELATION "
            "(add_remove: one record present or absent; replace_one: one record's sensitive attribute changed). "
            "With --sampling shuffle, STEPS rounds of shuffled epochs over RECORDS records in batches of BATCH_SIZE, "
            "accounted without amplification (one unsampled step per epoch)."
        ),
    )
    calibrate.add_argument("--epsilon", type=float, required=True, help="target epsilon (> 0)")
    calibrate.add_argument("--delta", type=float, required=True, help="target delta, in (0, 1), e.g. 1/n^2")
    calibrate.add_argument(
        "--sampling",
        choices=SAMPLERS,
        default="poisson",
        help="poisson (default): each step a Poisson sample; shuffle: shuffled epochs (needs --records and "
        "--batch-size), accounted as one unsampled step per epoch",
    )
    calibrate.add_argument(
        "--sampling-rate",
        type=float,
        default=None,
        help="Poisson sampling rate q = batch size / records, in (0, 1] (or give --records and --batch-size)",
    )
    calibrate.add_argument("--records", type=int, default=None, help="records of the silo, n (>= 1)")
    calibrate.add_argument("--batch-size", type=int, default=None, help="batch size m (>= 1)")
    calibrate.add_argument("--steps", type=int, required=True, help="number of steps (rounds) T (>= 1)")
    calibrate.add_argument(
        "--releases", type=int, default=1, help="noisy quantities released per step from the same sample (default 1)"
    )
    calibrate.add_argument(
        "--accountant", choices=ACCOUNTANTS, default="best", help="accountant to calibrate with (default: best)"
    )
    calibrate.add_argument(
        "--relation",
        choices=RELATIONS,
        default="add_remove",
        help="neighbouring relation (default: add_remove; replace_one is accounted by PLD only)",
    )
    calibrate.add_argument(
        "--tolerance", type=float, default=1e-3, help="relative tolerance on the multiplier (default 1e-3)"
    )
    calibrate.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace, console: Console | None = None) -> int:
    """Print the calibrated noise multiplier and the epsilon RDP and PLD give back for it.

    Returns 0, or 2 (after printing the reason) when an argument is invalid.
    """
    console = console or Console()
    try:
        plan = _sampling_plan(args)
        result = _calibrate(args, plan.sampling_rate, plan.steps)
        poisson = _calibrate(args, plan.poisson_rate, args.steps) if plan.batches else None
    except ValueError as error:
        console.print(f"[bold red]error:[/] {error}")
        return 2

    table = Table(title="Noise calibration", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("neighbouring relation", result.relation)
    table.add_row("target epsilon", f"{result.target_epsilon:g}")
    table.add_row("delta", f"{result.delta:g}")
    if plan.batches:
        table.add_row("sampling", "shuffled epochs, no amplification")
        table.add_row("rounds T", f"{args.steps}")
        table.add_row("batches per epoch B = ceil(n / m)", f"{plan.batches}")
        table.add_row("epochs E = ceil(T / B), each q = 1", f"{result.steps}")
    else:
        table.add_row("sampling rate q", f"{result.sampling_rate:g}")
        table.add_row("steps T", f"{result.steps}")
    table.add_row("releases per step K", f"{result.releases}")
    table.add_row("[bold]noise multiplier (per release)[/]", f"[bold]{result.noise_multiplier:.6f}[/]")
    if result.releases > 1:
        table.add_row("combined multiplier (per step)", f"{result.combined_noise_multiplier:.6f}")
    if result.relation == "replace_one":
        table.add_row("epsilon by RDP", "n/a (no RDP analysis under replace_one)")
    else:
        table.add_row("epsilon by RDP", _format_epsilon(result.epsilon_rdp, result.accountant == "rdp"))
    table.add_row("epsilon by PLD", _format_epsilon(result.epsilon_pld, result.accountant == "pld"))
    table.add_row("accountant used", f"{result.accountant} (asked: {args.accountant})")
    if poisson is not None:
        table.add_row(
            f"Poisson instead: q = {poisson.sampling_rate:.4g}, T = {poisson.steps}",
            f"{poisson.noise_multiplier:.6f} (shuffling: x{result.noise_multiplier / poisson.noise_multiplier:.3g})",
        )
    console.print(table)
    console.print(_NOTES[result.relation])
    if plan.batches:
        console.print(
            "Shuffled epochs: every record is in one batch per epoch, so each epoch is accounted as one unsampled "
            "Gaussian step (no amplification by shuffling); a partial last epoch counts in full."
        )
    return 0


@dataclass(frozen=True)
class _SamplingPlan:
    """What the accountant sees of the command line's sampling: `sampling_rate` and `steps` of the calibrated event;
    for shuffled epochs also B (`batches`, 0 for Poisson) and the rate Poisson sampling would have (`poisson_rate`)."""

    sampling_rate: float
    steps: int
    batches: int = 0
    poisson_rate: float = 1.0


def _sampling_plan(args: argparse.Namespace) -> _SamplingPlan:
    """The event to calibrate from ``--sampling``, ``--sampling-rate``, ``--records``, ``--batch-size``, ``--steps``;
    ValueError naming the flag that is missing or does not apply."""
    sized = args.records is not None or args.batch_size is not None
    if sized and (args.records is None or args.batch_size is None):
        raise ValueError("give --records and --batch-size together (the silo's n and the batch size m)")
    if args.sampling == "shuffle":
        if not sized:
            raise ValueError("--sampling shuffle needs --records N and --batch-size M (the epochs follow from them)")
        if args.sampling_rate is not None:
            raise ValueError(
                "--sampling-rate is the Poisson rate; shuffled epochs are accounted unsampled (drop it, or use "
                "--sampling poisson)"
            )
        batches = batches_per_epoch(args.records, args.batch_size)
        poisson_rate = min(1.0, args.batch_size / args.records)
        return _SamplingPlan(1.0, accounted_steps(args.steps, args.records, args.batch_size), batches, poisson_rate)
    if args.sampling_rate is not None and sized:
        raise ValueError("give either --sampling-rate or --records and --batch-size, not both")
    if args.sampling_rate is None and not sized:
        raise ValueError("give --sampling-rate Q (or --records N and --batch-size M, for q = M / N)")
    rate = args.sampling_rate if args.sampling_rate is not None else min(1.0, args.batch_size / args.records)
    return _SamplingPlan(rate, args.steps)


def _calibrate(args: argparse.Namespace, sampling_rate: float, steps: int) -> Calibration:
    return calibrate_noise(
        epsilon=args.epsilon,
        delta=args.delta,
        sampling_rate=sampling_rate,
        steps=steps,
        releases=args.releases,
        accountant=args.accountant,
        tolerance=args.tolerance,
        relation=args.relation,
    )


def _format_epsilon(value: float, used: bool) -> str:
    text = "inf" if math.isinf(value) else f"{value:.6f}"
    return f"[bold]{text}[/] (used)" if used else text
