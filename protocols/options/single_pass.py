"""DP-mu2-FL and its noisy-SGD baseline: one pass of logistic regression in a ball, at the paper's rho."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from silofl.protocols.messages import MAX_SERVER_VALUE
from silofl.protocols.options.base import SILO, OptionGroup


class SinglePassOptions(OptionGroup):
    """DP-mu2-FL and its noisy-SGD baseline: one pass, logistic regression in a ball, the paper's rho."""

    heading: ClassVar[str] = "single pass (DP-mu2-FL)"

    model: Literal["logreg"] = Field(
        default="logreg", description="multinomial logistic regression (a convex loss)", json_schema_extra=SILO
    )
    batch_size: int = Field(default=256, ge=1, description="records per silo per round (b)", json_schema_extra=SILO)
    trust: Literal["untrusted", "trusted"] = Field(
        default="untrusted", description="noise at the silos (untrusted) or at the server", json_schema_extra=SILO
    )
    rho: float = Field(
        default=0.0,
        ge=0.0,
        description="the paper's rho ((alpha, alpha rho^2/2)-RDP); 0: use epsilon",
        json_schema_extra=SILO,
    )
    domain_diameter: float = Field(
        default=0.1,
        gt=0.0,
        le=MAX_SERVER_VALUE,
        description=f"diameter D of the ball K the iterates stay in (at most {MAX_SERVER_VALUE:g})",
        json_schema_extra=SILO,
    )
