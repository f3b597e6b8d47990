"""The console's last word on a run's privacy: what the (epsilon, delta) protects, against whom, and what it does not.

`silofl run` prints a table whose `eps spent` column alone reads as if the whole data set were private; for SteFFLe
only the sensitive attribute is (the features and labels leave the silo in its loss gradient), for FedSC only the
correlation matrices, and a DP-FedSGD run without `--epsilon` adds no noise at all. These lines say so, from the
algorithm's registry entry (`protects`, `in_clear`, `not_covered`) and the run's own privacy block (the epsilon its
accountant computed, the neighbour relation, a trusted server, and its own `protects` and `in_clear` where the run's
options decide them: SteFFLe's `protect`), never from a hard-coded algorithm name. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: What `server.result` puts in `not_covered` when nothing beyond the mechanism's caveats is left out.
_NOTHING = "nothing beyond the mechanism's own caveats"


def _number(value: Any) -> float:
    try:
        return float(str(value).replace("infinity", "inf")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return math.inf


def privacy_lines(spec: Any, config: Any, privacy: Mapping[str, Any]) -> list[str]:
    """The lines (without markup) that close a run's console output: `spec` the algorithm's registry entry, `config`
    the run's RunConfig, `privacy` the result's privacy block."""
    epsilon = _number(privacy.get("epsilon_spent", math.inf))
    if not spec.protects:
        return [
            f"privacy: none. {spec.name} adds no noise: this run is not differentially private; the silos' updates "
            "reached the server as they are"
        ]
    if not math.isfinite(epsilon) or not math.isfinite(_number(getattr(config, "epsilon", math.inf))):
        return [
            f"privacy: none. This run is not differentially private (no --epsilon, so epsilon = inf): the silos "
            f"sent their releases without noise. Give --epsilon E (and --delta D) for a private {spec.name} run"
        ]
    delta = _number(privacy.get("delta", math.nan))
    protects = privacy.get("protects") or spec.protects
    in_clear = privacy.get("in_clear", spec.in_clear)
    lines = [f"privacy: ({epsilon:.4g}, {delta:.2g})-differential privacy of {protects}"]
    if privacy.get("trust"):  # the noise is the server's: it sees the un-noised messages
        lines.append(f"  against anyone who sees the released models, NOT against the server ({privacy['trust']})")
    else:
        lines.append("  against the server, the other silos and anyone who sees the model (each silo adds the noise)")
    replace_one = privacy.get("epsilon_replace_one")
    if replace_one is not None:  # an add/remove figure whose run also reports the replace-one one
        figure = _number(replace_one)
        lines.append(f"  replacing one record instead (e.g. changing its sensitive attribute): epsilon {figure:.4g}")
    relation = privacy.get("relation")
    if relation and "neighbours" not in protects:
        lines.append(f"  neighbouring data sets: {relation}")
    missing = [text for text in (in_clear, privacy.get("not_covered", "")) if text and text != _NOTHING]
    if missing:
        lines.append("not protected: " + "; ".join(missing))
    return lines
