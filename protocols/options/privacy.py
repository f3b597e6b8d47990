"""The silos' differential privacy: the (epsilon, delta) target and accountant, per-sample clipping, how minibatches
are sampled (what the accounting assumes) and what the noise protects (the sensitive attribute or the whole record)."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from silofl.protocols.messages import MAX_SERVER_VALUE
from silofl.protocols.options.base import SILO, OptionGroup


class PrivacyOptions(OptionGroup):
    """The privacy target of an algorithm whose silos add noise and keep a ledger."""

    heading: ClassVar[str] = "privacy (per silo)"

    epsilon: float = Field(
        default=math.inf,
        gt=0.0,
        allow_inf_nan=True,
        description="target epsilon per silo; inf: no noise",
        json_schema_extra=SILO,
    )
    delta: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="target delta; 0: 1/n^2 with n the training records",
        json_schema_extra=SILO,
    )
    accountant: Literal["rdp", "pld", "best"] = Field(
        default="best", description="privacy accountant (best: the tighter of RDP and PLD)", json_schema_extra=SILO
    )

    @field_validator("epsilon", mode="before")
    @classmethod
    def _parse_infinity(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in {"inf", "infinity", "none"}:
            return math.inf
        return value


class ClipOptions(OptionGroup):
    """Per-sample gradient clipping."""

    heading: ClassVar[str] = "clipping"

    clip: float = Field(
        default=1.0,
        gt=0.0,
        le=MAX_SERVER_VALUE,
        description="per-sample gradient L2 clip norm C",
        json_schema_extra=SILO,
    )


class SamplingOptions(OptionGroup):
    """How each silo draws its minibatches: Poisson samples (what the accountants' amplification by sampling assumes)
    or shuffled epochs (the SteFFLe paper's released code), accounted without amplification
    (`protocols.shuffled_epochs`)."""

    heading: ClassVar[str] = "minibatch sampling"

    sampling: Literal["poisson", "shuffle"] = Field(
        default="poisson",
        description="poisson: each round each record joins the batch with probability m / n_j (accounted with "
        "amplification by sampling); shuffle: shuffled epochs, every record exactly once per epoch in batches of m "
        "(the last one smaller), accounted WITHOUT amplification, one unsampled Gaussian release per epoch (far more "
        "noise at the same epsilon); topology silos only",
        json_schema_extra=SILO,
    )

    def sampling_problem(self, topology: str) -> str | None:
        """Why this sampling cannot run on `topology` (None: it can): shuffled epochs are implemented for silos."""
        if self.sampling == "shuffle" and topology != "silos":
            return (
                f"'sampling' = 'shuffle' is implemented for topology 'silos' only (the separate feature and sensitive "
                f"parties of topology {topology!r} draw Poisson samples); use 'sampling' = 'poisson' or topology silos"
            )
        return None


#: The values of `protect` (:class:`ProtectOptions`).
Protect = Literal["sensitive", "record"]


class ProtectOptions(OptionGroup):
    """What the silos' noise protects (SteFFLe and Tran et al.): the sensitive attribute, or the whole record (DP-FERMI
    Theorem D.2, second part; issue 34)."""

    heading: ClassVar[str] = "what the noise protects"

    protect: Protect = Field(
        default="sensitive",
        description="sensitive: DP of each record's sensitive attribute only (replace-one of s); the loss gradient "
        "leaves the silo un-noised, so features and labels are not protected; record: DP of the whole record "
        "(features, label and sensitive attribute; add/remove one record): every release, the loss gradient "
        "included, is clipped per record and noised, all on one Poisson sample (DP-FERMI Theorem D.2, second part); "
        "topology silos and sampling poisson only",
        json_schema_extra=SILO,
    )

    def protect_problem(self, topology: str, sampling: str) -> str | None:
        """Why `protect` = record cannot run with this topology or sampling (None: it can)."""
        if self.protect != "record":
            return None
        if topology != "silos":
            return (
                f"'protect' = 'record' is implemented for topology 'silos' only: with topology {topology!r} the "
                "feature parties send their loss gradients un-noised and each party keeps its own ledger; use "
                "'protect' = 'sensitive' or topology silos"
            )
        if sampling != "poisson":
            return (
                "'protect' = 'record' needs 'sampling' = 'poisson': under add/remove of a record a shuffled epoch's "
                "batches are all different (every record moves), which its accounting does not cover; use sampling "
                "poisson"
            )
        return None
