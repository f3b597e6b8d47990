"""``silofl privacy calibrate``: the noise multiplier for a privacy target, and what it costs by RDP and by PLD.

The lead's console script wires it in with ``add_privacy_parser(subparsers)`` and dispatches with ``args.func(args)``
(the sub-command sets ``func``).
"""

from __future__ import annotations

import argparse
import math

from rich.console import Console
from rich.table import Table

from protocols.privacy.accountant import ACCOUNTANTS, RELATIONS, calibrate_noise

_NOTES = {
    "add_remove": "Each release adds Gaussian noise with std = noise multiplier x its own L2 sensitivity "
    "(add/remove-one record).",
    "replace_one": "Each release adds Gaussian noise with std = noise multiplier x R, where every record's "
    "contribution lies within radius R of 0 whatever its sensitive attribute (replace-one: one record's sensitive "
    "attribute changes); accounted by PLD only.",
}


def add_privacy_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``privacy calibrate``.

    Usage: ``privacy calibrate --epsilon E --delta D --sampling-rate Q --steps T [--releases K] [--accountant A]
    [--relation add_remove|replace_one] [--tolerance R]``.
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
            "(add_remove: one record present or absent; replace_one: one record's sensitive attribute changed)."
        ),
    )
    calibrate.add_argument("--epsilon", type=float, required=True, help="target epsilon (> 0)")
    calibrate.add_argument("--delta", type=float, required=True, help="target delta, in (0, 1), e.g. 1/n^2")
    calibrate.add_argument(
        "--sampling-rate", type=float, required=True, help="Poisson sampling rate q = batch size / records, in (0, 1]"
    )
    calibrate.add_argument("--steps", type=int, required=True, help="number of sampled steps T (>= 1)")
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
        result = calibrate_noise(
            epsilon=args.epsilon,
            delta=args.delta,
            sampling_rate=args.sampling_rate,
            steps=args.steps,
            releases=args.releases,
            accountant=args.accountant,
            tolerance=args.tolerance,
            relation=args.relation,
        )
    except ValueError as error:
        console.print(f"[bold red]error:[/] {error}")
        return 2

    table = Table(title="Noise calibration", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("neighbouring relation", result.relation)
    table.add_row("target epsilon", f"{result.target_epsilon:g}")
    table.add_row("delta", f"{result.delta:g}")
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
    console.print(table)
    console.print(_NOTES[result.relation])
    return 0


def _format_epsilon(value: float, used: bool) -> str:
    text = "inf" if math.isinf(value) else f"{value:.6f}"
    return f"[bold]{text}[/] (used)" if used else text
