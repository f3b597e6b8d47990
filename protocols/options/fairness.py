"""Fairness: the notion and its group counts, result.json's per-group report, the parties of SteFFLe's topologies,
and each fair algorithm's own regularizer (SteFFLe's ERMI, Tran et al.'s Lagrangian dual, FedFDP's loss variance)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from silofl.protocols.fairness_metrics import MIN_SUPPORT
from silofl.protocols.options.base import SILO, OptionGroup


class FairnessOptions(OptionGroup):
    """A fairness notion and the (noised) group counts the server's prior comes from."""

    heading: ClassVar[str] = "fairness"

    fairness: Literal["dp", "eo", "eopp"] = Field(
        default="dp", description="demographic parity, equalized odds, equal opportunity", json_schema_extra=SILO
    )
    counts_share: float = Field(
        default=0.1,
        gt=0.0,
        lt=1.0,
        description="share of each silo's epsilon spent on its group counts",
        json_schema_extra=SILO,
    )


class GroupReportOptions(OptionGroup):
    """How result.json's `fairness_groups` reports the violations beside those over every group."""

    heading: ClassVar[str] = "fairness report"

    min_support: int = Field(
        default=MIN_SUPPORT,
        ge=0,
        le=10_000_000,
        description="smallest number of test records of a sensitive group that enters the *_min_support violations of "
        "result.json's fairness_groups (a group of 60 test records moves a rate by ~0.05 by sampling alone); 0: every "
        "group",
    )


Topology = Literal["silos", "divided", "central-sensitive", "general"]


class TopologyOptions(OptionGroup):
    """Who holds which division of a record (SteFFLe Section 4 and Appendix F): silos holding both, or separate
    feature and sensitive parties over one universal record index."""

    heading: ClassVar[str] = "parties (features and sensitive attributes apart)"

    topology: Topology = Field(
        default="silos",
        description="silos: each silo holds both divisions; divided: each silo's divisions on two nodes; "
        "central-sensitive: one sensitive party (a census) and num-silos feature parties; general: num-silos feature "
        "and sensitive-parties sensitive parties",
    )
    sensitive_parties: int = Field(
        default=1, ge=1, le=1000, description="sensitive parties of topology general (the others fix it)"
    )
    sensitive_by: str = Field(
        default="",
        max_length=200,
        description="topology general: deal the ids to the sensitive parties by this feature column (categorical: "
        "one value per party, round robin; numeric: equal-frequency bins) instead of at random",
    )

    def sensitive_count(self, feature_parties: int) -> int:
        """Sensitive nodes of the topology (0 for silos)."""
        return {"silos": 0, "divided": feature_parties, "central-sensitive": 1}.get(
            self.topology, self.sensitive_parties
        )


class ErmiOptions(OptionGroup):
    """SteFFLe's ERMI regularizer: its weight and the W player of the min-max problem."""

    heading: ClassVar[str] = "ERMI regularizer (SteFFLe)"

    lam: float = Field(
        default=1.0,
        ge=0.0,
        le=1e4,
        alias="lambda",
        description="weight of the ERMI fairness term",
        json_schema_extra=SILO,
    )
    w_radius: float = Field(default=2.0, gt=0.0, description="radius D of the ball W is projected onto")
    w_lr: float = Field(
        default=0.02,
        gt=0.0,
        le=1e4,
        description="ascent step size of W: a smaller step averages the noised W-gradients over more rounds, W "
        "following the model more slowly (docs/RESULTS.md, many-valued attributes: 0.02 with per-group noise lowers "
        "the violation where 0.1 does not; the paper-reproduction sweeps use 0.1)",
    )
    w_noise: Literal["auto", "isotropic", "per-group"] = Field(
        default="auto",
        description="isotropic: the same noise on every entry of the W release, scaled to the smallest group's bound "
        "2/sqrt(rho); per-group: each group's row of W noised at its own bound 2/sqrt(p_S(r)) (the release scaled "
        "row by row to sensitivity 1, noised, scaled back: the same mechanism for the accountant), so the noise of a "
        "tiny group no longer lands on the large groups' rows; auto (the default): per-group, at silos and at "
        "separate sensitive parties alike",
        json_schema_extra=SILO,
    )
    group_weight: Literal["prior", "balanced"] = Field(
        default="prior",
        description="prior: the papers' ERMI, each group weighted by its share p_S(r); balanced: the ERMI of the "
        "group-balanced distribution (every group weighs 1/k; records weighted by 1/(k p_S(s)), W-noise radius "
        "2/(sqrt(k) rho) instead of 2/sqrt(rho)), for attributes whose gaps sit in small groups",
        json_schema_extra=SILO,
    )


class DualOptions(OptionGroup):
    """Tran et al.'s Lagrangian dual."""

    heading: ClassVar[str] = "Lagrangian dual (Tran et al.)"

    lam: float = Field(
        default=0.0,
        ge=0.0,
        le=1e4,
        alias="lambda",
        description="initial value of every Lagrange multiplier",
        json_schema_extra=SILO,
    )
    dual_lr: float = Field(default=0.01, ge=0.0, le=1e4, description="dual ascent step s of the multipliers")


class LossFairnessOptions(OptionGroup):
    """FedFDP's fairness: the weight of the variance of the silos' losses (balanced performance fairness, Eq. 6)."""

    heading: ClassVar[str] = "loss-variance fairness (FedFDP)"

    lam: float = Field(
        default=0.1,
        ge=0.0,
        le=1e4,
        alias="lambda",
        description="weight of the variance of the silos' losses (0: DP-FedSGD's step)",
        json_schema_extra=SILO,
    )
    loss_bound: float = Field(
        default=0.0,
        ge=0.0,
        le=1e6,
        alias="loss-bound",
        description="clip bound C_l of the loss release; 0: the paper's adaptive bound (the silo's last release, "
        "floored at 1e-3, first 2.5), which shrinks to the floor; > 0: this fixed bound",
        json_schema_extra=SILO,
    )
